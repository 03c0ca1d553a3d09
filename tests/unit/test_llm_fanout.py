"""The fan-out of independent ChatGenerator calls (`haystack_fusion.llm`): order, failures, bounds, threads."""

import asyncio
import os
import threading
import time
from typing import Any

import pytest
from haystack import Document, component
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage

from haystack_fusion import CandidateSummarizer, NoteTaker, PostFusionVoter, SummaryVerifier
from haystack_fusion.failures import CallFailure
from haystack_fusion.llm import (
    FanOutResult,
    check_max_concurrency,
    empty_usage,
    run_chat_calls,
    run_chat_calls_async,
)
from tests.unit.scripted_calls import echo_prompt, failing_async_generator, failing_sync_generator, prompts_of


@component
class NoReplyGenerator:
    """Returns no reply for one specific prompt."""

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], generation_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        if messages[-1].text == "silent":
            return {"replies": []}
        return {"replies": [ChatMessage.from_assistant("ok")]}


@component
class CountingAsyncGenerator:
    """Counts the calls under way at once. Each call yields to the event loop a few times so that calls overlap."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls = 0
        self.generation_kwargs: list[dict[str, Any] | None] = []

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], generation_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        raise AssertionError("run_chat_calls must use run_async when the generator has one")

    @component.output_types(replies=list[ChatMessage])
    async def run_async(
        self, messages: list[ChatMessage], generation_kwargs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        self.calls += 1
        self.generation_kwargs.append(generation_kwargs)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            for _ in range(5):
                await asyncio.sleep(0)
            return {"replies": [ChatMessage.from_assistant(messages[-1].text)]}
        finally:
            self.in_flight -= 1


@component
class LoopBoundGenerator:
    """Like a generator with an async HTTP client: `run_async` only works on the event loop it first ran on."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.sync_calls = 0
        self.async_calls = 0
        self._lock = threading.Lock()

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], generation_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        with self._lock:
            self.sync_calls += 1
        return {"replies": [ChatMessage.from_assistant(messages[-1].text)]}

    @component.output_types(replies=list[ChatMessage])
    async def run_async(
        self, messages: list[ChatMessage], generation_kwargs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        if self.loop is not None and self.loop is not loop:
            raise RuntimeError("Event loop is closed")
        self.loop = loop
        self.async_calls += 1
        return {"replies": [ChatMessage.from_assistant(messages[-1].text)]}


@component
class CountingSyncGenerator:
    """
    Counts the calls under way at once from worker threads (only a sync `run`).

    Each call waits (up to `timeout` seconds) until `target` calls are under way (or all `total` calls have
    started), then lingers briefly, so the observed maximum does not depend on thread start-up timing: it reaches
    `target` whenever the fan-out lets that many calls run at once, and the wait times out otherwise.
    """

    def __init__(self, target: int, total: int, timeout: float = 2.0) -> None:
        self.target = target
        self.total = total
        self.timeout = timeout
        self.started = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._condition = threading.Condition()

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], generation_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        with self._condition:
            self.started += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self._condition.notify_all()
            self._condition.wait_for(
                lambda: self.in_flight >= self.target or self.started >= self.total, timeout=self.timeout
            )
        try:
            threading.Event().wait(0.01)  # linger, so that an over-eager fan-out would show more calls at once
            return {"replies": [ChatMessage.from_assistant(messages[-1].text)]}
        finally:
            with self._condition:
                self.in_flight -= 1


class TestRunChatCalls:
    def test_replies_in_input_order(self):
        texts = [f"prompt {i}" for i in range(7)]
        result = run_chat_calls(MockChatGenerator(response_fn=echo_prompt), prompts_of(texts), max_concurrency=3)
        assert isinstance(result, FanOutResult)
        assert [reply.text for reply in result.replies] == [f"echo:{text}" for text in texts]
        assert result.errors == [None] * 7
        assert result.failures == []
        assert result.usage["calls"] == 7
        assert result.usage["failed_calls"] == 0

    def test_replies_in_input_order_threads_path(self):
        texts = [f"prompt {i}" for i in range(7)]
        result = run_chat_calls(failing_sync_generator(fail_on="never"), prompts_of(texts), max_concurrency=3)
        assert [reply.text for reply in result.replies] == [f"echo:{text}" for text in texts]

    def test_empty_prompt_list(self):
        result = run_chat_calls(MockChatGenerator(responses="x"), [], max_concurrency=2)
        assert result.replies == []
        assert result.errors == []
        assert result.usage == empty_usage()

    @pytest.mark.parametrize("make_generator", [failing_sync_generator, failing_async_generator])
    def test_one_failing_call_is_recorded(self, make_generator):
        texts = ["a", "b", "boom", "c"]
        result = run_chat_calls(make_generator(), prompts_of(texts), max_concurrency=2)
        assert [None if reply is None else reply.text for reply in result.replies] == [
            "echo:a",
            "echo:b",
            None,
            "echo:c",
        ]
        boom = CallFailure("failing", "RuntimeError", "cannot answer boom", index=2)
        assert result.errors == [None, None, boom, None]
        assert result.failures == [boom]
        assert result.usage["calls"] == 4
        assert result.usage["failed_calls"] == 1

    def test_no_reply_counts_as_failure(self):
        result = run_chat_calls(NoReplyGenerator(), prompts_of(["x", "silent"]), max_concurrency=2)
        assert result.replies[0].text == "ok"
        assert result.replies[1] is None
        assert result.failures == [
            CallFailure("failing", "RuntimeError", "the chat generator returned no reply", index=1)
        ]
        assert result.usage["failed_calls"] == 1

    @pytest.mark.parametrize("make_generator", [failing_sync_generator, failing_async_generator])
    def test_raise_on_failure(self, make_generator):
        with pytest.raises(RuntimeError, match="cannot answer boom"):
            run_chat_calls(make_generator(), prompts_of(["a", "boom", "c"]), max_concurrency=2, raise_on_failure=True)

    @pytest.mark.parametrize("max_concurrency", [1, 2, 4, 10])
    def test_max_in_flight_async_path(self, max_concurrency):
        k = 6
        generator = CountingAsyncGenerator()
        prompts = prompts_of([str(i) for i in range(k)])
        result = asyncio.run(run_chat_calls_async(generator, prompts, max_concurrency=max_concurrency))
        assert generator.calls == k
        assert generator.max_in_flight == min(k, max_concurrency)
        assert [reply.text for reply in result.replies] == [str(i) for i in range(k)]

    @pytest.mark.parametrize("max_concurrency", [1, 2, 4, 10])
    def test_max_in_flight_threads_path(self, max_concurrency):
        k = 6
        generator = CountingSyncGenerator(target=min(k, max_concurrency), total=k)
        result = run_chat_calls(generator, prompts_of([str(i) for i in range(k)]), max_concurrency=max_concurrency)
        assert generator.max_in_flight == min(k, max_concurrency)
        assert [reply.text for reply in result.replies] == [str(i) for i in range(k)]

    def test_threads_path_honours_max_concurrency_beyond_default_executor(self, monkeypatch):
        # With one CPU the default executor has 5 threads; 8 calls at max_concurrency 8 should run 8 at once.
        monkeypatch.setattr(os, "cpu_count", lambda: 1)
        if hasattr(os, "process_cpu_count"):
            monkeypatch.setattr(os, "process_cpu_count", lambda: 1)
        k = 8
        generator = CountingSyncGenerator(target=k, total=k, timeout=0.2)
        run_chat_calls(generator, prompts_of([str(i) for i in range(k)]), max_concurrency=k)
        assert generator.max_in_flight == k

    def test_usage_sums_reply_tokens(self):
        responses = [
            ChatMessage.from_assistant("a", meta={"usage": {"prompt_tokens": 10, "completion_tokens": 1}}),
            ChatMessage.from_assistant("b", meta={"usage": {"prompt_tokens": 20, "completion_tokens": 2}}),
            ChatMessage.from_assistant("c", meta={"usage": {"prompt_tokens": 30, "completion_tokens": 3}}),
        ]
        result = run_chat_calls(MockChatGenerator(responses=responses), prompts_of(["x", "y", "z"]), max_concurrency=1)
        assert result.usage == {"prompt_tokens": 60, "completion_tokens": 6, "calls": 3, "failed_calls": 0}

    def test_usage_of_failed_call_counts_no_tokens(self):
        result = run_chat_calls(failing_sync_generator(), prompts_of(["a", "boom"]), max_concurrency=2)
        assert result.usage == {"prompt_tokens": 0, "completion_tokens": 0, "calls": 2, "failed_calls": 1}

    def test_generation_kwargs_are_passed(self):
        generator = failing_sync_generator(fail_on="never")
        run_chat_calls(generator, prompts_of(["a", "b"]), max_concurrency=2, generation_kwargs={"temperature": 0.7})
        assert generator.kwargs == [{"temperature": 0.7}, {"temperature": 0.7}]

    def test_no_generation_kwargs_by_default(self):
        generator = failing_sync_generator(fail_on="never")
        run_chat_calls(generator, prompts_of(["a"]), max_concurrency=1)
        assert generator.kwargs == [None]

    def test_sync_form_never_uses_run_async(self):
        """Async clients (OpenAI's) are bound to their first event loop; the sync form's loop closes each time."""
        generator = LoopBoundGenerator()
        for _ in range(3):
            result = run_chat_calls(generator, prompts_of(["a", "b"]), max_concurrency=2)
            assert result.failures == []
        assert generator.sync_calls == 6

    async def test_async_form_records_a_failing_call(self):
        result = await run_chat_calls_async(failing_async_generator(), prompts_of(["a", "boom"]), max_concurrency=2)
        assert [reply.text if reply else None for reply in result.replies] == ["echo:a", None]
        assert result.errors[1] == CallFailure("failing", "RuntimeError", "cannot answer boom", index=1)

    async def test_async_form_uses_run_async(self):
        generator = LoopBoundGenerator()
        result = await run_chat_calls_async(generator, prompts_of(["a"]), max_concurrency=1)
        assert (result.failures, generator.async_calls, generator.sync_calls) == ([], 1, 0)

    def test_a_fresh_event_loop_per_question_makes_every_call(self):
        """On a loop other than its first, a generator's `run` goes to a worker thread: its async client stays bound
        to the first loop (a script's `asyncio.run` per question)."""
        generator = LoopBoundGenerator()
        for _ in range(3):
            result = asyncio.run(run_chat_calls_async(generator, prompts_of(["a", "b"]), max_concurrency=2))
            assert result.failures == []
        assert (generator.async_calls, generator.sync_calls) == (2, 4)

    @pytest.mark.parametrize("max_concurrency", [0, -1])
    def test_invalid_max_concurrency(self, max_concurrency):
        with pytest.raises(ValueError, match="max_concurrency"):
            run_chat_calls(MockChatGenerator(responses="x"), prompts_of(["a"]), max_concurrency=max_concurrency)

    async def test_works_inside_running_event_loop(self):
        asyncio.get_running_loop()  # this test runs inside an event loop
        texts = ["one", "two", "three"]
        result = run_chat_calls(MockChatGenerator(response_fn=echo_prompt), prompts_of(texts), max_concurrency=2)
        assert [reply.text for reply in result.replies] == [f"echo:{text}" for text in texts]

    async def test_async_form(self):
        generator = CountingAsyncGenerator()
        result = await run_chat_calls_async(generator, prompts_of(["a", "b", "c"]), max_concurrency=2)
        assert [reply.text for reply in result.replies] == ["a", "b", "c"]
        assert generator.max_in_flight == 2

    async def test_async_form_invalid_max_concurrency(self):
        with pytest.raises(ValueError, match="max_concurrency"):
            await run_chat_calls_async(MockChatGenerator(responses="x"), prompts_of(["a"]), max_concurrency=0)


class TestConcurrencySettings:
    """Default: all of a round's calls at once; a bound when set."""

    @pytest.mark.parametrize("value", [0, -1, 1.5, "4", True])
    def test_invalid_max_concurrency(self, value):
        with pytest.raises(ValueError, match="`max_concurrency`"):
            check_max_concurrency(value)

    def test_async_default_runs_every_call_at_once(self):
        k = 12
        generator = CountingAsyncGenerator()
        asyncio.run(run_chat_calls_async(generator, prompts_of([str(i) for i in range(k)])))
        assert generator.max_in_flight == k

    def test_threads_default_runs_every_call_at_once(self):
        k = 12
        generator = CountingSyncGenerator(target=k, total=k)
        run_chat_calls(generator, prompts_of([str(i) for i in range(k)]))
        assert generator.max_in_flight == k

    @pytest.mark.parametrize("component_class", [PostFusionVoter, CandidateSummarizer, SummaryVerifier, NoteTaker])
    def test_components_default_to_none_and_round_trip(self, component_class):
        default = component_class(chat_generator=MockChatGenerator(responses=["x"]))
        assert default.max_concurrency is None
        assert default.to_dict()["init_parameters"]["max_concurrency"] is None
        assert component_class.from_dict(default.to_dict()).max_concurrency is None
        bounded = component_class(chat_generator=MockChatGenerator(responses=["x"]), max_concurrency=3)
        assert component_class.from_dict(bounded.to_dict()).max_concurrency == 3

    @pytest.mark.parametrize("component_class", [PostFusionVoter, CandidateSummarizer, SummaryVerifier, NoteTaker])
    @pytest.mark.parametrize("value", [0, "4"])
    def test_components_reject_invalid_max_concurrency(self, component_class, value):
        with pytest.raises(ValueError, match="`max_concurrency`"):
            component_class(chat_generator=MockChatGenerator(responses=["x"]), max_concurrency=value)


@component
class SlowAsyncGenerator:
    """
    `run_async` fails at once for a prompt containing `fail_on` and otherwise waits `seconds`; counts the calls
    started, finished and cancelled.
    """

    def __init__(self, seconds: float = 30.0, fail_on: str = "boom") -> None:
        self.seconds = seconds
        self.fail_on = fail_on
        self.started = 0
        self.finished = 0
        self.cancelled = 0

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage]) -> dict[str, Any]:
        raise AssertionError("the async fan-out must use run_async")

    @component.output_types(replies=list[ChatMessage])
    async def run_async(self, messages: list[ChatMessage]) -> dict[str, Any]:
        self.started += 1
        if self.fail_on in (messages[-1].text or ""):
            raise RuntimeError(f"cannot answer {self.fail_on}")
        try:
            await asyncio.sleep(self.seconds)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished += 1
        return {"replies": [ChatMessage.from_assistant("slow")]}


@component
class SlowSyncGenerator:
    """
    Only a sync `run` (the worker-threads path): "boom" fails once every other call under way has started;
    the others block until `release` is set. Counts calls started and finished.
    """

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = 0
        self.finished = 0
        self._lock = threading.Lock()

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage]) -> dict[str, Any]:
        with self._lock:
            self.started += 1
        if messages[-1].text == "boom":
            raise RuntimeError("cannot answer boom")
        self.release.wait(timeout=30)
        with self._lock:
            self.finished += 1
        return {"replies": [ChatMessage.from_assistant("slow")]}


class TestCancellationOnFailure:
    @pytest.mark.parametrize(
        ("max_concurrency", "texts", "started", "cancelled"),
        [
            # "boom" fails while one call is under way (cancelled) and three wait for a turn (never started)
            (2, ["slow", "boom", "slow", "slow", "slow"], 2, 1),
            # "boom" is the last to start: the four calls under way are cancelled
            (10, ["slow", "slow", "slow", "slow", "boom"], 5, 4),
        ],
    )
    async def test_async_path_cancels_the_other_calls(self, max_concurrency, texts, started, cancelled):
        generator = SlowAsyncGenerator()
        start = time.perf_counter()
        with pytest.raises(RuntimeError, match="cannot answer boom"):
            await run_chat_calls_async(
                generator, prompts_of(texts), max_concurrency=max_concurrency, raise_on_failure=True
            )
        assert time.perf_counter() - start < 5
        assert (generator.started, generator.cancelled, generator.finished) == (started, cancelled, 0)

    def test_sync_path_starts_no_queued_call(self):
        generator = SlowSyncGenerator()
        prompts = prompts_of(["slow", "boom", "slow", "slow", "slow"])
        start = time.perf_counter()
        with pytest.raises(RuntimeError, match="cannot answer boom"):
            run_chat_calls(generator, prompts, max_concurrency=2, raise_on_failure=True)
        assert time.perf_counter() - start < 5  # the failure does not wait for the blocked call
        assert (generator.started, generator.finished) == (2, 0)
        generator.release.set()  # the call under way in its thread ends; its slot must not start a queued call
        deadline = time.monotonic() + 5
        while generator.finished < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        assert (generator.started, generator.finished) == (2, 1)

    def test_without_raise_on_failure_every_call_runs(self):
        generator = SlowAsyncGenerator(seconds=0.01)
        prompts = prompts_of(["slow", "boom", "slow"])
        result = asyncio.run(run_chat_calls_async(generator, prompts, max_concurrency=2))
        assert (generator.started, generator.finished, generator.cancelled) == (3, 2, 0)
        assert str(result.errors[1]) == "RuntimeError: cannot answer boom"

    async def test_component_run_async_cancels_the_other_calls(self):
        generator = SlowAsyncGenerator(fail_on="Passage 4.")
        voter = PostFusionVoter(chat_generator=generator, max_concurrency=5, raise_on_failure=True)
        with pytest.raises(RuntimeError, match=r"cannot answer Passage 4\."):
            await voter.run_async(query="Which passage?", documents=DOCUMENTS)
        assert (generator.started, generator.cancelled, generator.finished) == (5, 4, 0)


DOCUMENTS = [Document(content=f"Passage {i}.") for i in range(5)]
