"""`Pipeline.stream()` on the embedded llama.cpp model over BM25 on the real SQuAD 2.0 dev subset: the answer's chunks
arrive from the model as it generates, and the handle's result is the result of `run`."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from haystack import Pipeline
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever

from haystack_fusion import FusionAnswerer
from haystack_fusion.strategies import build_pipeline

from .conftest import TOP_K


async def stream(pipe: Pipeline, data: dict[str, Any]) -> tuple[list, dict[str, Any]]:
    handle = pipe.stream(data)
    chunks = [chunk async for chunk in handle]
    return chunks, handle.result


def test_the_strategy_pipeline_streams_the_embedded_model(store, llm, questions):
    pipe = build_pipeline("concatenation", retriever=InMemoryBM25Retriever(store, top_k=TOP_K), chat_generator=llm)
    question = questions[0].question
    chunks, result = asyncio.run(stream(pipe, {"query": question}))
    assert len(chunks) > 1
    assert {chunk.component_info.name for chunk in chunks} == {"llm"}
    reply = result["answer_builder"]["answers"][0]
    assert reply.data == pipe.run({"query": question})["answer_builder"]["answers"][0].data
    assert reply.data.strip() in "".join(chunk.content for chunk in chunks)


@pytest.mark.parametrize("strategy", ["concatenation", "concat_pf", "chain_of_note"])
def test_fusion_answerer_after_a_retriever_streams_the_answer(store, llm, questions, strategy):
    pipe = Pipeline()
    pipe.add_component("retriever", InMemoryBM25Retriever(store, top_k=TOP_K))
    pipe.add_component("answerer", FusionAnswerer(strategy=strategy, chat_generator=llm))
    pipe.connect("retriever.documents", "answerer.documents")
    question = questions[0].question

    def data() -> dict[str, Any]:  # `Pipeline.stream()` adds its forwarder to the dicts it is given
        return {"retriever": {"query": question}, "answerer": {"query": question}}

    chunks, result = asyncio.run(stream(pipe, data()))
    streamed = result["answerer"]["answers"][0]
    assert streamed.data == pipe.run(data())["answerer"]["answers"][0].data
    assert streamed.meta["usage"]["completion_tokens"] > 0  # a streamed call reports its usage too
    joined = "".join(chunk.content for chunk in chunks)
    assert joined.strip() == streamed.data or joined.endswith(f"\n\nAnswer: {streamed.data}")
