import asyncio
import copy

import httpx
import openai
import pytest
from haystack import Pipeline, component
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage

from haystack_fusion import AbstainingChatGenerator, UnknownRouter
from haystack_fusion.failures import CallFailure
from haystack_fusion.llm import backend_unusable
from haystack_fusion.testing import ScriptedChatGenerator

MESSAGES = [ChatMessage.from_user("What is the capital of France?")]
EXPLODED = CallFailure("failing", "RuntimeError", "backend exploded").to_dict()


@component
class NoReply:
    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage]) -> dict:
        return {"replies": []}


class TestAbstainingChatGenerator:
    def test_a_reply_is_passed_on_with_the_call_counted(self):
        reply = ChatMessage.from_assistant("Paris", meta={"usage": {"prompt_tokens": 7, "completion_tokens": 1}})
        result = AbstainingChatGenerator(chat_generator=MockChatGenerator(responses=[reply])).run(messages=MESSAGES)
        assert [r.text for r in result["replies"]] == ["Paris"]
        assert result["replies"][0].meta["usage"] == {"prompt_tokens": 7, "completion_tokens": 1}
        assert result["meta"] == {
            "usage": {"prompt_tokens": 7, "completion_tokens": 1, "calls": 1, "failed_calls": 0, "rounds": 1},
            "failures": [],
        }

    def test_a_failed_call_gives_no_reply_and_reports_the_failure(self):
        generator = ScriptedChatGenerator("Paris", fail_on="capital")
        result = AbstainingChatGenerator(chat_generator=generator).run(messages=MESSAGES)
        assert result["replies"] == []
        assert result["meta"]["failures"] == [EXPLODED]
        assert result["meta"]["usage"]["calls"] == result["meta"]["usage"]["failed_calls"] == 1
        assert generator.calls == 1  # retries are the generator's own: none here

    def test_no_reply_is_a_failure_too(self):
        result = AbstainingChatGenerator(chat_generator=NoReply()).run(messages=MESSAGES)
        assert result["replies"] == []
        assert result["meta"]["failures"] == [
            CallFailure("failing", "RuntimeError", "the chat generator returned no reply").to_dict()
        ]

    def test_generation_kwargs_reach_the_generator(self):
        generator = ScriptedChatGenerator("Paris")
        AbstainingChatGenerator(chat_generator=generator).run(messages=MESSAGES, generation_kwargs={"stop": ["\n"]})
        AbstainingChatGenerator(chat_generator=generator).run(messages=MESSAGES)
        assert generator.kwargs == [{"stop": ["\n"]}, None]

    def test_run_async(self):
        ok = asyncio.run(
            AbstainingChatGenerator(chat_generator=ScriptedChatGenerator("Paris")).run_async(messages=MESSAGES)
        )
        failed = asyncio.run(
            AbstainingChatGenerator(chat_generator=ScriptedChatGenerator("Paris", fail_on="capital")).run_async(
                MESSAGES
            )
        )
        assert [r.text for r in ok["replies"]] == ["Paris"]
        assert failed["replies"] == []
        assert failed["meta"]["failures"] == [EXPLODED]

    def test_a_router_behind_it_falls_back_on_a_failed_call(self):
        pipeline = Pipeline()
        pipeline.add_component(
            "llm", AbstainingChatGenerator(chat_generator=ScriptedChatGenerator("Paris", fail_on="capital"))
        )
        pipeline.add_component("router", UnknownRouter())
        pipeline.connect("llm.replies", "router.replies")
        result = pipeline.run({"llm": {"messages": MESSAGES}, "router": {"query": "What is the capital of France?"}})
        assert result["router"]["reason"] == "no reply"
        assert result["router"]["fallback_query"] == "What is the capital of France?"
        assert result["llm"]["meta"]["failures"] == [{**EXPLODED, "component": "llm"}]

    def test_serialization_round_trip(self):
        llm = AbstainingChatGenerator(chat_generator=MockChatGenerator(responses=["Paris"]))
        data = llm.to_dict()
        assert data == {
            "type": "haystack_fusion.components.concatenation.AbstainingChatGenerator",
            "init_parameters": {
                "chat_generator": MockChatGenerator(responses=["Paris"]).to_dict(),
                "samples": 0,
                "sampling_generation_kwargs": None,
            },
        }
        assert AbstainingChatGenerator.from_dict(copy.deepcopy(data)).to_dict() == data  # from_dict changes its input
        pipeline = Pipeline()
        pipeline.add_component("llm", llm)
        assert Pipeline.loads(pipeline.dumps()) == pipeline


def _refused_connection() -> Exception:
    request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    try:
        raise ConnectionRefusedError(111, "Connection refused")
    except ConnectionRefusedError as cause:
        try:
            raise openai.APIConnectionError(request=request) from cause
        except openai.APIConnectionError as error:
            return error


@component
class Raising:
    """A generator whose every call raises `error`."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage]) -> dict:
        raise self.error


class TestUnusableBackends:
    def test_a_refused_connection_or_key_is_raised_not_abstained_on(self):
        request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
        refused_key = openai.AuthenticationError(
            "Incorrect API key", response=httpx.Response(401, request=request), body=None
        )
        for error in (_refused_connection(), refused_key):
            with pytest.raises(type(error)):
                AbstainingChatGenerator(chat_generator=Raising(error)).run(messages=MESSAGES)

    def test_a_timeout_or_an_error_status_is_one_call_s_failure(self):
        request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
        server_error = openai.InternalServerError("boom", response=httpx.Response(500, request=request), body=None)
        cases = {openai.APITimeoutError(request=request): ("timeout", None), server_error: ("failing", 500)}
        cases[ValueError("malformed")] = ("failing", None)
        for error, (kind, status) in cases.items():
            result = AbstainingChatGenerator(chat_generator=Raising(error)).run(messages=MESSAGES)
            assert result["replies"] == []
            (failure,) = result["meta"]["failures"]
            assert (failure["kind"], failure["error_type"], failure["status"]) == (kind, type(error).__name__, status)

    @pytest.mark.parametrize(
        ("error", "unusable"),
        [
            (_refused_connection(), True),
            (ConnectionRefusedError(111, "Connection refused"), True),  # the ollama client's
            (openai.APITimeoutError(request=httpx.Request("POST", "http://x")), False),
            (RuntimeError("the chat generator returned no reply"), False),
            (TimeoutError(), False),
        ],
        ids=["openai-refused", "ollama-refused", "openai-timeout", "no-reply", "timeout"],
    )
    def test_backend_unusable(self, error, unusable):
        assert backend_unusable(error) is unusable
