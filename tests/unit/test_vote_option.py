"""Overlap voting through the strategies, the command line, the fingerprints and %NM."""

from haystack import Document
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.cli import build_parser
from haystack_fusion.corpus import Question
from haystack_fusion.evaluation.datasets import EvalDataset
from haystack_fusion.evaluation.passages import PassageSetting
from haystack_fusion.evaluation.runner import EvalConfig, Evaluator, score_run
from haystack_fusion.strategies import build_pipeline, run_strategy

DOCUMENTS = [Document(content=f"Passage {i} about the acid.") for i in range(3)]


def retriever() -> InMemoryBM25Retriever:
    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    return InMemoryBM25Retriever(document_store=store, top_k=3)


def fingerprint(options: dict) -> str:
    evaluator = Evaluator(
        EvalDataset("d", DOCUMENTS, []),
        EvalConfig(strategies=["post_fusion"], strategy_options=options),
        "unused",
        retriever_factory=retriever,
        generator_factory=lambda: MockChatGenerator(responses=["a"]),
    )
    return evaluator.fingerprint("post_fusion", 3, PassageSetting())


def test_overlap_voting_is_fingerprinted():
    assert fingerprint({}) == fingerprint({"vote": "exact"})
    assert fingerprint({}) != fingerprint({"vote": "overlap"})
    assert fingerprint({"vote": "overlap"}) != fingerprint({"vote": "overlap", "overlap_threshold": 0.7})


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
    question = Question(id="q", question="Which acid?", answers=("2-bromopalmitic acid",), is_impossible=False)
    evidence = {"candidates": ["2-bromopalmitic acid (2-BP)"]}
    exact = score_run(question, "x", evidence, [], {}, 0.0)
    overlap = score_run(question, "x", {**evidence, "vote": "overlap", "overlap_threshold": 0.5}, [], {}, 0.0)
    assert (exact.pool_has_gold, exact.majority_correct) == (False, False)
    assert (overlap.pool_has_gold, overlap.majority_correct) == (True, True)
