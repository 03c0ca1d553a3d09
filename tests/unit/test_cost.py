"""
What runs cost: prices, cost per question, share that fell back, calls and tokens per model, the accuracy-vs-cost chart,
run labels for several folders, and the tau chosen for a target accuracy or fallback share.
"""

from __future__ import annotations

import json

import pytest

from haystack_fusion.cli import main
from haystack_fusion.evaluation.calibration import choose, replay, sweep
from haystack_fusion.evaluation.charts import COST_CHART
from haystack_fusion.evaluation.figures import run_cost
from haystack_fusion.evaluation.records import RUN_FILE, QuestionRecord, read_run_manifest, write_run_manifest
from haystack_fusion.evaluation.report import SUMMARY_FILE, TABLE_FILE, write_report
from haystack_fusion.evaluation.view import (
    UNNAMED_MODEL,
    Question,
    ReportView,
    model_usage,
    parse_price,
    parse_prices,
    with_model,
)
from tests.unit.capitals_dataset import make_evaluator
from tests.unit.scores import outcome_score

SMALL, STRONG = "small", "strong"
PRICES = {SMALL: (1.0, 2.0), STRONG: (10.0, 20.0)}


def usage(prompt: int, completion: int, calls: int = 1) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "calls": calls}


def record(strategy: str, question_id: str, by_model: dict | None = None, **changes) -> QuestionRecord:
    evidence = {key: changes.pop(key) for key in ("fallback", "confidence") if key in changes}
    if by_model is not None:
        evidence["usage_by_model"] = by_model
    if "em" in changes:
        changes.setdefault("f1", changes["em"])
    return QuestionRecord(
        strategy=strategy,
        top_k=5,
        setting="retrieved",
        question_id=question_id,
        answerable=changes.get("answerable", True),
        prediction="x",
        evidence=evidence,
        passages=[],
        score=outcome_score(id=question_id, **changes),
    )


def cascade_records() -> list[QuestionRecord]:
    """q1 sure on the small model; q2 passed on to the strong model (right there), q3 passed on (wrong there)."""
    return [
        record("cascade", "q1", {SMALL: usage(1000, 10)}, fallback=False),
        record("cascade", "q2", {SMALL: usage(1000, 10), STRONG: usage(5000, 50, 5)}, fallback=True),
        record("cascade", "q3", {SMALL: usage(1000, 10), STRONG: usage(5000, 50, 5)}, fallback=True, em=0.0),
        record("concatenation", "q1", {SMALL: usage(1000, 10)}),
        record("concatenation", "q2", {SMALL: usage(1000, 10)}),
        record("concatenation", "q3", {SMALL: usage(1000, 10)}),
    ]


class TestPrices:
    def test_parse(self):
        assert parse_price("gpt-4o-mini=0.15,0.60") == ("gpt-4o-mini", (0.15, 0.6))
        assert parse_price("org/model=1,2") == ("org/model", (1.0, 2.0))
        assert parse_prices(["a=1,2", "a=3,4"]) == {"a": (3.0, 4.0)}

    @pytest.mark.parametrize("text", ["gpt", "=1,2", "m=1", "m=1,2,3", "m=a,b", "m=-1,2", "m=nan,1"])
    def test_bad_prices_name_the_value(self, text):
        with pytest.raises(ValueError, match="price"):
            parse_price(text)

    def test_cli_rejects_a_bad_price(self, tmp_path, capsys):
        with pytest.raises(SystemExit) as exit_info:
            main(["report", str(tmp_path), "--out", str(tmp_path / "r"), "--price", "small=1"])
        assert exit_info.value.code == 2
        assert "small=1" in capsys.readouterr().err

    def test_manifest_keeps_prices(self, tmp_path):
        write_run_manifest(tmp_path, title="t", dataset="d", prices={SMALL: (1.0, 2.0)})
        write_run_manifest(tmp_path, title="t", dataset="d")  # a resumed run without --price keeps them
        assert read_run_manifest(tmp_path)["prices"] == {SMALL: [1.0, 2.0]}


class TestCost:
    def test_question_cost_per_model(self):
        strong = cascade_records()[1]
        assert Question.of(strong, PRICES).cost == pytest.approx((1000 * 1 + 10 * 2 + 5000 * 10 + 50 * 20) / 1e6)
        assert Question.of(strong, {SMALL: (1.0, 2.0)}).cost is None

    def test_records_without_usage_by_model(self):
        old = record("concatenation", "q1")  # 10 prompt and 2 completion tokens, one call
        assert model_usage(old) == {UNNAMED_MODEL: usage(10, 2)}
        (named,) = with_model([old], SMALL)
        assert model_usage(named) == {SMALL: usage(10, 2)}
        assert Question.of(named, PRICES).cost == pytest.approx(14 / 1e6)

    @staticmethod
    def cost(records: list[QuestionRecord], prices: dict) -> dict:
        (run,) = ReportView.of(records, prices=prices).runs.values()
        return run_cost(run)

    def test_run_cost(self):
        cost = self.cost(cascade_records()[:3], PRICES)
        assert cost["cost_per_question"] == pytest.approx((3 * 1020 + 2 * 51000) / 1e6 / 3)
        assert cost["cost_per_question_ci"][0] <= cost["cost_per_question"] <= cost["cost_per_question_ci"][1]
        assert cost["escalated_rate"] == pytest.approx(200 / 3)
        small, strong = cost["models"]
        assert (small["model"], small["calls_per_question"], small["prompt_tokens_per_question"]) == (SMALL, 1, 1000)
        assert (strong["calls_per_question"], strong["completion_tokens_per_question"]) == (10 / 3, 100 / 3)
        assert cost["unpriced_models"] == []
        unpriced = self.cost(cascade_records()[:3], {SMALL: (1.0, 2.0)})
        assert unpriced["cost_per_question"] is None
        assert unpriced["unpriced_models"] == [STRONG]
        assert self.cost(cascade_records()[3:], PRICES)["escalated_rate"] is None


class TestReport:
    def test_cost_columns_model_table_and_chart(self, tmp_path):
        summary = write_report(cascade_records(), tmp_path, prices=PRICES)
        text = (tmp_path / TABLE_FILE).read_text()
        assert "| strategy | top-k | EM | F1 | cost/q $ | fallback % |" in text
        assert "| cascade | 5 | 66.7 [0.0, 100.0] | 66.7 [0.0, 100.0] | 0.035 [" in text
        assert "| model | calls/q | prompt tokens/q | completion tokens/q | cost/q $ |" in text
        assert "| cascade | 5 | strong | 3.33 | 3333 | 33 | 0.034 |" in text
        assert "small 1 / 2; strong 10 / 20" in text
        assert (tmp_path / COST_CHART).stat().st_size > 0
        saved = json.loads((tmp_path / SUMMARY_FILE).read_text())
        assert saved["prices"] == {SMALL: [1.0, 2.0], STRONG: [10.0, 20.0]}
        cascade = saved["runs"][0]
        assert cascade["cost_per_question"] == pytest.approx(summary["runs"][0]["cost_per_question"])
        assert {"cost_per_question_ci", "escalated_rate", "escalated_rate_ci", "models", "unpriced_models"} <= set(
            cascade
        )

    def test_a_model_without_a_price_is_named(self, tmp_path):
        write_report(cascade_records(), tmp_path, prices={SMALL: (1.0, 2.0)})
        text = (tmp_path / TABLE_FILE).read_text()
        assert "No price for strong" in text
        assert "| concatenation | 5 | 100.0 [100.0, 100.0] | 100.0 [100.0, 100.0] | 0.00102 [" in text
        assert "| cascade | 5 | 66.7 [0.0, 100.0] | 66.7 [0.0, 100.0] | - | 66.7% [" in text

    def test_without_prices_or_per_model_usage_the_table_is_as_it_was(self, tmp_path):
        records = [record("concatenation", "q1"), record("concatenation", "q2", em=0.0)]
        write_report(records, tmp_path)
        text = (tmp_path / TABLE_FILE).read_text()
        assert "| strategy | top-k | EM | F1 | %Unk |" in text
        assert "cost/q" not in text
        assert "per model" not in text
        assert not (tmp_path / COST_CHART).exists()

    def test_run_labels_tell_runs_apart(self, tmp_path):
        records = cascade_records()[3:] * 2
        summary = write_report(records, tmp_path, runs=["small"] * 3 + ["strong"] * 3)
        assert [(s["run"], s["strategy"]) for s in summary["runs"]] == [
            ("small", "concatenation"),
            ("strong", "concatenation"),
        ]
        assert "| run | strategy | top-k | EM |" in (tmp_path / TABLE_FILE).read_text()
        with pytest.raises(ValueError, match="one run label per record"):
            write_report(records, tmp_path, runs=["small"])


def two_model_records() -> list[QuestionRecord]:
    """The first round on the small model (concatenation, with confidences) and the fallback rounds on the strong one,
    as fallen-back records of a cascade run (another folder)."""
    first = [
        record("concatenation", "q1", {SMALL: usage(1000, 10)}, confidence=0.9),
        record("concatenation", "q2", {SMALL: usage(1000, 10)}, confidence=0.4, em=0.0),
        record("concatenation", "q3", {SMALL: usage(1000, 10)}, confidence=0.2, em=0.0),
    ]
    later = [
        record("cascade", q, {SMALL: usage(1000, 10), STRONG: usage(5000, 50, 5)}, fallback=True, em=em)
        for q, em in (("q1", 1.0), ("q2", 1.0), ("q3", 0.0))
    ]
    return first + later


class TestCalibration:
    def test_replay_pairs_the_later_rounds_of_another_folder_and_carries_the_cost(self):
        low = replay(ReportView.of(two_model_records(), prices=PRICES), 0.3)[(5, "retrieved")]
        assert {q: (o.stage, o.em) for q, o in low.items()} == {
            "q1": ("concatenation", 1.0),
            "q2": ("concatenation", 0.0),
            "q3": ("post_fusion", 0.0),
        }
        assert low["q1"].cost == pytest.approx(1020 / 1e6)
        assert low["q3"].cost == pytest.approx(52020 / 1e6)  # the first round once, then the strong model's rounds
        high = replay(ReportView.of(two_model_records(), prices=PRICES), 0.5)[(5, "retrieved")]
        assert (high["q2"].stage, high["q2"].em) == ("post_fusion", 1.0)
        assert replay(ReportView.of(two_model_records()), 0.5)[(5, "retrieved")]["q2"].cost is None

    def test_choose_for_a_target(self):
        rows = sweep(ReportView.of(two_model_records(), prices=PRICES), [0.3, 0.5, 0.95])
        by_tau = {row["tau"]: row for row in rows}
        assert by_tau[0.3]["squad2_em"] == pytest.approx(100 / 3)
        assert by_tau[0.5]["squad2_em"] == by_tau[0.95]["squad2_em"] == pytest.approx(200 / 3)
        assert by_tau[0.5]["cost_per_question"] < by_tau[0.95]["cost_per_question"]
        assert choose(rows)["tau"] == 0.5
        assert choose(rows, target_accuracy=60)["tau"] == 0.5  # the cheapest that reaches it
        assert choose(rows, target_accuracy=30)["tau"] == 0.3
        assert choose(rows, target_accuracy=90) is None
        assert choose(rows, target_fallback=40)["tau"] == 0.3  # the most accurate under it
        assert choose(rows, target_fallback=10) is None
        with pytest.raises(ValueError, match="not both"):
            choose(rows, target_accuracy=50, target_fallback=50)
        with pytest.raises(ValueError, match="target_accuracy"):
            choose(rows, target_accuracy=150)

    def test_the_report_says_which_tau_and_why(self, tmp_path):
        summary = write_report(two_model_records(), tmp_path, prices=PRICES, target_fallback=70)
        choice = summary["calibration"]["tau_choice"]
        # q2's confidence is 0.4: from tau 0.45 on it reaches the strong model, which answers it right
        assert (choice["tau"], choice["target"]) == (0.45, {"target_fallback": 70})
        text = (tmp_path / TABLE_FILE).read_text()
        assert "tau 0.45 is the most accurate tau whose fallback rate is at most 70%." in text
        assert "| cost/q $ |" in text.split("## concat_pf replayed")[1]


def test_report_command_with_two_folders_and_prices(tmp_path, capsys):
    (first, *_) = make_evaluator(tmp_path / "small", strategies=["concatenation"]).run()
    make_evaluator(tmp_path / "strong", strategies=["concatenation"]).run()
    (model,) = model_usage(first)  # the model the records name
    write_run_manifest(tmp_path / "small", title="capitals", dataset="", prices={model: (1.0, 2.0)})
    args = ["report", str(tmp_path / "small"), str(tmp_path / "strong"), "--out", str(tmp_path / "both")]
    assert main([*args, "--target-accuracy", "50"]) == 0
    text = (tmp_path / "both" / TABLE_FILE).read_text()
    assert "| run | strategy | top-k | EM | F1 | cost/q $ |" in text
    assert "| small | concatenation |" in text
    assert "| strong | concatenation |" in text
    assert json.loads((tmp_path / "both" / SUMMARY_FILE).read_text())["prices"] == {model: [1.0, 2.0]}
    assert main([*args, "--price", f"{model}=0,0"]) == 0  # --price over run.json's
    assert json.loads((tmp_path / "both" / SUMMARY_FILE).read_text())["prices"] == {model: [0.0, 0.0]}
    assert (tmp_path / "small" / RUN_FILE).is_file()


def agreement_records() -> list[QuestionRecord]:
    """Concatenation alone on the small model (no confidence: no log-probabilities), and a cascade judged by the
    agreement of 4 samples at tau 0.75: q1 kept (3 of 4 agree), q2 passed on (2 of 4 agree), q3 passed on (1 of 4)."""
    first = [record("concatenation", q, {SMALL: usage(1000, 10)}, em=em) for q, em in (("q1", 1), ("q2", 1), ("q3", 0))]

    def judged(question_id: str, confidence: float, fallback: bool, em: int) -> QuestionRecord:
        by_model = {SMALL: usage(5000, 50, 5), **({STRONG: usage(3000, 30, 3)} if fallback else {})}
        result = record("cascade", question_id, by_model, fallback=fallback, em=em)
        stage = {"stage": "concatenation", "confidence": confidence, "answered": not fallback}
        result.evidence["stages"] = [stage, *([{"stage": "post_fusion", "answered": True}] if fallback else [])]
        return result

    return [*first, judged("q1", 0.75, False, 1), judged("q2", 0.5, True, 0), judged("q3", 0.25, True, 1)]


class TestAgreementReplay:
    def test_the_router_confidence_of_a_judging_run_replays_lower_taus(self):
        outcomes = replay(ReportView.of(agreement_records(), prices=PRICES), 0.4)[(5, "retrieved")]
        assert {q: o.stage for q, o in outcomes.items()} == {
            "q1": "concatenation",
            "q2": "concatenation",  # 0.5 >= 0.4: its first answer stands, right on the small model
            "q3": "post_fusion",
        }
        assert outcomes["q2"].em == 1.0
        # the first round costs its call and the 4 samples (5,000 + 50 tokens on the small model)
        assert outcomes["q2"].cost == pytest.approx((5000 * 1.0 + 50 * 2.0) / 1e6)
        assert outcomes["q3"].cost == pytest.approx((5000 * 1.0 + 50 * 2.0 + 3000 * 10.0 + 30 * 20.0) / 1e6)

    def test_a_rejected_first_answer_is_passed_on_at_every_tau(self):
        records = agreement_records()
        records[1].evidence["answer_source"] = "invalid"  # q2's first answer repeated the question
        assert replay(ReportView.of(records), 0.1)[(5, "retrieved")]["q2"].stage == "post_fusion"

    def test_taus_above_the_judging_runs_are_not_replayed(self):
        rows = sweep(ReportView.of(agreement_records(), prices=PRICES), [0.3, 0.75, 1.0])
        assert [row["tau"] for row in rows] == [None, 0.3, 0.75]  # at 1.0, q1's fallback rounds never ran
        assert [row["fallback_rate"] for row in rows] == pytest.approx([0.0, 100 / 3, 200 / 3])
