"""
Answers that are not answers (issue 16): replies cut by the token cap in the usage, the per-question outcome flags
(empty, invalid, truncated, unknown) and their counts per run, records made before the flags existed, and the
demonstration-copy rate of the report.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from haystack import Document
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.dataclasses import ChatMessage
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.corpus import Question
from haystack_fusion.evaluation.datasets import EvalDataset
from haystack_fusion.evaluation.metrics import QuestionScore, outcome_counts, with_answer_outcome
from haystack_fusion.evaluation.records import QuestionRecord
from haystack_fusion.evaluation.report import (
    SUMMARY_FILE,
    TABLE_FILE,
    answer_outcomes,
    demonstration_answers,
    outcome_records,
    summarize_runs,
    write_report,
)
from haystack_fusion.evaluation.runner import EvalConfig, Evaluator
from haystack_fusion.llm import reply_truncated, reply_usage, run_chat_calls, sum_usage
from haystack_fusion.prompts import PROMPTS
from haystack_fusion.strategies import build_pipeline, run_strategy
from haystack_fusion.validation import DEMONSTRATION, PASSAGE_MARKUP, invalid_meta

DOCUMENTS = [
    Document(content="Paris is the capital of France.", id="paris"),
    Document(content="Berlin is the capital of Germany.", id="berlin"),
    Document(content="Madrid is the capital of Spain.", id="madrid"),
]
QUESTIONS = [
    Question("q1", "What is the capital of France?", ("Paris",), False, "paris"),
    Question("q2", "What is the capital of Germany?", ("Berlin",), False, "berlin"),
    Question("q3", "What is the capital of Mars?", (), True, None),
]
DATASET = EvalDataset(name="capitals", documents=DOCUMENTS, questions=QUESTIONS)
DEMO = PROMPTS["figure7"].demonstrations[-1]
"""A demonstration answer of Figure 7's prompt (the concatenation strategy's), which no passage above holds."""


def cut(text: str) -> ChatMessage:
    """A reply the token cap cut."""
    return ChatMessage.from_assistant(text, meta={"finish_reason": "length", "usage": {"completion_tokens": 4}})


def score(**changes) -> QuestionScore:
    fields = {
        "id": "q",
        "answerable": True,
        "em": 1.0,
        "f1": 1.0,
        "accuracy": 1.0,
        "unknown": False,
        "pool_has_gold": None,
        "majority_correct": None,
        "retrieval_hit": None,
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "calls": 1,
        "seconds": 0.5,
    }
    return QuestionScore(**{**fields, **changes})


def record(strategy: str, prediction: str, evidence: dict | None = None, **score_changes) -> QuestionRecord:
    return QuestionRecord(
        strategy=strategy,
        top_k=5,
        setting="retrieved",
        question_id=score_changes.get("id", "q"),
        answerable=score_changes.get("answerable", True),
        prediction=prediction,
        evidence=evidence or {},
        passages=[],
        score=score(**score_changes),
    )


class TestTruncatedUsage:
    def test_a_reply_cut_by_the_cap_counts_one(self):
        assert reply_truncated(cut("Par"))
        assert reply_usage(cut("Par"))["truncated"] == 1

    @pytest.mark.parametrize(
        "reply",
        [
            ChatMessage.from_assistant("Paris", meta={"finish_reason": "stop"}),
            ChatMessage.from_assistant("Paris"),
            ChatMessage.from_assistant("Paris", meta={"finish_reason": None}),  # ollama-haystack's mapped "length"
            None,
        ],
    )
    def test_other_replies_have_no_count(self, reply):
        assert not reply_truncated(reply)
        assert "truncated" not in reply_usage(reply)

    def test_a_raw_ollama_done_reason_counts(self):
        assert reply_usage(ChatMessage.from_assistant("Par", meta={"done_reason": "length"}))["truncated"] == 1

    def test_sums_count_the_cut_calls(self):
        assert sum_usage([reply_usage(cut("a")), reply_usage(None), reply_usage(cut("b"))])["truncated"] == 2
        assert "truncated" not in sum_usage([reply_usage(ChatMessage.from_assistant("a"))])

    def test_a_fan_out_counts_its_cut_calls(self):
        generator = MockChatGenerator(responses=[cut("a"), ChatMessage.from_assistant("b"), cut("c")])
        prompts = [[ChatMessage.from_user(text)] for text in ("x", "y", "z")]
        result = run_chat_calls(generator, prompts, max_concurrency=1)
        assert result.usage["truncated"] == 2
        assert result.usage["calls"] == 3

    def test_a_strategy_counts_it_and_its_answer_keeps_the_finish_reason(self):
        store = InMemoryDocumentStore()
        store.write_documents(DOCUMENTS)
        pipeline = build_pipeline(
            "concatenation",
            retriever=InMemoryBM25Retriever(store, top_k=2),
            chat_generator=MockChatGenerator(responses=cut("Paris")),
        )
        run = run_strategy("concatenation", pipeline, "What is the capital of France?")
        assert run.usage["truncated"] == 1
        assert run.answer.meta["finish_reason"] == "length"  # the answer builder passes the reply's meta on


class TestWithAnswerOutcome:
    def test_an_old_record_scores_as_it_did(self):
        old = score()
        assert with_answer_outcome(old, "Paris", {"usage": {"calls": 1}}) == old

    def test_a_blank_abstention_is_empty_and_unknown(self):
        got = with_answer_outcome(score(em=0.0, f1=0.0, accuracy=0.0, unknown=True), "  ", {})
        assert (got.empty, got.unknown, got.invalid, got.truncated) == (True, True, False, False)

    def test_an_invalid_answer_is_not_unknown_and_scores_zero(self):
        # An empty prediction matches a gold answer that normalizes to "" ("The"): a rejected one must not.
        before = score(em=1.0, f1=1.0, accuracy=1.0, unknown=True)
        got = with_answer_outcome(before, "", invalid_meta(DEMO, DEMONSTRATION))
        assert (got.invalid, got.empty, got.unknown) == (True, True, False)
        assert (got.em, got.f1, got.accuracy) == (0.0, 0.0, 0.0)

    @pytest.mark.parametrize(
        ("evidence", "usage", "truncated", "calls"),
        [
            ({"finish_reason": "length"}, None, True, 0),  # the answer's own reply was cut
            ({"finish_reason": "stop", "usage": {"truncated": 2}}, None, False, 2),  # others were, not the answer's
            ({"usage": {"truncated": 1}}, None, True, 1),  # no one reply: any cut call
            ({"usage": {"truncated": 1}}, {"truncated": 3}, True, 3),  # a run's usage and the record's: the larger
            ({}, {"calls": 4}, False, 0),
        ],
    )
    def test_truncation(self, evidence, usage, truncated, calls):
        got = with_answer_outcome(score(), "Paris", evidence, usage)
        assert (got.truncated, got.truncated_calls) == (truncated, calls)

    def test_applying_it_twice_changes_nothing(self):
        evidence = {**invalid_meta("<passage", PASSAGE_MARKUP), "usage": {"truncated": 1}}
        once = with_answer_outcome(score(unknown=True), "", evidence)
        assert with_answer_outcome(once, "", evidence) == once

    def test_an_answer_cannot_be_invalid_and_unknown(self):
        with pytest.raises(ValueError, match="invalid answer is not an abstention"):
            score(invalid=True, unknown=True)
        with pytest.raises(ValueError, match="truncated_calls"):
            score(truncated_calls=-1)


class TestOutcomeCounts:
    def test_hand_computed(self):
        scores = [
            score(id="answered"),
            score(id="answered-cut", truncated=True, truncated_calls=2),
            score(id="unknown", unknown=True),
            score(id="blank", unknown=True, empty=True, truncated_calls=1),
            score(id="invalid", empty=True, invalid=True, answerable=False),
        ]
        assert outcome_counts(scores) == {
            "answered_count": 2,
            "unknown_count": 2,
            "empty_count": 2,
            "invalid_count": 1,
            "truncated_count": 1,
            "truncated_calls": 3,
        }


OLD_LINE = {
    "strategy": "concatenation",
    "top_k": 5,
    "setting": "retrieved",
    "question_id": "q3",
    "answerable": False,
    "prediction": "",
    "evidence": {"votes": None, "candidates": None, "usage": {"prompt_tokens": 9, "completion_tokens": 0, "calls": 1}},
    "passages": [],
    "score": {
        "id": "q3",
        "answerable": False,
        "em": 0.0,
        "f1": 0.0,
        "accuracy": 0.0,
        "unknown": True,
        "pool_has_gold": None,
        "majority_correct": None,
        "retrieval_hit": None,
        "prompt_tokens": 9,
        "completion_tokens": 0,
        "calls": 1,
        "seconds": 1.0,
    },
    "fingerprint": "cf62d6279f86714a",
    "redacted": False,
}


class TestOldRecords:
    def test_a_line_without_the_flags_reads_and_scores_as_before(self):
        old = QuestionRecord.from_json(json.dumps(OLD_LINE))
        assert (old.score.empty, old.score.invalid, old.score.truncated, old.score.truncated_calls) == (
            False,
            False,
            False,
            0,
        )
        answered = dataclasses.replace(old, question_id="q1", prediction="Paris")
        records = [old, answered]
        assert summarize_runs(outcome_records(records)) == summarize_runs(records)
        (flagged,) = outcome_records([old])
        assert (flagged.score.empty, flagged.score.unknown) == (True, True)  # a blank old answer abstains still

    def test_new_flags_round_trip(self):
        new = dataclasses.replace(
            QuestionRecord.from_json(json.dumps(OLD_LINE)),
            score=score(id="q3", answerable=False, unknown=False, invalid=True, empty=True, truncated_calls=2),
        )
        assert QuestionRecord.from_json(new.to_json()) == new


class TestDemonstrationCopies:
    def test_demonstration_answers_per_prompt(self):
        assert demonstration_answers("concatenation") == {"figure7": PROMPTS["figure7"].demonstrations}
        assert demonstration_answers("base") == {}
        assert demonstration_answers("no such strategy") == {}

    def test_copy_rate_rejections_and_reasons(self):
        records = [
            record("concatenation", DEMO.upper() + ".", id="a"),  # a copy, after normalization
            record("concatenation", "Paris", id="b"),
            record("concatenation", "", invalid_meta(DEMO, DEMONSTRATION), id="c"),  # a copy the checks caught
            record("concatenation", "", invalid_meta("[2]", PASSAGE_MARKUP), id="d"),
            record("concat_pf", "Paris", {"stages": [{"reason": f"invalid answer ({DEMONSTRATION})"}, {}]}, id="e"),
            record("base", DEMO, id="f"),  # no few-shot prompt: no rate
        ]
        outcomes = answer_outcomes(records)
        concatenation = outcomes[("concatenation", 5, "retrieved")]
        assert concatenation["demo_copy_count"] == 1
        assert concatenation["demo_copy_rate"] == pytest.approx(25.0)
        low, high = concatenation["demo_copy_rate_ci"]
        assert 0.0 <= low <= 25.0 <= high <= 100.0
        assert concatenation["demo_copy_prompts"] == {"figure7": 1}
        assert concatenation["demo_rejected_count"] == 1
        assert concatenation["invalid_reasons"] == {DEMONSTRATION: 1, PASSAGE_MARKUP: 1}
        assert (concatenation["invalid_count"], concatenation["answered_count"]) == (2, 2)
        assert outcomes[("concat_pf", 5, "retrieved")]["demo_rejected_count"] == 1  # its first stage's answer
        base = outcomes[("base", 5, "retrieved")]
        assert (base["demo_copy_count"], base["demo_copy_rate"], base["demo_copy_rate_ci"]) == (0, None, None)


def demonstration_for_two(messages: list[ChatMessage]) -> str:
    """Paris for the France question; a demonstration answer for the others (which no passage holds)."""
    return "Paris" if "capital of France?" in (messages[-1].text or "") else DEMO


def evaluate(tmp_path, **options) -> list[QuestionRecord]:
    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    return Evaluator(
        DATASET,
        EvalConfig(strategies=["concatenation"], top_ks=[2], strategy_options=options),
        tmp_path / "run",
        retriever_factory=lambda: InMemoryBM25Retriever(document_store=store),
        generator_factory=lambda: MockChatGenerator(response_fn=demonstration_for_two),
    ).run()


class TestReport:
    def test_invalid_answers_are_counted_apart_from_unknown(self, tmp_path):
        summary = write_report(evaluate(tmp_path), tmp_path)
        (run,) = summary["runs"]
        assert (run["invalid_count"], run["unknown_count"], run["answered_count"], run["empty_count"]) == (2, 0, 1, 2)
        assert run["invalid_reasons"] == {DEMONSTRATION: 2}
        assert run["demo_rejected_count"] == 2
        assert run["demo_copy_count"] == 0
        assert run["em"] == pytest.approx(50.0)
        assert run["unknown_rate"] == 0.0  # the rejected answer to q2 is no abstention
        assert run["reject_rate"] == 0.0  # nor is the one to the unanswerable q3 a rejection
        assert json.loads((tmp_path / SUMMARY_FILE).read_text())["runs"][0]["invalid_count"] == 2
        table = (tmp_path / TABLE_FILE).read_text()
        assert "Answer outcomes" in table
        assert "| concatenation | 2 | 3 | 1 | 0 | 2 | 2 | 0 | 0 | 0 | 0.0% [0.0, 0.0] | 2 |" in table

    def test_without_checks_the_copies_are_answers(self, tmp_path):
        (run,) = write_report(evaluate(tmp_path, answer_checks=False), tmp_path)["runs"]
        assert (run["invalid_count"], run["answered_count"], run["demo_copy_count"]) == (0, 3, 2)
        assert run["demo_copy_rate"] == pytest.approx(200 / 3)
