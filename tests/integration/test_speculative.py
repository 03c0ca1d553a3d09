"""
Speculative post-fusion against the local OpenAI-compatible server with latency, through the real
`OpenAIChatGenerator`: post-fusion's calls arrive before concatenation's reply, are closed when its answer holds,
and give the sequential strategy's answers; nothing is left behind.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from haystack import Document, Pipeline
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore
from haystack.utils import Secret

from haystack_fusion.cli import main
from haystack_fusion.components.speculation import _portal
from haystack_fusion.corpus import default_squad_path
from haystack_fusion.strategies import StrategyRun, build_pipeline, run_strategy
from haystack_fusion.strategies.run import strategy_run
from haystack_fusion.testing import PromptReplies
from tests.support.openai_server import OpenAIServer, RequestRecord

K = 5
HANG_GUARD = 60.0  # seconds: far above a run's normal time


def documents() -> list[Document]:
    return [Document(content=f"Passage p{i}: the capital city is discussed here.") for i in range(K)]


def pipeline(server: OpenAIServer, speculative: bool, strategy: str = "concat_pf") -> Pipeline:
    store = InMemoryDocumentStore()
    store.write_documents(documents())
    llm = OpenAIChatGenerator(
        api_base_url=server.base_url, api_key=Secret.from_token("x"), model="test", max_retries=0, timeout=HANG_GUARD
    )
    retriever = InMemoryBM25Retriever(store, top_k=K)
    return build_pipeline(strategy, retriever=retriever, chat_generator=llm, speculative=speculative)


def concatenation(record: RequestRecord) -> bool:
    """Whether a request is concatenation's (all k passages) rather than one of post-fusion's (one passage)."""
    return slower_post_fusion(record.body) < HANG_GUARD / 4


def settled(server: OpenAIServer) -> list[RequestRecord]:
    """The server's requests once every one has ended (a hang guard, not a timing)."""
    deadline = time.monotonic() + HANG_GUARD
    while any(record.ended is None for record in server.log):
        assert time.monotonic() < deadline, "a request never ended"
        time.sleep(0.01)
    return list(server.log)


@pytest.fixture
def unsure() -> Iterator[OpenAIServer]:
    with OpenAIServer(reply=PromptReplies(concatenation_unknown=1.0), latency=0.2) as server:
        yield server


def slower_post_fusion(body: dict[str, Any]) -> float:
    """Post-fusion's calls outlast concatenation's, so an accepted answer finds them under way."""
    return 0.2 if sum(f"p{i}:" in body["messages"][-1]["content"] for i in range(K)) == K else HANG_GUARD / 4


@pytest.fixture
def sure() -> Iterator[OpenAIServer]:
    with OpenAIServer(reply=PromptReplies(concatenation_unknown=0.0), latency=slower_post_fusion) as server:
        yield server


def test_post_fusion_starts_before_concatenation_returns_and_is_not_called_again(unsure):
    run = run_strategy(pipeline(unsure, speculative=True), "Which is the capital?")
    log = settled(unsure)
    [concat] = [record for record in log if concatenation(record)]
    post_fusion = [record for record in log if not concatenation(record)]
    assert len(post_fusion) == K  # the speculative round, taken: no second one
    assert all(record.arrived < concat.ended for record in post_fusion)  # type: ignore[operator]
    assert not any(record.disconnected for record in log)
    assert run.answer.meta["stage"] == "post_fusion"
    assert (run.usage.calls, run.usage.speculative_calls, run.usage.cancelled_calls) == (K + 1, K, None)


def test_an_accepted_answer_closes_the_speculative_requests(sure):
    run = run_strategy(pipeline(sure, speculative=True), "Which is the capital?")
    log = settled(sure)
    [concat] = [record for record in log if concatenation(record)]
    post_fusion = [record for record in log if not concatenation(record)]
    assert run.answer.meta["stage"] == "concatenation"
    assert len(post_fusion) == K
    assert all(record.disconnected for record in post_fusion)
    assert all(record.arrived < concat.ended for record in post_fusion)  # type: ignore[operator]
    assert all(concat.ended <= record.ended for record in post_fusion)  # type: ignore[operator]
    usage = run.usage
    assert (usage.calls, usage.speculative_calls, usage.cancelled_calls) == (K + 1, K, K)
    assert 0 < usage.estimated_prompt_tokens < usage.prompt_tokens  # type: ignore[operator]


def test_an_accepted_answer_closes_the_speculative_requests_of_run_async(sure):
    pipe = pipeline(sure, speculative=True)

    async def ask() -> dict[str, Any]:
        outputs = await pipe.run_async({"query": "Which is the capital?"}, include_outputs_from=set(pipe.graph))
        await pipe.get_component("voter").close_async()
        return outputs

    run = strategy_run(pipe, "Which is the capital?", asyncio.run(ask()))
    post_fusion = [record for record in settled(sure) if not concatenation(record)]
    assert len(post_fusion) == K
    assert all(record.disconnected for record in post_fusion)
    assert run.usage.cancelled_calls == K


def test_an_accepted_answer_closes_the_speculative_requests_of_a_stream(sure):
    pipe = pipeline(sure, speculative=True)

    async def stream() -> tuple[list[str], dict[str, Any]]:
        handle = pipe.stream({"query": "Which is the capital?"}, include_outputs_from=set(pipe.graph))
        chunks = [chunk.content async for chunk in handle]
        await pipe.get_component("voter").close_async()
        return chunks, handle.result

    chunks, outputs = asyncio.run(stream())
    assert chunks == [strategy_run(pipe, "Which is the capital?", outputs).answer.data]
    assert all(record.disconnected for record in settled(sure) if not concatenation(record))


QUESTIONS = [f"Which is the capital of region {i}?" for i in range(8)]


def answers(runs: list[StrategyRun]) -> list[tuple[Any, ...]]:
    return [(run.answer.data, run.answer.meta.get("stage"), run.evidence.votes) for run in runs]


@pytest.mark.parametrize("strategy", ["concat_pf", "cascade"])
def test_answers_equal_the_sequential_strategys(strategy):
    with OpenAIServer(reply=PromptReplies(concatenation_unknown=0.5), latency=0.02) as server:
        sequential = [run_strategy(pipeline(server, False, strategy), question) for question in QUESTIONS]
        speculative = [run_strategy(pipeline(server, True, strategy), question) for question in QUESTIONS]

        async def run_all() -> list[StrategyRun]:
            pipe = pipeline(server, True, strategy)
            runs = []
            for question in QUESTIONS:
                outputs = await pipe.run_async({"query": question}, include_outputs_from=set(pipe.graph))
                runs.append(strategy_run(pipe, question, outputs))

            await pipe.get_component("voter").close_async()  # the async client, before its loop closes
            return runs

        speculative_async = asyncio.run(run_all())
    assert {run.answer.meta["stage"] for run in sequential} >= {"concatenation", "post_fusion"}
    assert answers(speculative) == answers(sequential) == answers(speculative_async)


def speculation_tasks() -> int:
    async def count() -> int:
        return len(asyncio.all_tasks())

    return _portal().call(count)


def test_no_thread_or_task_is_left_behind_after_100_questions():
    with OpenAIServer(reply=PromptReplies(concatenation_unknown=0.5), latency=0.01, max_requests=2000) as server:
        pipe = pipeline(server, speculative=True)
        run_strategy(pipe, QUESTIONS[0])  # starts the process's speculation thread, once
        settled(server)
        threads, tasks = threading.active_count(), speculation_tasks()
        for i in range(100):
            run_strategy(pipe, f"Which is the capital of place {i}?")
        settled(server)
        deadline = time.monotonic() + HANG_GUARD
        while speculation_tasks() > tasks:  # cancelled tasks end once their connection is closed
            assert time.monotonic() < deadline, "a speculative task was left behind"
            time.sleep(0.01)
        assert threading.active_count() <= threads  # threads of earlier tests may end meanwhile

        async def run_all() -> None:
            pipe = pipeline(server, speculative=True)
            await pipe.run_async({"query": QUESTIONS[0]})  # starts the in-memory store's executor thread, once
            threads, tasks = threading.active_count(), asyncio.all_tasks()
            for i in range(100):
                await pipe.run_async({"query": f"Which is the capital of town {i}?"})
            while asyncio.all_tasks() - tasks:  # cancelled tasks end once their connection is closed
                await asyncio.sleep(0.01)
            assert threading.active_count() <= threads  # threads of earlier tests may end meanwhile
            await pipe.get_component("voter").close_async()

        asyncio.run(asyncio.wait_for(run_all(), HANG_GUARD))


def test_the_embedded_model_warns_and_runs_sequentially(caplog):
    from haystack_fusion.backends import LocalChatGenerator

    if LocalChatGenerator is None:
        pytest.skip("the `local` extra is not installed")
    llm = LocalChatGenerator()  # not loaded: only the pipeline is built
    with caplog.at_level(logging.WARNING):
        speculative = build_pipeline("concat_pf", chat_generator=llm, speculative=True)
    assert "embedded model makes one call at a time" in caplog.text
    assert speculative.dumps() == build_pipeline("concat_pf", chat_generator=llm).dumps()


def test_ask_sends_the_speculative_calls_to_the_fallback_model_and_counts_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", "not-needed-by-a-local-server")
    store = ["--store", str(tmp_path / "index.json")]
    assert main(["index", str(default_squad_path()), *store]) == 0
    strong = OpenAIServer(reply="Rollo", model="strong", latency=HANG_GUARD / 4)

    def after_the_speculative_calls_arrived(_: dict[str, Any]) -> float:
        deadline = time.monotonic() + HANG_GUARD
        while len(strong.log) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        return 0.0

    with OpenAIServer(reply="Rollo", model="small", latency=after_the_speculative_calls_arrived) as small, strong:
        servers = ["--llm", "openai", "--model", "small", "--api-base-url", small.base_url, "--fallback-llm", "openai"]
        servers += ["--fallback-model", "strong", "--fallback-api-base-url", strong.base_url, "--top-k", "2"]
        capsys.readouterr()
        assert main(["ask", "Who was the duke?", "--json", "--speculative", *store, *servers]) == 0
        run = json.loads(capsys.readouterr().out)
        log = settled(strong)
    assert run["evidence"]["fallback"] is False  # the small model's answer held
    assert len(log) == 2
    assert all(record.disconnected for record in log)
    strong_usage = run["usage_by_model"]["strong"]
    assert strong_usage["speculative_calls"] == strong_usage["cancelled_calls"] == strong_usage["calls"] == 2
