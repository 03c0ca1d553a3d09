"""Streaming the answer: `Pipeline.stream()` and `streaming_callback` over every strategy, the components that stream
(UnknownRouter, NoteTaker, FusionAnswerer) and the fan-out's callback plumbing."""

import asyncio
import re
import threading
from typing import Any

import pytest
from haystack import Document, Pipeline, component
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.generators.utils import print_streaming_chunk
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.dataclasses import ChatMessage, ComponentInfo, StreamingChunk
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion import FusionAnswerer, NoteTaker, UnknownRouter
from haystack_fusion.llm import emit_chunk, run_chat_calls, run_chat_calls_async, threaded_callback
from haystack_fusion.strategies import STRATEGIES, build_pipeline
from haystack_fusion.testing import PromptAwareChatGenerator, PromptReplies, ScriptedChatGenerator

QUERY = "What is the capital of France?"
DOCUMENTS = [
    Document(id="paris", content="Paris is the capital of France."),
    Document(id="lyon", content="Lyon is a city in France."),
    Document(id="rome", content="Rome is the capital of Italy."),
]
TOKEN_STREAMED = {  # strategy -> the component whose call writes the answer, streamed token by token
    "concatenation": "llm",
    "pruning": "llm",
    "summary_cot": "llm",
    "base": "llm",
    "pf_concat": "llm",
    "sure_sum_all": "llm",
    "mcq": "llm",
    "generic_summary": "llm",
    "chain_of_note": "note_taker",
    "chain_of_note_per_document": "note_taker",
}
ONE_CHUNK = {"concat_pf": "router", "cascade": "router"}  # concatenation's accepted answer, as one chunk
NOT_STREAMED = {"post_fusion", "sure", "sure_rank_only"}  # the last round is many calls


def test_every_strategy_is_classified():
    assert set(STRATEGIES) == set(TOKEN_STREAMED) | set(ONE_CHUNK) | NOT_STREAMED


def pieces(text: str) -> list[str]:
    return re.findall(r"\s*\S+\s*", text) or [text]


@component
class StreamingPromptAware(PromptAwareChatGenerator):
    """`PromptAwareChatGenerator` that streams its reply word by word, as a ChatGenerator with streaming does."""

    @component.output_types(replies=list[ChatMessage])
    def run(
        self, messages: list[ChatMessage], generation_kwargs: dict[str, Any] | None = None, streaming_callback=None
    ) -> dict[str, Any]:
        result = self._answer(messages, generation_kwargs)
        for piece in pieces(result["replies"][0].text) if streaming_callback else ():
            streaming_callback(StreamingChunk(content=piece, component_info=ComponentInfo.from_component(self)))
        return result

    @component.output_types(replies=list[ChatMessage])
    async def run_async(
        self, messages: list[ChatMessage], generation_kwargs: dict[str, Any] | None = None, streaming_callback=None
    ) -> dict[str, Any]:
        result = self._answer(messages, generation_kwargs)
        for piece in pieces(result["replies"][0].text) if streaming_callback else ():
            await emit_chunk(
                streaming_callback, StreamingChunk(content=piece, component_info=ComponentInfo.from_component(self))
            )
        return result


def llm() -> StreamingPromptAware:
    return StreamingPromptAware(PromptReplies(["Paris"], concatenation_unknown=0.0))


async def stream(pipe: Pipeline, data: dict[str, Any]) -> tuple[list[StreamingChunk], dict[str, Any]]:
    handle = pipe.stream(data)
    chunks = [chunk async for chunk in handle]
    return chunks, handle.result


def answers_of(result: dict[str, Any], name: str) -> list[tuple[str, list[str]]]:
    return [(answer.data, [d.id for d in answer.documents or []]) for answer in result[name]["answers"]]


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_pipeline_stream_of_every_strategy_yields_the_answer_and_the_run_result(strategy):
    pipe = build_pipeline(strategy, chat_generator=llm())
    data = {"query": QUERY, "documents": DOCUMENTS}
    chunks, result = asyncio.run(stream(pipe, data))
    name = STRATEGIES[strategy].answer_component
    assert answers_of(result, name) == answers_of(build_pipeline(strategy, chat_generator=llm()).run(data), name)
    answer = result[name]["answers"][0].data
    joined = "".join(chunk.content for chunk in chunks)
    if strategy in NOT_STREAMED:
        assert chunks == []
    elif strategy in ONE_CHUNK:
        assert [chunk.content for chunk in chunks] == [answer] == ["Paris"]
        assert chunks[0].component_info.name == ONE_CHUNK[strategy]
    else:
        assert {chunk.component_info.name for chunk in chunks} <= {TOKEN_STREAMED[strategy], None}
        assert len(chunks) >= 1
        assert answer
        assert answer in joined


def test_a_fallback_streams_nothing_from_the_router():
    pipe = build_pipeline("concat_pf", chat_generator=StreamingPromptAware(PromptReplies(concatenation_unknown=1.0)))
    chunks, result = asyncio.run(stream(pipe, {"query": QUERY, "documents": DOCUMENTS}))
    assert chunks == []
    assert result["joiner"]["answers"][0].meta["strategy"].startswith("post_fusion")


def answerer_pipeline(strategy: str, **settings: Any) -> Pipeline:
    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    pipe = Pipeline()
    pipe.add_component("retriever", InMemoryBM25Retriever(document_store=store, top_k=3))
    pipe.add_component("answerer", FusionAnswerer(strategy=strategy, chat_generator=llm(), **settings))
    pipe.connect("retriever.documents", "answerer.documents")
    return pipe


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_fusion_answerer_streams_every_strategy_answer(strategy):
    def data() -> dict[str, Any]:  # `Pipeline.stream()` adds its forwarder to the dicts it is given
        return {"retriever": {"query": QUERY}, "answerer": {"query": QUERY}}

    chunks, result = asyncio.run(stream(answerer_pipeline(strategy), data()))
    assert answers_of(result, "answerer") == answers_of(answerer_pipeline(strategy).run(data()), "answerer")
    answer = result["answerer"]["answers"][0].data
    joined = "".join(chunk.content for chunk in chunks)
    if strategy in NOT_STREAMED:  # the final answer as one chunk, once the run ends
        assert [(chunk.content, chunk.component_info.name) for chunk in chunks] == [(answer, "answerer")]
    else:  # the stream ends with the answer
        assert joined.strip() == answer or joined.endswith(f"\n\nAnswer: {answer}")


def test_fusion_answerer_run_takes_a_sync_callback_and_refuses_an_async_one():
    got: list[str] = []
    answerer = FusionAnswerer(strategy="sure", chat_generator=llm(), streaming_callback=lambda c: got.append(c.content))
    answer = answerer.run(query=QUERY, documents=DOCUMENTS)["answers"][0].data
    assert got == [answer]
    runtime: list[str] = []
    answerer.run(query=QUERY, documents=DOCUMENTS, streaming_callback=lambda c: runtime.append(c.content))
    assert runtime == [answer]
    assert got == [answer]

    async def async_callback(chunk: StreamingChunk) -> None:
        pass

    with pytest.raises(ValueError, match="cannot be a coroutine"):
        answerer.run(query=QUERY, documents=DOCUMENTS, streaming_callback=async_callback)


def test_fusion_answerer_run_async_takes_both_kinds_of_callback():
    answerer = FusionAnswerer(strategy="concatenation", chat_generator=llm())
    sync_chunks: list[str] = []
    async_chunks: list[str] = []

    async def collect(chunk: StreamingChunk) -> None:
        async_chunks.append(chunk.content)

    async def main() -> None:
        await answerer.run_async(query=QUERY, documents=DOCUMENTS, streaming_callback=sync_chunks.append)
        await answerer.run_async(query=QUERY, documents=DOCUMENTS, streaming_callback=collect)

    asyncio.run(main())
    assert "".join(c.content for c in sync_chunks) == "".join(async_chunks) == "Paris"


def test_fusion_answerer_serializes_its_streaming_callback():
    answerer = FusionAnswerer(
        strategy="concat_pf", chat_generator=MockChatGenerator(), streaming_callback=print_streaming_chunk
    )
    data = answerer.to_dict()
    assert data["init_parameters"]["streaming_callback"] == "haystack.components.generators.utils.print_streaming_chunk"
    assert FusionAnswerer.from_dict(data).streaming_callback is print_streaming_chunk


class TestUnknownRouterStreaming:
    def test_a_known_answer_is_one_chunk(self):
        got: list[StreamingChunk] = []
        router = UnknownRouter(streaming_callback=got.append)
        router.run(replies=[ChatMessage.from_assistant("Paris\nbecause")], query=QUERY)
        assert [(c.content, c.start, c.finish_reason) for c in got] == [("Paris", True, "stop")]

    def test_an_unknown_answer_streams_nothing(self):
        got: list[StreamingChunk] = []
        output = UnknownRouter().run(replies=[ChatMessage.from_assistant("unknown")], streaming_callback=got.append)
        assert "unknown" in output
        assert got == []

    def test_run_async_awaits_an_async_callback_and_run_refuses_it(self):
        got: list[str] = []

        async def collect(chunk: StreamingChunk) -> None:
            got.append(chunk.content)

        router = UnknownRouter(streaming_callback=collect)
        asyncio.run(router.run_async(replies=[ChatMessage.from_assistant("Paris")]))
        assert got == ["Paris"]
        with pytest.raises(ValueError, match="cannot be a coroutine"):
            router.run(replies=[ChatMessage.from_assistant("Paris")])

    def test_the_callback_round_trips(self):
        router = UnknownRouter(streaming_callback=print_streaming_chunk)
        assert UnknownRouter.from_dict(router.to_dict()).streaming_callback is print_streaming_chunk


class TestNoteTakerStreaming:
    @pytest.mark.parametrize("mode", ["single_call", "per_document"])
    def test_streams_the_call_that_writes_the_answer(self, mode):
        got: list[str] = []
        taker = NoteTaker(chat_generator=llm(), mode=mode, streaming_callback=lambda c: got.append(c.content))
        answer = taker.run(query=QUERY, documents=DOCUMENTS)["answers"][0].data
        joined = "".join(got)
        assert answer == "Paris"
        assert "Paris" in joined
        if mode == "per_document":  # only the synthesis call, not the k note calls
            assert "Relevance" not in joined


class TestFanOutCallbacks:
    def test_a_generator_without_a_callback_parameter_is_called_without_one(self):
        got: list[StreamingChunk] = []
        result = run_chat_calls(
            ScriptedChatGenerator("Paris"), [[ChatMessage.from_user("q")]], streaming_callback=got.append
        )
        assert result.replies[0].text == "Paris"
        assert got == []

    def test_an_async_callback_reaches_a_generator_that_runs_in_a_thread(self):
        got: list[tuple[str, bool]] = []
        loop_thread: list[int] = []

        async def collect(chunk: StreamingChunk) -> None:
            got.append((chunk.content, threading.get_ident() == loop_thread[0]))

        generator = MockChatGenerator(responses=["Paris is big"])  # `run_async` exists: remove it for the thread path

        @component
        class SyncOnly:
            @component.output_types(replies=list[ChatMessage])
            def run(self, messages: list[ChatMessage], streaming_callback=None) -> dict[str, Any]:
                return generator.run(messages=messages, streaming_callback=streaming_callback)

        async def main() -> None:
            loop_thread.append(threading.get_ident())
            await run_chat_calls_async(SyncOnly(), [[ChatMessage.from_user("q")]], streaming_callback=collect)

        asyncio.run(main())
        assert "".join(text for text, _ in got) == "Paris is big"
        assert all(on_loop for _, on_loop in got)  # the coroutine ran on the loop, the call in a worker thread

    def test_threaded_callback_keeps_a_sync_callback(self):
        def callback(chunk: StreamingChunk) -> None:
            pass

        assert threaded_callback(callback, asyncio.new_event_loop()) is callback
