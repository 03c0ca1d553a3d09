"""
Failures are never answers: with the real OpenAIChatGenerator against the test server (`tests.support.openai_server`),
a component whose every LLM call fails raises `LLMCallsFailedError` with each call's `CallFailure`, a strategy's run
raises one with every failed call of the run, and a fallback still answers when only the first round failed. And
`run_async` under a fresh event loop per question (`asyncio.run` in a loop, a script's pattern) makes every call.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from haystack import Document
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore
from haystack.utils import Secret

from haystack_fusion import CandidateSummarizer, FusionAnswerer, NoteTaker, PostFusionVoter, SummaryVerifier
from haystack_fusion.failures import LLMCallsFailedError
from haystack_fusion.strategies import build_pipeline, run_strategy
from haystack_fusion.testing import PromptReplies

QUERY = "What is the capital of France?"
DOCUMENTS = [
    Document(content="Paris is the capital of France.", id="d0"),
    Document(content="Lyon is a large French city.", id="d1"),
    Document(content="France borders Spain.", id="d2"),
]


def down(_body: dict[str, Any]) -> str:
    raise RuntimeError("the model is down")  # the test server answers HTTP 500


def openai_llm(server: Any) -> OpenAIChatGenerator:
    return OpenAIChatGenerator(
        api_key=Secret.from_token("test-key"), api_base_url=server.base_url, model="m", max_retries=0, timeout=30
    )


@pytest.fixture
def failing(start_openai_server):
    return start_openai_server(reply=down)


def assert_every_call_failed(raised: pytest.ExceptionInfo[LLMCallsFailedError], calls: int, server: Any) -> None:
    failures = raised.value.failures
    assert len(failures) == calls == server.stats.requests
    assert {(f.kind, f.error_type, f.status) for f in failures} == {("failing", "InternalServerError", 500)}


class TestComponentsRaise:
    @pytest.mark.parametrize("asynchronous", [False, True])
    def test_post_fusion_voter(self, failing, asynchronous):
        voter = PostFusionVoter(chat_generator=openai_llm(failing))

        def run() -> Any:
            if asynchronous:
                return asyncio.run(voter.run_async(query=QUERY, documents=DOCUMENTS))
            return voter.run(query=QUERY, documents=DOCUMENTS)

        with pytest.raises(LLMCallsFailedError) as raised:
            run()
        assert_every_call_failed(raised, len(DOCUMENTS), failing)
        assert [failure.index for failure in raised.value.failures] == [0, 1, 2]  # each passage's rank
        assert str(raised.value).startswith("every LLM call of PostFusionVoter failed (3 failed calls): ")

    def test_candidate_summarizer(self, failing):
        with pytest.raises(LLMCallsFailedError) as raised:
            CandidateSummarizer(chat_generator=openai_llm(failing)).run(query=QUERY, documents=DOCUMENTS)
        assert_every_call_failed(raised, 1, failing)

    def test_summary_verifier(self, failing):
        verifier = SummaryVerifier(chat_generator=openai_llm(failing))
        with pytest.raises(LLMCallsFailedError) as raised:
            verifier.run(query=QUERY, candidates=["Paris", "Lyon"], summaries=["Paris is ...", "Lyon is ..."])
        assert_every_call_failed(raised, 2 + 2, failing)  # K validity calls, K(K-1) ranking calls

    @pytest.mark.parametrize(("mode", "calls"), [("single_call", 1), ("per_document", len(DOCUMENTS))])
    def test_note_taker(self, failing, mode, calls):
        with pytest.raises(LLMCallsFailedError) as raised:
            NoteTaker(chat_generator=openai_llm(failing), mode=mode).run(query=QUERY, documents=DOCUMENTS)
        assert_every_call_failed(raised, calls, failing)

    @pytest.mark.parametrize("strategy", ["concatenation", "post_fusion", "sure"])
    def test_fusion_answerer(self, failing, strategy):
        answerer = FusionAnswerer(strategy=strategy, chat_generator=openai_llm(failing))
        with pytest.raises(LLMCallsFailedError) as raised:
            answerer.run(query=QUERY, documents=DOCUMENTS)
        assert all(failure.status == 500 for failure in raised.value.failures)


def failed_components(raised: pytest.ExceptionInfo[LLMCallsFailedError], speculative: bool) -> list[tuple[str, Any]]:
    """Each failure's component and index; sorted when speculative (post-fusion's calls ran beside concatenation's)."""
    failed = [(failure.component, failure.index) for failure in raised.value.failures]
    return sorted(failed, key=str) if speculative else failed


@pytest.mark.parametrize("speculative", [False, True])
def test_fusion_answerer_run_async_raises_with_both_rounds_failures(failing, speculative):
    settings = {"speculative": speculative}
    answerer = FusionAnswerer(strategy="concat_pf", chat_generator=openai_llm(failing), settings=settings)
    with pytest.raises(LLMCallsFailedError) as raised:  # speculative: the voter takes the failed calls started ahead
        asyncio.run(answerer.run_async(query=QUERY, documents=DOCUMENTS))
    assert_every_call_failed(raised, 1 + len(DOCUMENTS), failing)
    assert failed_components(raised, speculative) == [("llm", None), ("voter", 0), ("voter", 1), ("voter", 2)]


def retriever() -> InMemoryBM25Retriever:
    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    return InMemoryBM25Retriever(document_store=store, top_k=len(DOCUMENTS))


class TestStrategyRuns:
    @pytest.mark.parametrize("strategy", ["concat_pf", "cascade"])
    def test_only_concatenation_failed_post_fusion_answers(self, start_openai_server, strategy):
        server = start_openai_server(reply=PromptReplies(["Paris"], concatenation_unknown=0.0, concatenation_fails=1.0))
        run = run_strategy(build_pipeline(strategy, retriever=retriever(), chat_generator=openai_llm(server)), QUERY)
        assert run.answer.data == "Paris"
        (failure,) = run.answer.meta["failures"]
        assert (failure["component"], failure["kind"], failure["status"]) == ("llm", "failing", 500)
        assert run.answer.meta["stages"][0] == {"stage": "concatenation", "answered": False, "reason": "no reply"}

    @pytest.mark.parametrize("speculative", [False, True])
    @pytest.mark.parametrize("strategy", ["concat_pf", "cascade"])
    def test_when_post_fusion_fails_too_the_run_raises_with_both_rounds_failures(self, failing, strategy, speculative):
        llm = openai_llm(failing)
        pipeline = build_pipeline(strategy, retriever=retriever(), chat_generator=llm, speculative=speculative)
        with pytest.raises(LLMCallsFailedError) as raised:
            run_strategy(pipeline, QUERY)  # speculative: the voter takes the failed calls started ahead
        assert_every_call_failed(raised, 1 + len(DOCUMENTS), failing)
        assert failed_components(raised, speculative) == [("llm", None), ("voter", 0), ("voter", 1), ("voter", 2)]
        print(f"\n{type(raised.value).__name__}: {raised.value}")  # the report quotes it

    def test_the_concatenation_strategy_s_one_failed_call(self, failing):
        pipeline = build_pipeline("concatenation", retriever=retriever(), chat_generator=openai_llm(failing))
        with pytest.raises(LLMCallsFailedError) as raised:
            run_strategy(pipeline, QUERY)
        assert_every_call_failed(raised, 1, failing)
        assert raised.value.failures[0].component == "llm"


def test_a_fresh_event_loop_per_question_makes_every_call(start_openai_server):
    """`asyncio.run` per question: the openai async client stays bound to the first loop, so on the next loops the
    calls go through the generator's `run` in worker threads; each question's every call is made and answered."""
    server = start_openai_server(reply="Paris")
    voter = PostFusionVoter(chat_generator=openai_llm(server))
    answers = []
    for question in ("What is the capital of France?", "Which city is the capital?", "Where is the government?"):
        result = asyncio.run(voter.run_async(query=question, documents=DOCUMENTS))
        answer = result["answers"][0]
        assert answer.meta["failures"] == []
        assert answer.meta["usage"]["calls"] == len(DOCUMENTS)
        answers.append(answer.data)
    assert answers == ["Paris"] * 3
    assert server.stats.requests == server.stats.first_attempts == 3 * len(DOCUMENTS)


def test_a_strategy_pipeline_on_a_fresh_event_loop_per_question(start_openai_server):
    """`Pipeline.run_async` warms its components up on each loop (`warm_up_async`) and runs them there."""
    server = start_openai_server(reply=PromptReplies(["Paris"], concatenation_unknown=1.0))
    pipeline = build_pipeline("concat_pf", retriever=retriever(), chat_generator=openai_llm(server))
    for _ in range(3):
        data = {name: {"query": QUERY} for name, sockets in pipeline.inputs().items() if "query" in sockets}
        outputs = asyncio.run(pipeline.run_async(data))
        (answer,) = [a for a in outputs["joiner"]["answers"] if a.meta.get("votes")]
        assert (answer.data, answer.meta["failures"]) == ("Paris", [])
    assert server.stats.requests == server.stats.first_attempts == 3 * (1 + len(DOCUMENTS))
