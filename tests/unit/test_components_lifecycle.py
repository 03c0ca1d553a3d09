"""The components' async lifecycle (`warm_up_async`, `close_async`), passed on to their chat generators."""

from typing import Any

from haystack import Document, Pipeline, component
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage

from haystack_fusion.components.candidate_summarizer import CandidateSummarizer
from haystack_fusion.components.note_taker import NoteTaker
from haystack_fusion.components.post_fusion_voter import PostFusionVoter
from haystack_fusion.components.summary_verifier import SummaryVerifier

DOCUMENTS = [Document(content=f"Passage {i}.") for i in range(5)]


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
