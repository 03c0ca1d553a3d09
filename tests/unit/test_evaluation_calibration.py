"""Calibration from records: AUROC against hand-computed cases, selective answering, and the replayed thresholds."""

from __future__ import annotations

from typing import Any

import pytest

from haystack_fusion.evaluation.calibration import (
    answering_confidence,
    auroc,
    calibrate,
    calibration,
    choose,
    replay,
    sweep,
)
from haystack_fusion.evaluation.charts import draw_selective_chart, selective_curve
from haystack_fusion.evaluation.metrics import QuestionScore
from haystack_fusion.evaluation.records import QuestionRecord
from haystack_fusion.evaluation.tables import calibration_markdown
from haystack_fusion.evaluation.view import ReportView


def record(strategy: str, qid: str, *, answerable: bool = True, em: float = 0.0, unknown: bool = False,
           **evidence: Any) -> QuestionRecord:  # fmt: skip
    score = QuestionScore(
        id=qid, answerable=answerable, em=em, f1=em, accuracy=em, unknown=unknown, pool_has_gold=None,
        majority_correct=None, retrieval_hit=None, prompt_tokens=1, completion_tokens=1, calls=1, seconds=0.0,
    )  # fmt: skip
    return QuestionRecord(
        strategy=strategy, top_k=5, setting="retrieved", question_id=qid, answerable=answerable,
        prediction="unknown" if unknown else "x", evidence=evidence, passages=[], score=score,
    )  # fmt: skip


class TestAuroc:
    def test_hand_computed(self):
        # positives 0.9, 0.4; negatives 0.5, 0.1: pairs (0.9>0.5, 0.9>0.1, 0.4<0.5, 0.4>0.1) -> 3/4
        result = auroc([0.9, 0.4, 0.5, 0.1], [True, True, False, False])
        assert result is not None
        assert result["auroc"] == pytest.approx(0.75)
        assert (result["positives"], result["negatives"]) == (2, 2)

    def test_ties_count_half(self):
        assert auroc([0.5, 0.5], [True, False])["auroc"] == pytest.approx(0.5)  # type: ignore[index]

    def test_perfect_separation_has_a_point_interval(self):
        result = auroc([0.9, 0.8, 0.7, 0.2, 0.1, 0.05], [True, True, True, False, False, False])
        assert result["auroc"] == 1.0  # type: ignore[index]
        assert result["ci"] == [1.0, 1.0]  # type: ignore[index]

    def test_one_class_is_none(self):
        assert auroc([0.1, 0.2], [True, True]) is None

    def test_lengths_must_match(self):
        with pytest.raises(ValueError, match="one label per score"):
            auroc([0.1], [True, False])


class TestConfidence:
    def test_abstention_counts_one_minus(self):
        assert answering_confidence(record("c", "q", confidence=0.8)) == pytest.approx(0.8)
        assert answering_confidence(record("c", "q", unknown=True, confidence=0.8)) == pytest.approx(0.2)
        assert answering_confidence(record("c", "q")) is None

    def test_calibration_rows(self):
        records = [
            record("concatenation", "a", em=1.0, confidence=0.9),
            record("concatenation", "b", em=0.0, confidence=0.3),
            record("concatenation", "u", answerable=False, unknown=True, confidence=0.9),
            record("concatenation", "v", answerable=False, confidence=0.5),
        ]
        (row,) = calibration(ReportView.of(records))
        assert row["n"] == 4
        assert row["correct"]["auroc"] == 1.0
        # answerable (0.9, 0.3) against unanswerable (0.1, 0.5): 0.9 beats both, 0.3 beats 0.1 -> 3/4
        assert row["answerable"]["auroc"] == pytest.approx(0.75)

    def test_selective_curve(self):
        records = [
            record("c", "a", em=1.0, confidence=0.9),
            record("c", "b", em=0.0, confidence=0.8),
            record("c", "u", answerable=False, confidence=0.7),
            record("c", "w", unknown=True, confidence=0.99),
        ]
        assert selective_curve(records) == [(25.0, 100.0), (50.0, 50.0), (75.0, pytest.approx(100 / 3))]


def fallback_records() -> list[QuestionRecord]:
    """Three questions: q1 sure and right; q2 unsure and wrong (post-fusion right); q3 abstains (post-fusion split)."""
    return [
        record("concatenation", "q1", em=1.0, confidence=0.9),
        record("concatenation", "q2", em=0.0, confidence=0.3),
        record("concatenation", "q3", unknown=True, confidence=0.6),
        record("post_fusion", "q1", em=1.0, votes={"a": 5}),
        record("post_fusion", "q2", em=1.0, votes={"b": 3, "c": 1}),
        record("post_fusion", "q3", em=0.0, votes={"d": 2, "e": 2}),
        record("concat_pf", "q1", em=1.0),
        record("concat_pf", "q2", em=0.0),
        record("concat_pf", "q3", em=0.0),
        record("cascade", "q3", em=1.0, stages=[{"stage": "sure", "answered": True}]),
        record("cascade", "q2", em=1.0, stages=[{"stage": "post_fusion", "answered": True}]),
        record("cascade", "q1", em=1.0, stages=[{"stage": "post_fusion", "answered": True}]),
    ]


class TestReplay:
    def test_text_only_and_tau(self):
        records = fallback_records()
        text = replay(ReportView.of(records), None)[(5, "retrieved")]
        assert {q: (o.em, o.stage) for q, o in text.items()} == {
            "q1": (1.0, "concatenation"),
            "q2": (0.0, "concatenation"),
            "q3": (0.0, "post_fusion"),
        }
        unsure = replay(ReportView.of(records), 0.5)[(5, "retrieved")]
        assert unsure["q2"].stage == "post_fusion"
        assert unsure["q2"].em == 1.0

    def test_sweep_and_choose(self):
        rows = sweep(ReportView.of(fallback_records()), [0.2, 0.5])
        assert [row["tau"] for row in rows] == [None, 0.2, 0.5]
        best = choose(rows)
        assert best is not None
        assert best["tau"] == 0.5
        assert best["squad2_em"] == pytest.approx(200 / 3)
        assert best["fallback_rate"] == pytest.approx(200 / 3)


def test_report_sections(tmp_path):
    pytest.importorskip("matplotlib", reason="the `eval` extra")
    view = ReportView.of(fallback_records())
    summary = calibrate(view)
    chart = draw_selective_chart(view, tmp_path)
    assert chart == tmp_path / "selective_answering.png"
    assert chart.is_file()
    markdown = calibration_markdown(summary, chart.name)
    assert "## Answer confidence" in markdown
    assert "![selective answering](selective_answering.png)" in markdown
    assert "## concat_pf replayed at each threshold" in markdown
    assert "**chosen**" in markdown
    assert set(summary) == {"auroc", "concat_pf_sweep", "tau_choice"}
