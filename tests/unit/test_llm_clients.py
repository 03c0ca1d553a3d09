"""
HTTP accounting and event loops, against a real OpenAI-compatible server on 127.0.0.1
(`tests.support.openai_server`).

The client side is the real one: Haystack's OpenAIChatGenerator pointed at the server. Assertions are on request
counts the server saw and the usage our components report, never on timings.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from haystack import Document
from haystack.components.generators.chat import MockChatGenerator, OpenAIChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.dataclasses import ChatMessage
from haystack.document_stores.in_memory import InMemoryDocumentStore
from haystack.utils import Secret

from haystack_fusion import PostFusionVoter
from haystack_fusion.llm import bind_async_client, run_chat_calls, run_chat_calls_async
from haystack_fusion.llm.clients import observe_requests
from haystack_fusion.strategies import build_pipeline, run_strategy

K = 5
QUERY = "What is the capital of France?"
DOCUMENTS = [Document(content=f"Passage {i}: Paris is the capital of France.") for i in range(K)]


def generator_for(server, max_retries: int = 2) -> OpenAIChatGenerator:
    return OpenAIChatGenerator(
        api_base_url=server.base_url, api_key=Secret.from_token("x"), model="test", max_retries=max_retries
    )


def fails_first_time():
    """A reply function that fails (HTTP 500) the first request of each prompt and answers its retry."""
    seen: set[str] = set()
    lock = threading.Lock()

    def reply(body: dict) -> str:
        prompt = body["messages"][-1]["content"]
        with lock:
            first = prompt not in seen
            seen.add(prompt)
        if first:
            raise RuntimeError("first attempt fails")
        return "Paris"

    return reply


class TestNewEventLoopPerQuestion:
    def test_costs_exactly_k_requests_per_question(self, start_openai_server):
        server = start_openai_server(latency=0.02)
        voter = PostFusionVoter(chat_generator=generator_for(server))
        for question in range(3):
            before = server.stats.requests
            result = asyncio.run(voter.run_async(query=QUERY, documents=DOCUMENTS))  # a new loop per question
            answer = result["answers"][0]
            assert server.stats.requests - before == K, f"question {question}"
            assert answer.data == "Paris"
            assert answer.meta["failures"] == []
            assert answer.meta["usage"]["calls"] == answer.meta["usage"]["http_requests"] == K
        assert server.stats.retries == server.stats.refused == 0
        assert server.stats.max_in_flight == K  # the default runs a round's k calls at once

    def test_one_loop_keeps_its_client(self, openai_server):
        llm = generator_for(openai_server)
        prompts = [[ChatMessage.from_user(f"q{i}")] for i in range(3)]

        async def two_fan_outs():
            first = await run_chat_calls_async(llm, prompts)
            client = llm.async_client
            second = await run_chat_calls_async(llm, prompts)
            return first, second, client is llm.async_client

        first, second, same_client = asyncio.run(two_fan_outs())
        assert same_client
        assert first.usage["http_requests"] == second.usage["http_requests"] == 3
        assert openai_server.stats.requests == 6

    def test_a_new_loop_gets_a_new_client_and_the_old_one_is_closed(self, openai_server):
        llm = generator_for(openai_server)
        prompts = [[ChatMessage.from_user("q")]]
        asyncio.run(run_chat_calls_async(llm, prompts))
        old = llm.async_client
        asyncio.run(run_chat_calls_async(llm, prompts))
        assert llm.async_client is not old
        assert old.is_closed()
        assert openai_server.stats.requests == 2


class TestRequestsCountRetries:
    @pytest.mark.parametrize("use_async", [False, True], ids=["run", "run_async"])
    def test_usage_counts_every_http_request(self, start_openai_server, use_async):
        server = start_openai_server(reply=fails_first_time())
        voter = PostFusionVoter(chat_generator=generator_for(server, max_retries=1))
        if use_async:
            result = asyncio.run(voter.run_async(query=QUERY, documents=DOCUMENTS))
        else:
            result = voter.run(query=QUERY, documents=DOCUMENTS)
        usage = result["answers"][0].meta["usage"]
        assert server.stats.requests == 2 * K
        assert server.stats.retries == K
        assert (usage["calls"], usage["failed_calls"], usage["http_requests"]) == (K, 0, 2 * K)

    def test_failed_calls_count_their_requests_too(self, start_openai_server):
        def always_fails(body: dict) -> str:
            raise RuntimeError("down")

        server = start_openai_server(reply=always_fails)
        result = run_chat_calls(generator_for(server, max_retries=0), [[ChatMessage.from_user("q")]] * 2)
        assert result.usage["failed_calls"] == 2
        assert result.usage["http_requests"] == server.stats.requests == 2

    def test_generators_without_http_clients_report_no_http_requests(self):
        result = run_chat_calls(MockChatGenerator(responses=["Paris"]), [[ChatMessage.from_user("q")]])
        assert "http_requests" not in result.usage
        assert not observe_requests(MockChatGenerator(), async_client=False)


class TestStrategyUsage:
    def retriever(self) -> InMemoryBM25Retriever:
        store = InMemoryDocumentStore()
        store.write_documents(DOCUMENTS)
        return InMemoryBM25Retriever(document_store=store, top_k=K)

    def test_post_fusion_reports_its_http_requests(self, openai_server):
        pipeline = build_pipeline(
            "post_fusion", retriever=self.retriever(), chat_generator=generator_for(openai_server)
        )
        usage = run_strategy(pipeline, QUERY).usage
        assert usage["calls"] == usage["http_requests"] == openai_server.stats.requests == K

    def test_a_partial_count_is_left_out(self, start_openai_server):
        # PF+Concat: post-fusion's calls are the voter's own (counted), the distiller's is a plain generator call (not)
        server = start_openai_server(reply=lambda body: "Paris")
        pipeline = build_pipeline("pf_concat", retriever=self.retriever(), chat_generator=generator_for(server))
        run = run_strategy(pipeline, QUERY)
        assert run.usage["calls"] == server.stats.requests == K + 1
        assert "http_requests" not in run.usage


class TestTwoRunningLoops:
    def test_sharing_one_generator_between_running_loops_is_refused(self, openai_server):
        llm = generator_for(openai_server)
        bound, release = threading.Event(), threading.Event()

        async def hold_a_loop():
            await bind_async_client(llm)
            bound.set()
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 10)

        thread = threading.Thread(target=asyncio.run, args=(hold_a_loop(),))
        thread.start()
        try:
            assert bound.wait(10)
            with pytest.raises(RuntimeError, match="another running event loop"):
                asyncio.run(bind_async_client(llm))
        finally:
            release.set()
            thread.join(10)
        asyncio.run(bind_async_client(llm))  # that loop has finished: a client for this one
