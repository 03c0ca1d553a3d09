import asyncio
import copy

from haystack import Pipeline, component
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage

from haystack_fusion import AbstainingChatGenerator, UnknownRouter
from tests.scripted import ScriptedChatGenerator

MESSAGES = [ChatMessage.from_user("What is the capital of France?")]


@component
class Capital(ScriptedChatGenerator):
    def reply(self, prompt: str) -> str:
        return "Paris"


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
        generator = Capital(fail_on="capital")
        result = AbstainingChatGenerator(chat_generator=generator).run(messages=MESSAGES)
        assert result["replies"] == []
        assert result["meta"]["failures"] == [{"error": "RuntimeError: backend exploded"}]
        assert result["meta"]["usage"]["calls"] == result["meta"]["usage"]["failed_calls"] == 1
        assert generator.calls == 1  # retries are the generator's own: none here

    def test_no_reply_is_a_failure_too(self):
        result = AbstainingChatGenerator(chat_generator=NoReply()).run(messages=MESSAGES)
        assert result["replies"] == []
        assert result["meta"]["failures"] == [{"error": "RuntimeError: the chat generator returned no reply"}]

    def test_generation_kwargs_reach_the_generator(self):
        generator = Capital()
        AbstainingChatGenerator(chat_generator=generator).run(messages=MESSAGES, generation_kwargs={"stop": ["\n"]})
        AbstainingChatGenerator(chat_generator=generator).run(messages=MESSAGES)
        assert generator.kwargs == [{"stop": ["\n"]}, None]

    def test_run_async(self):
        ok = asyncio.run(AbstainingChatGenerator(chat_generator=Capital()).run_async(messages=MESSAGES))
        failed = asyncio.run(AbstainingChatGenerator(chat_generator=Capital(fail_on="capital")).run_async(MESSAGES))
        assert [r.text for r in ok["replies"]] == ["Paris"]
        assert failed["replies"] == []
        assert failed["meta"]["failures"] == [{"error": "RuntimeError: backend exploded"}]

    def test_a_router_behind_it_falls_back_on_a_failed_call(self):
        pipeline = Pipeline()
        pipeline.add_component("llm", AbstainingChatGenerator(chat_generator=Capital(fail_on="capital")))
        pipeline.add_component("router", UnknownRouter())
        pipeline.connect("llm.replies", "router.replies")
        result = pipeline.run({"llm": {"messages": MESSAGES}, "router": {"query": "What is the capital of France?"}})
        assert result["router"]["reason"] == "no reply"
        assert result["router"]["fallback_query"] == "What is the capital of France?"
        assert result["llm"]["meta"]["failures"] == [{"error": "RuntimeError: backend exploded"}]

    def test_serialization_round_trip(self):
        llm = AbstainingChatGenerator(chat_generator=MockChatGenerator(responses=["Paris"]))
        data = llm.to_dict()
        assert data == {
            "type": "haystack_fusion.components.abstaining_chat_generator.AbstainingChatGenerator",
            "init_parameters": {"chat_generator": MockChatGenerator(responses=["Paris"]).to_dict()},
        }
        assert AbstainingChatGenerator.from_dict(copy.deepcopy(data)).to_dict() == data  # from_dict changes its input
        pipeline = Pipeline()
        pipeline.add_component("llm", llm)
        assert Pipeline.loads(pipeline.dumps()) == pipeline
