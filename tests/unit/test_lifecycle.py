"""
The components' async lifecycle (`warm_up_async`, `close_async`) and the fan-out's cancellation when
`raise_on_failure` fires: calls waiting for their turn never start, `run_async` calls under way are cancelled.
"""

import asyncio
import threading
import time
from typing import Any

import pytest
from haystack import Document, Pipeline, component
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage

from haystack_fusion.components.candidate_summarizer import CandidateSummarizer
from haystack_fusion.components.note_taker import NoteTaker
from haystack_fusion.components.post_fusion_voter import PostFusionVoter
from haystack_fusion.components.summary_verifier import SummaryVerifier
from haystack_fusion.llm import run_chat_calls, run_chat_calls_async
from tests.unit.scripted_calls import prompts_of

DOCUMENTS = [Document(content=f"Passage {i}.") for i in range(5)]


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


@component
class LifecycleGenerator:
    """Records which lifecycle methods were called; `asynchronous=False` gives it only the sync ones."""

    def __init__(self, asynchronous: bool = True) -> None:
        self.calls: list[str] = []
        if asynchronous:
            self.warm_up_async = self._warm_up_async
            self.close_async = self._close_async

    def warm_up(self) -> None:
        self.calls.append("warm_up")

    async def _warm_up_async(self) -> None:
        self.calls.append("warm_up_async")

    def close(self) -> None:
        self.calls.append("close")

    async def _close_async(self) -> None:
        self.calls.append("close_async")

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage]) -> dict[str, Any]:
        return {"replies": [ChatMessage.from_assistant("Paris")]}


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
        assert result.errors[1] == "RuntimeError: cannot answer boom"

    async def test_component_run_async_cancels_the_other_calls(self):
        generator = SlowAsyncGenerator(fail_on="Passage 4.")
        voter = PostFusionVoter(chat_generator=generator, max_concurrency=5, raise_on_failure=True)
        with pytest.raises(RuntimeError, match=r"cannot answer Passage 4\."):
            await voter.run_async(query="Which passage?", documents=DOCUMENTS)
        assert (generator.started, generator.cancelled, generator.finished) == (5, 4, 0)


def components_with(generator: Any) -> list[Any]:
    return [
        PostFusionVoter(chat_generator=generator),
        CandidateSummarizer(chat_generator=generator),
        SummaryVerifier(chat_generator=generator),
        NoteTaker(chat_generator=generator),
    ]


class TestAsyncLifecycle:
    async def test_async_methods_are_preferred(self):
        for wrapper in components_with(generator := LifecycleGenerator()):
            await wrapper.warm_up_async()
            await wrapper.close_async()
        assert generator.calls == ["warm_up_async", "close_async"] * 4

    async def test_sync_methods_are_the_fallback(self):
        for wrapper in components_with(generator := LifecycleGenerator(asynchronous=False)):
            await wrapper.warm_up_async()
            await wrapper.close_async()
            wrapper.warm_up()
            wrapper.close()
        assert generator.calls == ["warm_up", "close"] * 8

    async def test_a_generator_without_lifecycle_methods(self):
        for wrapper in components_with(MockChatGenerator(responses="x")):
            await wrapper.warm_up_async()  # MockChatGenerator has only a sync warm_up
            await wrapper.close_async()  # and no close at all

    async def test_summary_verifier_includes_its_ranker(self):
        generator, ranker = LifecycleGenerator(), LifecycleGenerator(asynchronous=False)
        verifier = SummaryVerifier(chat_generator=generator, document_ranker=ranker)
        await verifier.warm_up_async()
        await verifier.close_async()
        verifier.warm_up()
        verifier.close()
        assert generator.calls == ["warm_up_async", "close_async", "warm_up", "close"]
        assert ranker.calls == ["warm_up", "close", "warm_up", "close"]

    async def test_pipeline_run_async_warms_up_and_closes_through_them(self):
        generator = LifecycleGenerator()
        pipeline = Pipeline()
        pipeline.add_component("voter", PostFusionVoter(chat_generator=generator))
        result = await pipeline.run_async({"voter": {"query": "Capital of France?", "documents": DOCUMENTS[:2]}})
        assert result["voter"]["answers"][0].data == "Paris"
        await pipeline.close_async()
        assert generator.calls == ["warm_up_async", "close_async"]
