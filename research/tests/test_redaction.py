"""`research.redaction`: dataset text cut out of run records before they are committed, scores kept."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from haystack import Document
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.corpus import Question
from haystack_fusion.evaluation.datasets import EvalDataset
from haystack_fusion.evaluation.metrics import QuestionScore
from haystack_fusion.evaluation.records import RESULTS_FILE, QuestionRecord, read_records
from haystack_fusion.evaluation.runner import EvalConfig, Evaluator, rescore
from research.redaction import DatasetText, redact_records

LONG = "Paris is the capital and the largest city of France by far."
COPIED = "Paris is the capital and the largest city of"
DOCUMENTS = [
    Document(content="Paris is the capital of France.", id="paris"),
    Document(content="Berlin is the capital of Germany.", id="berlin"),
    Document(content=LONG, id="long"),
]
QUESTIONS = [
    Question("q1", "What is the capital of France?", ("Paris",), False, "paris"),
    Question("q2", "What is the capital of Germany?", ("Berlin",), False, "berlin"),
]


def copied_run(tmp_path: Path, strategy: str) -> EvalDataset:
    """A run of `strategy` whose model copies 9 words of a passage into every reply, redacted afterwards."""
    dataset = EvalDataset("long", DOCUMENTS, QUESTIONS)
    store = InMemoryDocumentStore()
    store.write_documents(dataset.documents)
    Evaluator(
        dataset,
        EvalConfig(strategies=[strategy], top_ks=[2]),
        tmp_path,
        retriever_factory=lambda: InMemoryBM25Retriever(document_store=store),
        generator_factory=lambda: MockChatGenerator(responses=COPIED),
    ).run()
    assert redact_records(tmp_path / RESULTS_FILE, DatasetText.of(dataset)) == len(QUESTIONS)
    return dataset


def test_copied_dataset_text_is_cut_out_and_the_score_kept(tmp_path):
    text = DatasetText([LONG])
    assert text.redact("Paris") == ("Paris", False)
    redacted, cut = text.redact("It says: Paris is the capital and the largest city of France, so Paris")
    assert cut
    assert redacted == "It says: [10 words of the dataset] so Paris"
    dataset = copied_run(tmp_path, "concatenation")
    records = read_records(tmp_path / RESULTS_FILE)
    assert all(r.redacted and "Paris is the capital" not in r.prediction for r in records)
    assert rescore(records, dataset) == records


def test_near_copies_are_cut_out_too():
    """Case, punctuation and articles do not hide a copy: SQuAD-normalized text (vote keys) is cut as well."""
    text = DatasetText(["The river otters were moved into the Lake-Shore reserve of their keepers, see Old Harbour."])
    for near in (
        "the river otters were moved into the Lakeshore reserve of their keepers",  # case, hyphen
        "river otters were moved into lakeshore reserve of their keepers",  # SQuAD normalization
        "The river otters - were moved into the Lake-Shore reserve of their keepers!",  # punctuation-only word
    ):
        redacted, cut = text.redact(near)
        assert cut, near
        assert redacted.startswith("["), redacted
        assert redacted.endswith("words of the dataset]"), redacted
    kept = "The river otters were moved into a reserve"
    assert text.redact(kept) == (kept, False)
    assert text.redact("the " * 9) == ("the " * 9, False)


def test_model_text_in_the_evidence_is_cut_out_too(tmp_path):
    """Post-fusion's candidates (its per-passage answers) are model text like the prediction: same redaction."""
    text = DatasetText([LONG])
    evidence = {"candidates": ["Paris", COPIED], "votes": {"paris": 1}}
    redacted, cut = text.redact_value(evidence)
    assert cut
    assert redacted == {"candidates": ["Paris", "[9 words of the dataset]"], "votes": {"paris": 1}}
    other = "is the capital and the largest city of France"
    votes, cut = text.redact_value({"votes": {COPIED: 2, other: 1, "paris": 1}})
    assert cut
    assert votes == {"votes": {"[9 words of the dataset]": 2, "[9 words of the dataset] (2)": 1, "paris": 1}}
    assert text.redact_value({"passages": ["1c6071d9"], "k": 5, "x": None}) == (
        {"passages": ["1c6071d9"], "k": 5, "x": None},
        False,
    )
    copied_run(tmp_path, "post_fusion")
    assert "Paris is the capital" not in (tmp_path / RESULTS_FILE).read_text(encoding="utf-8")


def test_records_are_redacted_in_place_and_keep_their_scores(tmp_path):
    text = DatasetText([LONG])
    score = QuestionScore("q1", True, 1.0, 1.0, 1.0, False, True, True, True, 10, 2, 5, 1.0)
    copier = QuestionRecord("post_fusion", 5, "retrieved", "q1", True, "Paris", {"candidates": [COPIED]}, [], score)
    clean = dataclasses.replace(copier, question_id="q2", evidence={"candidates": ["Paris"]})
    failed = dataclasses.replace(copier, question_id="q3", error="1 of 5 LLM calls failed: timeout")
    path = tmp_path / RESULTS_FILE
    lines = [copier.to_json(), clean.to_json(), failed.to_json(), '{"torn": ']
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert redact_records(path, text) == 2
    after = path.read_text(encoding="utf-8").splitlines()
    assert after[1] == lines[1]
    assert after[3] == lines[3]
    first, second = read_records(path)
    assert first.evidence == {"candidates": ["[9 words of the dataset]"]}
    assert first.redacted
    assert first.prediction == "Paris"
    assert first.score == score
    assert second == clean
    assert redact_records(path, text) == 0
