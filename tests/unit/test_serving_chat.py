"""What a chat client sends, read for the strategies (`serving.chat`): content parts, background tasks, the chat before
the question, and the standalone question of a follow-up."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage
from hypothesis import given
from hypothesis import strategies as st

from haystack_fusion.llm import empty_usage
from haystack_fusion.prompts import PROMPTS
from haystack_fusion.serving.chat import (
    MAX_TURN_CHARS,
    TASK_PREFIX,
    Chat,
    ChatRequestError,
    answer_task,
    digest,
    history_text,
    message_text,
    read_chat,
    refers_back,
    standalone_question,
    standalone_question_prompt,
    turn_text,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "open_webui"


class RecordingGenerator(MockChatGenerator):
    """A MockChatGenerator that keeps the prompts it was sent."""

    def __init__(self, reply: str) -> None:
        super().__init__(response_fn=lambda messages: reply)
        self.prompts: list[str] = []

    def run(self, messages: list[ChatMessage], **kwargs):  # type: ignore[override]
        self.prompts.append(messages[-1].text or "")
        return super().run(messages=messages, **kwargs)

    async def run_async(self, messages: list[ChatMessage], **kwargs):  # type: ignore[override]
        return self.run(messages=messages, **kwargs)


class TestMessageText:
    def test_a_string(self):
        assert message_text({"role": "user", "content": "Who?"}) == "Who?"

    def test_text_parts_are_joined(self):
        parts = [{"type": "text", "text": "Who wrote"}, {"type": "text", "text": "Hamlet?"}]
        assert message_text({"role": "user", "content": parts}) == "Who wrote\nHamlet?"

    def test_no_content(self):
        assert message_text({"role": "assistant", "content": None}) == ""

    def test_other_parts_are_named(self):
        parts = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "data:,"}}]
        with pytest.raises(ChatRequestError, match=r"content parts of type image_url are not supported"):
            message_text({"role": "user", "content": parts})

    def test_content_of_another_type(self):
        with pytest.raises(ChatRequestError, match="must be a string or a list of text parts, got dict"):
            message_text({"role": "user", "content": {"text": "Who?"}})


class TestReadChat:
    def test_first_turn(self):
        assert read_chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who?"}]) == Chat(
            question="Who?"
        )

    def test_a_follow_up_keeps_the_turns_without_this_servers_evidence(self):
        answer = 'A strategy.\n\n<details type="evidence" done="true">\n<summary>Sources</summary>\n[1] x\n</details>'
        chat = read_chat(
            [
                {"role": "user", "content": "What is Chain-of-Note?"},
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "How many LLM calls does it make?"},
            ]
        )
        assert chat.history == (("user", "What is Chain-of-Note?"), ("assistant", "A strategy."))
        assert chat.follow_up
        assert not chat.task

    def test_a_plain_reply_loses_its_sources(self):
        assert turn_text("Paris\n\nSources:\n[1] Paris: Paris is ...") == "Paris"

    def test_a_long_turn_is_cut(self):
        assert len(turn_text("word " * 1000)) <= MAX_TURN_CHARS

    def test_a_background_task(self):
        chat = read_chat([{"role": "user", "content": f"{TASK_PREFIX}\nGenerate a title.\n<chat_history>..."}])
        assert chat.task
        assert not chat.follow_up

    def test_a_task_prompt_that_quotes_no_chat_is_a_question(self):
        """Open WebUI's RAG template starts as a task does, but wraps a question."""
        assert not read_chat([{"role": "user", "content": f"{TASK_PREFIX}\nRespond to the user query."}]).task

    def test_the_list_of_attached_files_is_no_part_of_the_question(self):
        files = '<attached_files>\n<file type="file" id="1" name="notes.txt"/>\n</attached_files>\n\n'
        assert read_chat([{"role": "user", "content": files + "What does this say?"}]).question == "What does this say?"
        with pytest.raises(ChatRequestError, match="holds no text"):
            read_chat([{"role": "user", "content": files}])

    @pytest.mark.parametrize(
        ("messages", "message"),
        [
            ([], "must end with a user message"),
            ([{"role": "assistant", "content": "Hi"}], "must end with a user message"),
            ([{"role": "user", "content": "  "}], "holds no text"),
            ([{"role": "user", "content": []}], "holds no text"),
            ([{"role": "user", "content": "\x00"}], "holds no text"),
            ([{"role": "user", "content": "\x00\x00\n\x1b\x7f \u200b\ufeff"}], "holds no text"),
            ([{"role": "user", "content": "<attached_files>\n</attached_files>\n\x00"}], "holds no text"),
        ],
    )
    def test_what_cannot_be_answered(self, messages, message):
        with pytest.raises(ChatRequestError, match=message):
            read_chat(messages)

    @pytest.mark.skipif(not FIXTURES.is_dir(), reason="the Open WebUI request fixtures")
    def test_the_requests_open_webui_sends(self):
        """Open WebUI's own requests (tests/fixtures/open_webui): tasks are tasks, questions are questions."""
        bodies = {path.stem: json.loads(path.read_text())["body"] for path in FIXTURES.glob("*.json")}
        assert len(bodies) >= 10
        with pytest.raises(ChatRequestError, match="content parts of type image_url"):
            read_chat(bodies.pop("image_question")["messages"])
        for name, body in bodies.items():
            chat = read_chat(body["messages"])
            assert chat.task == ("task" in name), name
            assert chat.follow_up == (name == "follow_up"), name
            if not chat.task:
                assert "<attached_files>" not in chat.question
                assert "<details" not in " ".join(text for _, text in chat.history)
        assert read_chat(bodies["file_question"]["messages"]).question == "What does this say?"


MIB = 2**20
HANG_GUARD = 2.0
"""Seconds a read of a 1 MiB chat may take here: it takes milliseconds; backtracking patterns took minutes."""


def timed_read(messages: list[dict]) -> tuple[Chat, float]:
    """`read_chat(messages)` and the seconds it took."""
    start = time.perf_counter()
    chat = read_chat(messages)
    return chat, time.perf_counter() - start


def follow_up(earlier: str, question: str = "And then?") -> list[dict]:
    """A chat whose one earlier assistant turn is `earlier`."""
    return [
        {"role": "user", "content": "Who?"},
        {"role": "assistant", "content": earlier},
        {"role": "user", "content": question},
    ]


class TestReadingTakesLinearTime:
    """Chats shaped to make a backtracking pattern take time quadratic in their size are read in milliseconds."""

    def test_an_earlier_turn_of_80_000_newlines(self):
        chat, seconds = timed_read(follow_up("Paris" + "\n" * 80_000 + "Sources:\n[1] Paris: the capital"))
        assert chat.history == (("user", "Who?"), ("assistant", "Paris"))
        assert seconds < HANG_GUARD

    def test_a_1_mib_chat_of_500_000_newlines(self):
        messages = follow_up("\n" * 500_000, question="\n" * 24_000 + "Who?")
        assert len(json.dumps({"messages": messages})) > 1_000_000
        chat, seconds = timed_read(messages)
        assert chat.history == (("user", "Who?"),)
        assert chat.question.strip() == "Who?"
        assert seconds < HANG_GUARD

    @pytest.mark.parametrize(
        "unit",
        [
            "\n",
            " \n\t",
            "<details",
            "<details>",
            "<details x=1>\n",
            "<DETAILS ",
            "</details>",
            "Sources:\n",
            "\nSources:\n",
            "\n \nSources: ",
            "\n\nSources:",
            "<attached_files>",
            "<attached_files>\n",
            "</attached_files>",
            "x",
            "\x00",
        ],
    )
    @pytest.mark.parametrize("where", ["earlier turn", "question"])
    def test_a_1_mib_repetition(self, unit, where):
        text = unit * (MIB // len(unit))
        if where == "earlier turn":
            chat, seconds = timed_read(follow_up(text))
            assert all(len(turn) <= MAX_TURN_CHARS for _, turn in chat.history)
        else:
            chat, seconds = timed_read(follow_up("Paris", question=text + "?"))
            assert chat.question.endswith("?")
        assert seconds < HANG_GUARD

    @pytest.mark.parametrize("question", ["\x00" * MIB, "\u200b" * MIB, " " * MIB])
    def test_a_1_mib_question_that_shows_nothing_is_refused_at_once(self, question):
        start = time.perf_counter()
        with pytest.raises(ChatRequestError, match="holds no text"):
            read_chat([{"role": "user", "content": question}])
        assert time.perf_counter() - start < HANG_GUARD

    def test_unclosed_tags_and_a_sources_line_without_a_newline_before_it_stay(self):
        text = "<details open>a <attached_files> b</DETAILS>c\nSources: d\nSources:\ne"
        assert turn_text(text) == "c Sources: d"
        assert turn_text("<details\n" + "x" * 600) == "<details " + "x" * 487 + " ..."
        assert turn_text("Sources:\n[1] Paris") == "Sources: [1] Paris"
        chat = read_chat([{"role": "user", "content": "<attached_files> x\n<attached_files>y</attached_files>\n z"}])
        assert chat.question == "z"


class TestHistoryText:
    def test_lines(self):
        assert history_text([("user", "Who?"), ("assistant", "Rollo")]) == "User: Who?\nAssistant: Rollo"

    def test_the_latest_turns_fit(self):
        history = [("user", f"question {i} " + "x" * 80) for i in range(100)]
        text = history_text(history, max_chars=500)
        assert len(text) <= 500
        assert text.endswith(history[-1][1])

    @given(st.lists(st.tuples(st.sampled_from(["user", "assistant"]), st.text()), max_size=20), st.integers(1, 3000))
    def test_never_longer_than_asked(self, history, max_chars):
        assert len(history_text(history, max_chars=max_chars)) <= max_chars


class TestDigest:
    def test_length_and_hash(self):
        assert digest("Who?").startswith("4 characters, sha256 ")

    def test_any_text(self):
        assert digest("\ud800</passage>").startswith("11 characters, sha256 ")


class TestStandaloneQuestion:
    HISTORY = (("user", "What is Chain-of-Note?"), ("assistant", "A strategy that writes a note per passage."))

    def test_one_call_and_its_usage(self):
        llm = RecordingGenerator(" How many LLM calls does Chain-of-Note make?\nmore")
        question, usage = asyncio.run(standalone_question(llm, self.HISTORY, "How many LLM calls does it make?"))
        assert question == "How many LLM calls does Chain-of-Note make?"
        assert (usage["calls"], usage["rounds"]) == (1, 1)
        assert len(llm.prompts) == 1
        assert "User: What is Chain-of-Note?\nAssistant: A strategy" in llm.prompts[0]
        assert llm.prompts[0].endswith("Last question: How many LLM calls does it make?\nStandalone question:")

    def test_a_rewrite_that_still_refers_back_gets_the_previous_question(self):
        llm = RecordingGenerator("How many LLM calls does it make?")  # a small model's unchanged question
        question, usage = asyncio.run(standalone_question(llm, self.HISTORY, "How many LLM calls does it make?"))
        assert question == "What is Chain-of-Note? How many LLM calls does it make?"
        assert usage["calls"] == 1

    @pytest.mark.parametrize(
        ("rewrite", "expected"),
        [
            ("How many LLM calls does it make?", True),
            ("How many LLM calls does Chain-of-Note make?", False),  # named the subject
            ("How many LLM calls are made?", False),  # nothing refers back
            ("Does Chain-of-Note write a note per passage? Is it slow?", False),
        ],
    )
    def test_refers_back(self, rewrite, expected):
        assert refers_back(rewrite, "How many LLM calls does it make?", self.HISTORY) is expected

    def test_no_history_no_call(self):
        llm = RecordingGenerator("unused")
        assert asyncio.run(standalone_question(llm, (), "Who?")) == ("Who?", empty_usage())
        assert llm.prompts == []

    @pytest.mark.parametrize("reply", ["", "\n\n", "x" * 50])
    def test_an_empty_or_too_long_reply_keeps_the_question(self, reply):
        question, usage = asyncio.run(
            standalone_question(RecordingGenerator(reply), self.HISTORY, "Why?", max_chars=20)
        )
        assert question == "Why?"
        assert usage["calls"] == 1

    def test_chat_text_is_no_template(self):
        messages = standalone_question_prompt((("user", "{{ query }} {% if 1 %}x{% endif %}"),), "{{ history }}")
        assert "User: {{ query }} {% if 1 %}x{% endif %}" in messages[0].text
        assert "Last question: {{ history }}" in messages[0].text

    def test_the_prompt_is_registered(self):
        assert PROMPTS["standalone_question"].stop == ("\n",)


def test_a_task_is_one_plain_call():
    llm = RecordingGenerator('Here it is: {"title": "Chain-of-Note"} as asked')
    text, usage = asyncio.run(answer_task(llm, f"{TASK_PREFIX}\nGenerate a title."))
    assert text == '{"title": "Chain-of-Note"}'
    assert usage["calls"] == 1
    assert llm.prompts == [f"{TASK_PREFIX}\nGenerate a title."]


@pytest.mark.parametrize("reply", ["", "Chain-of-Note", "{not json}", "[1, 2]", "} {"])
def test_a_task_reply_without_a_json_object_is_an_empty_object(reply):
    """Open WebUI's tasks fail on a reply with no text; `{}` makes each fall back to its default."""
    assert asyncio.run(answer_task(RecordingGenerator(reply), f"{TASK_PREFIX}\nGenerate tags."))[0] == "{}"
