"""Overlap voting through the strategies, the command line, the fingerprints and %NM (issue 16, item 3)."""

from haystack import Document
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.cli import build_parser
from haystack_fusion.evaluation.datasets import EvalQuestion
from haystack_fusion.evaluation.runner import score_run
from haystack_fusion.strategies import build_pipeline, run_strategy
from tests.run_settings import run_settings

DOCUMENTS = [Document(content=f"Passage {i} about the acid.") for i in range(3)]


def retriever() -> InMemoryBM25Retriever:
    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    return InMemoryBM25Retriever(document_store=store, top_k=3)


def settings(options: dict):
    return run_settings("post_fusion", options)


def test_overlap_is_fingerprinted_exact_is_not():
    assert "vote" not in settings({}).options
    assert "vote" not in settings({"vote": "exact"}).options
    assert settings({"vote": "overlap"}).options["vote"] == "overlap"
    assert settings({}).fingerprint() == settings({"vote": "exact"}).fingerprint()
    assert settings({}).fingerprint() != settings({"vote": "overlap"}).fingerprint()


def test_command_line():
    args = build_parser().parse_args(["eval", "--dataset", "d", "--out", "o", "--vote", "overlap"])
    assert (args.vote, args.overlap_threshold) == ("overlap", 0.5)
    assert build_parser().parse_args(["ask", "Who?"]).vote == "exact"


def test_strategy_votes_by_overlap_and_records_it():
    replies = ["2-bromopalmitic acid (2-BP)", "2BP", "2-bromopalmitic acid"]
    llm = MockChatGenerator(responses=replies)
    pipe = build_pipeline("post_fusion", retriever=retriever(), chat_generator=llm, max_concurrency=1, vote="overlap")
    run = run_strategy("post_fusion", pipe, "Which acid?")
    assert run.answer.data == "2-bromopalmitic acid (2-BP)"
    assert run.evidence["vote"] == "overlap"
    assert run.evidence["overlap_threshold"] == 0.5


def test_pool_has_gold_reads_the_voters_rule():
    question = EvalQuestion(id="q", question="Which acid?", answers=("2-bromopalmitic acid",), is_impossible=False)
    evidence = {"candidates": ["2-bromopalmitic acid (2-BP)"]}
    exact = score_run(question, "x", evidence, [], {}, 0.0)
    overlap = score_run(question, "x", {**evidence, "vote": "overlap", "overlap_threshold": 0.5}, [], {}, 0.0)
    assert (exact.pool_has_gold, exact.majority_correct) == (False, False)
    assert (overlap.pool_has_gold, overlap.majority_correct) == (True, True)
