"""
The captured Open WebUI requests (tests/fixtures/open_webui/) say what their README says: what tells a background
task from a chat turn, and where the question is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "open_webui"
TASKS = ["title_task", "tags_task", "follow_ups_task", "follow_ups_task_second_turn", "queries_task"]
TURNS = ["first_question", "follow_up", "image_question", "file_question", "first_question_forwarded_headers"]


def load(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", [*TASKS, "title_task_forwarded_headers"])
def test_a_task_is_one_user_message_with_the_chat_history_not_streamed(name):
    request = load(name)
    body = request["body"]
    assert request["open_webui"] == "0.12.4"
    assert body["stream"] is False
    assert "tools" not in body
    assert "metadata" not in body
    [message] = body["messages"]
    assert message["role"] == "user"
    assert message["content"].startswith("### Task:\n")
    assert "<chat_history>\nUSER: " in message["content"]
    assert message["content"].rstrip().endswith("</chat_history>")
    assert "<details" not in message["content"]  # Open WebUI leaves the details block out of the history


@pytest.mark.parametrize(
    ("name", "wanted"),
    [
        ("title_task", '"title"'),
        ("tags_task", '"tags"'),
        ("follow_ups_task", '"follow_ups"'),
        ("queries_task", '"queries"'),
    ],
)
def test_a_task_names_the_json_it_wants(name, wanted):
    content = load(name)["body"]["messages"][0]["content"]
    assert f"JSON format: {{ {wanted}:" in content or f"{{\n  {wanted}:" in content


@pytest.mark.parametrize("name", TURNS)
def test_a_chat_turn_is_streamed_with_the_built_in_tools_and_ends_in_the_question(name):
    body = load(name)["body"]
    assert body["stream"] is True
    assert body["model"] == "cascade"
    assert len(body["tools"]) == 36
    assert "metadata" not in body
    assert body["messages"][-1]["role"] == "user"
    assert all(message["role"] != "system" for message in body["messages"])


def test_the_title_task_is_sent_before_the_first_answer():
    assert load("first_question")["arrival_order_first_turn"][0] == "title"
    assert load("title_task")["body"]["messages"][0]["content"].endswith(
        "USER: What is Chain-of-Note?\nASSISTANT: \n</chat_history>"
    )
    assert load("title_task")["body"]["max_tokens"] == 1000


def test_the_follow_up_carries_the_first_answer_with_its_details_block():
    messages = load("follow_up")["body"]["messages"]
    assert [message["role"] for message in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"].rstrip().endswith("</details>")
    assert messages[2]["content"] == "How many LLM calls does it make?"


def test_an_image_makes_the_content_a_list_of_parts():
    [message] = load("image_question")["body"]["messages"]
    kinds = [part["type"] for part in message["content"]]
    assert kinds == ["text", "text", "image_url"]
    assert message["content"][0]["text"].startswith("<attached_files>")
    assert message["content"][1]["text"] == "What does this say?"


def test_a_text_file_is_a_tag_before_the_question():
    [message] = load("file_question")["body"]["messages"]
    assert message["content"].startswith("<attached_files>\n")
    assert message["content"].endswith("</attached_files>\n\nWhat does this say?")


def test_only_forwarded_headers_name_the_chat():
    assert not any(name.startswith("x-openwebui-") for name in load("first_question")["headers"])
    headers = load("first_question_forwarded_headers")["headers"]
    assert headers["x-openwebui-chat-id"] == "<uuid>"
    assert load("title_task_forwarded_headers")["headers"]["x-openwebui-chat-id"] == "<uuid>"
