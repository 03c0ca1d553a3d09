"""The served chat's contract: which client gets which dialect, and what a request may ask."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("hayhooks", reason="the `serve` extra (pip install 'haystack-fusion[serve]')")

from fastapi import HTTPException

from haystack_fusion.serving.protocol import (
    CHAT_UI_CLIENT,
    CHAT_UI_HEADER,
    CompletionStream,
    check_request,
    completion,
    dialect,
    include_usage,
)
from haystack_fusion.settings import chat_client_from_env
from haystack_fusion.strategies import Usage

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "open_webui"


@pytest.mark.parametrize("fixture", sorted(path.name for path in FIXTURES.glob("*.json")))
def test_every_captured_open_webui_request_gets_its_dialect_and_passes_the_field_check(fixture):
    captured = json.loads((FIXTURES / fixture).read_text(encoding="utf-8"))
    headers = {name.lower(): value.replace("<version>", "3.12.15") for name, value in captured["headers"].items()}
    assert dialect(headers) == "open-webui"
    check_request(captured["body"])  # its `tools` come without `tool_choice`: answered, no tool called


@pytest.mark.parametrize(
    "user_agent",
    [
        "OpenAI/Python 2.8.1",  # the openai SDK, and what is built on it (LangChain, pydantic-ai, llm)
        "curl/8.5.0",
        "Mozilla/5.0 (X11; Linux x86_64)",
        "python-httpx/0.28.1",
        "",
    ],
)
def test_other_clients_get_openai_only(user_agent):
    assert dialect({"user-agent": user_agent}) == "openai"
    assert dialect(None) == "openai"


def test_the_setting_and_the_chat_ui_header():
    open_webui = {"user-agent": "Python/3.11 aiohttp/3.12.15"}
    assert dialect(open_webui, "openai") == "openai"
    assert dialect({"user-agent": "curl/8"}, "open-webui") == "open-webui"
    assert dialect({CHAT_UI_HEADER.lower(): CHAT_UI_CLIENT}, "openai") == "chainlit"
    assert chat_client_from_env({}) == "auto"
    assert chat_client_from_env({"HAYSTACK_FUSION_CHAT_CLIENT": " Open-WebUI "}) == "open-webui"
    with pytest.raises(ValueError, match="HAYSTACK_FUSION_CHAT_CLIENT must be one of auto, open-webui, openai"):
        chat_client_from_env({"HAYSTACK_FUSION_CHAT_CLIENT": "webui"})


@pytest.mark.parametrize(
    "body",
    [
        {"n": 1},
        {"tool_choice": "auto", "tools": [{"type": "function", "function": {"name": "f"}}]},
        {"tool_choice": "none"},
        {"response_format": {"type": "text"}},
        {"modalities": ["text"]},
        {"logprobs": False, "temperature": 0.2, "max_tokens": 5, "stop": ["\n"], "seed": 1, "user": "u"},
        {"stream_options": {"include_usage": True}, "parallel_tool_calls": False, "metadata": {"a": "b"}},
    ],
)
def test_honored_or_ignored_fields_pass(body):
    check_request(body)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"n": 2}, "n"),
        ({"n": 0}, "n"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        ({"function_call": {"name": "f"}}, "function_call"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"logprobs": True}, "logprobs"),
    ],
)
def test_what_no_strategy_can_do_is_refused_naming_the_field(body, param):
    with pytest.raises(HTTPException) as refused:
        check_request(body)
    assert refused.value.status_code == 400
    assert refused.value.param == param
    assert refused.value.code == "unsupported_parameter"
    assert str(refused.value.detail).startswith(f"`{param}`: ")


def test_include_usage():
    assert include_usage({"stream_options": {"include_usage": True}})
    assert not include_usage({"stream_options": None})
    assert not include_usage({})


def test_a_completion_and_a_stream_in_openai_shape():
    usage = Usage(calls=2, prompt_tokens=7, completion_tokens=3)
    reply = json.loads(completion("cascade", "Paris", usage, []).model_dump_json())
    assert reply["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    assert reply["choices"][0]["message"] == {
        "role": "assistant",
        "content": "Paris",
        "reasoning_content": None,
        "tool_calls": None,
        "refusal": None,
    }
    stream = CompletionStream("cascade", include_usage=True)
    chunks = [stream.start(), stream.text("Paris"), *stream.end(usage, [])]
    assert [len(chunk.choices) for chunk in chunks] == [1, 1, 1, 0]
    assert chunks[-1].usage == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    assert {chunk.id for chunk in chunks} == {stream.id}
