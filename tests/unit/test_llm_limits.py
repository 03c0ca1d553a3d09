"""
The process-wide limit on LLM calls in flight (`haystack_fusion.llm`): `max_calls_in_flight`, the
environment's limit, and `CallLimitedChatGenerator`, the wrapper whose every call holds a slot across threads and
event loops.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from haystack import Pipeline, component
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage

from haystack_fusion.llm import (
    CallLimitedChatGenerator,
    calls_in_flight_limit,
    logprob_kwargs,
    max_calls_in_flight,
    run_chat_calls,
    run_chat_calls_async,
    stop_kwargs,
    unwrap_call_limit,
)
from haystack_fusion.settings import MAX_CALLS_IN_FLIGHT_ENV
from haystack_fusion.testing import ScriptedChatGenerator


class Gauge:
    """Counts calls under way and the most at once."""

    def __init__(self) -> None:
        self.now = self.most = 0
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.now -= 1


def slow_llm(gauge: Gauge, seconds: float = 0.02) -> CallLimitedChatGenerator:
    def slow(_messages):
        with gauge:
            time.sleep(seconds)
        return "Paris"

    return CallLimitedChatGenerator(chat_generator=MockChatGenerator(response_fn=slow))


class TestSlotsAcrossThreadsAndLoops:
    def test_threads_and_event_loops_share_the_slots(self):
        gauge = Gauge()
        llm = slow_llm(gauge)

        async def many():
            await asyncio.gather(*(llm.run_async(messages=messages()) for _ in range(4)))

        with max_calls_in_flight(2):
            threads = [threading.Thread(target=llm.run, args=(messages(),)) for _ in range(4)]
            threads += [threading.Thread(target=asyncio.run, args=(many(),)) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert gauge.most == 2

    def test_a_cancelled_waiter_leaves_no_slot_taken(self):
        gauge = Gauge()
        llm = slow_llm(gauge, seconds=0.2)

        async def main():
            holder = asyncio.create_task(llm.run_async(messages=messages()))
            await asyncio.sleep(0.05)
            waiter = asyncio.create_task(llm.run_async(messages=messages()))
            await asyncio.sleep(0.05)
            waiter.cancel()
            await asyncio.gather(holder, waiter, return_exceptions=True)
            await asyncio.sleep(0.1)  # the cancelled wait's thread gives back what it took
            return await asyncio.wait_for(llm.run_async(messages=messages()), 1)

        with max_calls_in_flight(1):
            assert asyncio.run(main())["replies"][0].text == "Paris"
        assert gauge.most == 1


class TestProcessWideLimit:
    def test_the_block_overrides_the_environment(self, monkeypatch):
        monkeypatch.setenv(MAX_CALLS_IN_FLIGHT_ENV, "7")
        assert calls_in_flight_limit() == 7
        with max_calls_in_flight(2):
            assert calls_in_flight_limit() == 2
        assert calls_in_flight_limit() == 7
        monkeypatch.delenv(MAX_CALLS_IN_FLIGHT_ENV)
        assert calls_in_flight_limit() is None

    @pytest.mark.parametrize("value", ["0", "x", "-1"])
    def test_a_bad_environment_value_is_refused(self, monkeypatch, value):
        monkeypatch.setenv(MAX_CALLS_IN_FLIGHT_ENV, value)
        with pytest.raises(ValueError, match=MAX_CALLS_IN_FLIGHT_ENV):
            calls_in_flight_limit()

    def test_fan_outs_from_many_threads_keep_within_the_limit(self):
        gauge = Gauge()
        generator = slow_llm(gauge)
        prompts = [[ChatMessage.from_user(f"question {i}")] for i in range(5)]
        with max_calls_in_flight(3):
            threads = [threading.Thread(target=run_chat_calls, args=(generator, prompts)) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert gauge.most <= 3

    def test_a_fan_out_of_a_wrapped_generator_takes_one_slot_per_call(self):
        gauge = Gauge()

        def slow(messages):
            with gauge:
                time.sleep(0.01)
            return "Paris"

        generator = CallLimitedChatGenerator(chat_generator=MockChatGenerator(response_fn=slow))
        prompts = [[ChatMessage.from_user(f"question {i}")] for i in range(4)]
        with max_calls_in_flight(1):  # a second slot for the nested call would never come
            result = run_chat_calls(generator, prompts)
            threads = [threading.Thread(target=generator.run, args=(prompts[0],)) for _ in range(3)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert [reply.text for reply in result.replies] == ["Paris"] * 4
        assert gauge.most == 1

    def test_a_bad_block_limit_is_refused(self):
        with pytest.raises(ValueError, match="max_calls_in_flight"), max_calls_in_flight(0):
            pass


MOCK_DICT = {
    "type": "haystack.components.generators.chat.mock.MockChatGenerator",
    "init_parameters": {
        "responses": None,
        "response_fn": None,
        "model": "mock-model",
        "meta": {},
        "streaming_callback": None,
    },
}


@component
class WarmUpRecorder(ScriptedChatGenerator):
    """A scripted generator that records its warm-up and close calls (sync ones only)."""

    def __init__(self) -> None:
        ScriptedChatGenerator.__init__(self, reply="Paris", generation_kwargs={"stop": ["\n\n"]})
        self.events: list[str] = []

    def warm_up(self) -> None:
        self.events.append("warm_up")

    def close(self) -> None:
        self.events.append("close")


def messages(text: str = "What is the capital of France?") -> list[ChatMessage]:
    return [ChatMessage.from_user(text)]


class TestCallLimitedChatGenerator:
    def test_to_dict(self):
        llm = CallLimitedChatGenerator(chat_generator=MockChatGenerator())
        assert llm.to_dict() == {
            "type": "haystack_fusion.llm.CallLimitedChatGenerator",
            "init_parameters": {"chat_generator": MOCK_DICT, "breaker": None, "generation_kwargs": None},
        }

    def test_from_dict(self):
        llm = CallLimitedChatGenerator.from_dict(
            {
                "type": "haystack_fusion.llm.CallLimitedChatGenerator",
                "init_parameters": {"chat_generator": MOCK_DICT},
            }
        )
        assert isinstance(unwrap_call_limit(llm), MockChatGenerator)
        assert unwrap_call_limit(llm).model == "mock-model"
        assert CallLimitedChatGenerator.from_dict(llm.to_dict()).to_dict() == llm.to_dict()

    def test_pipeline_round_trip(self):
        pipeline = Pipeline()
        pipeline.add_component("llm", CallLimitedChatGenerator(chat_generator=MockChatGenerator(responses=["Paris"])))
        loaded = Pipeline.loads(pipeline.dumps())
        assert loaded == pipeline
        assert isinstance(loaded.get_component("llm"), CallLimitedChatGenerator)
        assert loaded.run({"llm": {"messages": messages()}})["llm"]["replies"][0].text == "Paris"

    def test_sockets_are_the_wrapped_generators(self):
        mock = CallLimitedChatGenerator(chat_generator=MockChatGenerator())
        scripted = CallLimitedChatGenerator(chat_generator=ScriptedChatGenerator(reply="Paris"))
        for llm, wrapped in [(mock, MockChatGenerator()), (scripted, ScriptedChatGenerator(reply="Paris"))]:
            sockets = {name: s.default_value for name, s in llm.__haystack_input__._sockets_dict.items()}
            own = {name: s.default_value for name, s in wrapped.__haystack_input__._sockets_dict.items()}
            assert llm.__haystack_input__._sockets_dict["messages"].type == list[ChatMessage]
            assert sockets == own
            assert llm.__haystack_output__._sockets_dict.keys() == {"replies"}
        assert "streaming_callback" in mock.__haystack_input__._sockets_dict
        assert set(scripted.__haystack_input__._sockets_dict) == {"messages", "generation_kwargs"}

    def test_run_passes_the_inputs_on(self):
        scripted = ScriptedChatGenerator(reply="Paris")
        llm = CallLimitedChatGenerator(chat_generator=scripted)
        result = llm.run(messages=messages(), generation_kwargs={"temperature": 0.5})
        assert result["replies"][0].text == "Paris"
        assert scripted.kwargs == [{"temperature": 0.5}]

    def test_streaming_callback_reaches_the_wrapped_generator(self):
        chunks: list[Any] = []
        llm = CallLimitedChatGenerator(chat_generator=MockChatGenerator(responses=["Paris"]))
        pipeline = Pipeline()
        pipeline.add_component("llm", llm)
        pipeline.run({"llm": {"messages": messages(), "streaming_callback": chunks.append}})
        assert "".join(chunk.content for chunk in chunks) == "Paris"
        assert {chunk.component_info.name for chunk in chunks} == {"llm"}  # the pipeline's name for the call

    def test_pipeline_stream_names_the_wrapper(self):
        pipeline = Pipeline()
        pipeline.add_component("llm", CallLimitedChatGenerator(chat_generator=MockChatGenerator(responses=["Paris"])))

        async def stream() -> list[Any]:
            return [chunk async for chunk in pipeline.stream({"llm": {"messages": messages()}})]

        chunks = asyncio.run(stream())
        assert "".join(chunk.content for chunk in chunks) == "Paris"
        assert {chunk.component_info.name for chunk in chunks} == {"llm"}

    @pytest.mark.parametrize("asynchronous", [False, True])
    def test_its_generation_kwargs_go_with_each_call_under_the_calls_own(self, asynchronous):
        scripted = ScriptedChatGenerator(reply="Paris", generation_kwargs={"temperature": 0.0})
        llm = CallLimitedChatGenerator(chat_generator=scripted, generation_kwargs={"stop": ["\n"], "temperature": 0})
        llm.run(messages=messages())
        call = {"messages": messages(), "generation_kwargs": {"temperature": 0.5}}
        asyncio.run(llm.run_async(**call)) if asynchronous else llm.run(**call)
        assert scripted.kwargs == [{"stop": ["\n"], "temperature": 0}, {"stop": ["\n"], "temperature": 0.5}]
        assert scripted.generation_kwargs == {"temperature": 0.0}  # the generator's own settings stay as given

    def test_run_holds_a_slot(self):
        gauge = Gauge()

        def slow(_messages):
            with gauge:
                time.sleep(0.02)
            return "Paris"

        llm = CallLimitedChatGenerator(chat_generator=MockChatGenerator(response_fn=slow))
        with max_calls_in_flight(2):
            threads = [threading.Thread(target=llm.run, args=(messages(),)) for _ in range(6)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert gauge.most == 2

    def test_run_async_holds_a_slot(self):
        gauge = Gauge()

        def slow(_messages):
            with gauge:
                time.sleep(0.02)
            return "Paris"

        llm = CallLimitedChatGenerator(chat_generator=MockChatGenerator(response_fn=slow))

        async def many():
            return await asyncio.gather(*(llm.run_async(messages=messages()) for _ in range(6)))

        with max_calls_in_flight(2):
            results = asyncio.run(many())
        assert [result["replies"][0].text for result in results] == ["Paris"] * 6
        assert gauge.most <= 2

    def test_run_async_runs_a_sync_generator_in_a_thread(self):
        scripted = ScriptedChatGenerator(reply="Paris")
        llm = CallLimitedChatGenerator(chat_generator=scripted)
        with max_calls_in_flight(1):
            result = asyncio.run(llm.run_async(messages=messages()))
        assert result["replies"][0].text == "Paris"
        assert scripted.calls == 1

    def test_no_limit_takes_no_slot(self, monkeypatch):
        monkeypatch.delenv(MAX_CALLS_IN_FLIGHT_ENV, raising=False)
        llm = CallLimitedChatGenerator(chat_generator=ScriptedChatGenerator(reply="Paris"))
        assert llm.run(messages=messages())["replies"][0].text == "Paris"

    def test_warm_up_and_close_are_delegated(self):
        recorder = WarmUpRecorder()
        llm = CallLimitedChatGenerator(chat_generator=recorder)
        llm.warm_up()
        asyncio.run(llm.warm_up_async())  # no warm_up_async of its own: its warm_up
        llm.close()
        asyncio.run(llm.close_async())
        assert recorder.events == ["warm_up", "warm_up", "close", "close"]

    def test_the_wrapped_generators_settings_are_read_through_it(self):
        recorder = WarmUpRecorder()
        llm = CallLimitedChatGenerator(chat_generator=CallLimitedChatGenerator(chat_generator=recorder))
        assert unwrap_call_limit(llm) is recorder
        assert unwrap_call_limit(recorder) is recorder
        assert stop_kwargs(llm, ("\n",)) == {"stop": ["\n"]}
        assert logprob_kwargs(llm) == {}

    def test_a_fan_out_calls_the_wrapped_generator(self):
        scripted = ScriptedChatGenerator(reply="Paris")
        llm = CallLimitedChatGenerator(chat_generator=scripted)
        with max_calls_in_flight(1):
            result = asyncio.run(run_chat_calls_async(llm, [messages("a"), messages("b")]))
        assert [reply.text for reply in result.replies] == ["Paris", "Paris"]
        assert sorted(scripted.prompts) == ["a", "b"]
