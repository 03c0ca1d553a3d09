"""`research.diagnostics`: the replay's self-check, SuRe's verification and the stage traces, per run."""

from __future__ import annotations

from typing import Any

import pytest

from haystack_fusion.evaluation.metrics import QuestionScore
from haystack_fusion.evaluation.records import QuestionRecord
from research.diagnostics import consistency, diagnostics, stage_stats, verification_stats


def record(strategy: str, qid: str, *, em: float = 0.0, unknown: bool = False, **evidence: Any) -> QuestionRecord:
    score = QuestionScore(
        id=qid, answerable=True, em=em, f1=em, accuracy=em, unknown=unknown, pool_has_gold=None,
        majority_correct=None, retrieval_hit=None, prompt_tokens=1, completion_tokens=1, calls=1, seconds=0.0,
    )  # fmt: skip
    return QuestionRecord(
        strategy=strategy, top_k=5, setting="retrieved", question_id=qid, answerable=True,
        prediction="unknown" if unknown else "x", evidence=evidence, passages=[], score=score,
    )  # fmt: skip


def fallback_records() -> list[QuestionRecord]:
    """q1 sure and right; q2 unsure and wrong (post-fusion right); q3 abstains; and concat_pf's own records."""
    return [
        record("concatenation", "q1", em=1.0, confidence=0.9),
        record("concatenation", "q2", em=0.0, confidence=0.3),
        record("concatenation", "q3", unknown=True, confidence=0.6),
        record("post_fusion", "q1", em=1.0),
        record("post_fusion", "q2", em=1.0),
        record("post_fusion", "q3", em=0.0),
        record("concat_pf", "q1", em=1.0),
        record("concat_pf", "q2", em=0.0),
        record("concat_pf", "q3", em=0.0),
    ]


def test_the_text_only_replay_reproduces_concat_pf():
    assert consistency(fallback_records()) == (3, 3)
    assert diagnostics(fallback_records()) == "The text-only replay reproduces 3 of 3 concat_pf records.\n"


def test_verification_stats():
    scores = [{"candidate_index": 1, "validity": 0.2}, {"candidate_index": 0, "validity": 0.9}]
    records = [
        record("sure", "a", scores=scores, label_summaries=1, candidates=["x", "y"]),
        record(
            "sure",
            "b",
            scores=[{"candidate_index": 0, "validity": 1.0}, {"candidate_index": 1, "validity": 1.0}],
            label_summaries=0,
            candidates=["x", "y"],
        ),
    ]
    (row,) = verification_stats(records)
    assert row["verified"] == 2
    assert row["not_all_valid"] == pytest.approx(50.0)
    assert row["first_wins"] == pytest.approx(50.0)
    assert row["label_summaries"] == pytest.approx(25.0)


def test_stage_stats():
    concatenation = {"stage": "concatenation", "reason": None}
    records = [
        record("cascade", "a", stages=[concatenation]),
        record(
            "cascade",
            "b",
            stages=[
                {"stage": "concatenation", "reason": "confidence 0.18 < 0.25"},
                {"stage": "post_fusion", "reason": "tie at the top"},
                {"stage": "sure", "reason": None},
            ],
        ),
        record(
            "cascade",
            "c",
            stages=[{"stage": "concatenation", "reason": "unknown answer"}, {"stage": "post_fusion", "reason": None}],
        ),
        record("cascade", "d", stages=[concatenation]),
        record("concatenation", "a"),  # no trace: not counted
    ]
    (row,) = stage_stats(records)
    assert (row["strategy"], row["n"]) == ("cascade", 4)
    assert list(row["answered_at"]) == ["concatenation", "post_fusion", "sure"]
    assert row["answered_at"] == {"concatenation": 50.0, "post_fusion": 25.0, "sure": 25.0}
    assert row["reasons"] == {
        "concatenation": {"low confidence": 1, "unknown answer": 1},
        "post_fusion": {"tie at the top": 1},
    }


def test_sections_of_a_run_folder(tmp_path):
    records = [record("cascade", "a", stages=[{"stage": "concatenation", "reason": None}])]
    text = diagnostics(records)
    assert "## Which stage answered" in text
    assert "| cascade | 5 | 1 | concatenation 100.0% | – |" in text
    assert "SuRe's verification" not in text
