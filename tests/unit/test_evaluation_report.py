"""
The evaluation report: answers that are not answers (empty, invalid, truncated, unknown) counted per run, and the
demonstration-copy rate.
"""

from __future__ import annotations

import json

import pytest
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.dataclasses import ChatMessage
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.answers import DEMONSTRATION, PASSAGE_MARKUP, invalid_meta
from haystack_fusion.cli import main
from haystack_fusion.evaluation.charts import NOISE_CHART, TOKENS_CHART, TOPK_CHART
from haystack_fusion.evaluation.figures import answer_outcomes, summarize_runs
from haystack_fusion.evaluation.passages import PassageSetting
from haystack_fusion.evaluation.records import QuestionRecord
from haystack_fusion.evaluation.report import SUMMARY_FILE, TABLE_FILE, write_report
from haystack_fusion.evaluation.runner import EvalConfig, Evaluator
from haystack_fusion.evaluation.tables import markdown_table
from haystack_fusion.evaluation.view import ReportView, demonstration_answers
from haystack_fusion.prompts import PROMPTS
from tests.unit.capitals_dataset import THREE_CAPITALS, THREE_CAPITALS_DATASET, make_evaluator
from tests.unit.scores import DEMO, outcome_score

"""A demonstration answer of Figure 7's prompt (the concatenation strategy's), which no passage above holds."""


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
        score=outcome_score(**score_changes),
    )


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
        outcomes = {key: answer_outcomes(run) for key, run in ReportView.of(records).runs.items()}
        concatenation = outcomes[("", "concatenation", 5, "retrieved")]
        assert concatenation["demo_copy_count"] == 1
        assert concatenation["demo_copy_rate"] == pytest.approx(25.0)
        low, high = concatenation["demo_copy_rate_ci"]
        assert 0.0 <= low <= 25.0 <= high <= 100.0
        assert concatenation["demo_copy_prompts"] == {"figure7": 1}
        assert concatenation["demo_rejected_count"] == 1
        assert concatenation["invalid_reasons"] == {DEMONSTRATION: 1, PASSAGE_MARKUP: 1}
        assert (concatenation["invalid_count"], concatenation["answered_count"]) == (2, 2)
        assert outcomes[("", "concat_pf", 5, "retrieved")]["demo_rejected_count"] == 1  # its first stage's answer
        base = outcomes[("", "base", 5, "retrieved")]
        assert (base["demo_copy_count"], base["demo_copy_rate"], base["demo_copy_rate_ci"]) == (0, None, None)


def demonstration_for_two(messages: list[ChatMessage]) -> str:
    """Paris for the France question; a demonstration answer for the others (which no passage holds)."""
    return "Paris" if "capital of France?" in (messages[-1].text or "") else DEMO


def evaluate(tmp_path, **options) -> list[QuestionRecord]:
    store = InMemoryDocumentStore()
    store.write_documents(THREE_CAPITALS)
    return Evaluator(
        THREE_CAPITALS_DATASET,
        EvalConfig(strategies=["concatenation"], top_ks=[2], strategy_options=options),
        tmp_path / "run",
        retriever_factory=lambda: InMemoryBM25Retriever(document_store=store),
        generator_factory=lambda: MockChatGenerator(response_fn=demonstration_for_two),
    ).run()


class TestAnswerOutcomes:
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


class TestReport:
    def test_writes_summary_table_and_charts(self, tmp_path):
        records = make_evaluator(tmp_path, top_ks=[1, 2]).run()
        summary = write_report(records, tmp_path, title="capitals")
        assert [(run["strategy"], run["top_k"]) for run in summary["runs"]] == [
            ("concatenation", 1),
            ("concatenation", 2),
            ("post_fusion", 1),
            ("post_fusion", 2),
        ]
        assert json.loads((tmp_path / "summary.json").read_text())["runs"][0]["questions"] == 3
        table = (tmp_path / TABLE_FILE).read_text()
        assert "| strategy | top-k | EM | F1 | %Unk | %NM |" in table
        assert "| concatenation | 1 | 100.0 [100.0, 100.0] |" in table
        assert "| concatenation | 2 | 50.0 [0.0, 100.0] |" in table  # the mock reads the first city of the context
        assert "| post_fusion | 2 | 100.0 [100.0, 100.0] |" in table  # one passage per call: no distraction
        assert (tmp_path / TOKENS_CHART).stat().st_size > 0
        assert (tmp_path / TOPK_CHART).stat().st_size > 0

    def test_rates_carry_bootstrap_intervals(self, tmp_path):
        records = make_evaluator(tmp_path).run()
        write_report(records, tmp_path, title="capitals")
        summary = json.loads((tmp_path / SUMMARY_FILE).read_text())
        assert summary["bootstrap"] == {"resamples": 1000, "confidence": 0.95, "seed": 0, "method": "percentile"}
        run = summary["runs"][0]
        assert (run["strategy"], run["em"], run["em_ci"]) == ("concatenation", 50.0, [0.0, 100.0])
        assert run["f1_ci"] == [0.0, 100.0]
        assert run["accuracy_ci"] == [0.0, 100.0]
        assert run["unknown_rate_ci"] == [0.0, 0.0]  # two answerable questions, neither answered unknown
        assert run["reject_rate_ci"] is None  # one unanswerable question: no interval
        assert "recall_at_k_ci" in run
        assert list(run)[list(run).index("em") + 1] == "em_ci"
        table = (tmp_path / TABLE_FILE).read_text()
        assert "1000 resamples of the questions, percentile method, seed 0 (Kim et al., Appendix H)" in table

    def test_paired_difference_against_the_default_baseline(self, tmp_path):
        records = make_evaluator(tmp_path).run()
        summary = write_report(records, tmp_path, seed=3)
        assert summary["baseline"] == "concatenation"
        assert summary["bootstrap"]["seed"] == 3
        baseline, other = summary["runs"]
        assert "em_diff" not in baseline
        # post_fusion gets q1 and q2 right, concatenation only q1: differences 0 and 100 points per question.
        assert other["paired_questions"] == 2
        assert (other["em_diff"], other["em_diff_ci"]) == (50.0, [0.0, 100.0])
        assert other["f1_diff"] == 50.0
        assert other["diff_significant"] is False
        assert json.loads((tmp_path / SUMMARY_FILE).read_text())["runs"][1]["em_diff_ci"] == [0.0, 100.0]
        table = (tmp_path / TABLE_FILE).read_text()
        assert "Paired difference vs concatenation (answerable questions)" in table
        assert "| post_fusion | 2 | +50.0 [+0.0, +100.0] | +50.0 [+0.0, +100.0] | 2 |" in table

    def test_explicit_baseline_and_significance_marker(self, tmp_path):
        records = make_evaluator(tmp_path).run()
        runs = summarize_runs(ReportView.of(records))
        runs[1].update(em_diff=80.0, em_diff_ci=[62.0, 96.0], f1_diff=1.0, f1_diff_ci=[-2.0, 4.0], paired_questions=50)
        table = markdown_table(runs, baseline="concatenation")
        assert "| post_fusion | 2 | +80.0 [+62.0, +96.0]* | +1.0 [-2.0, +4.0] | 50 |" in table
        assert "* marks a difference whose interval excludes 0" in table
        summary = write_report(records, tmp_path, baseline="post_fusion")
        assert summary["baseline"] == "post_fusion"
        assert summary["runs"][0]["em_diff"] == -50.0
        assert "em_diff" not in summary["runs"][1]

    def test_unknown_baseline(self, tmp_path):
        records = make_evaluator(tmp_path).run()
        with pytest.raises(ValueError, match=r"'sure' did not run.*concatenation, post_fusion"):
            write_report(records, tmp_path, baseline="sure")

    def test_without_concatenation_there_is_no_comparison(self, tmp_path):
        records = make_evaluator(tmp_path, strategies=["post_fusion"]).run()
        summary = write_report(records, tmp_path)
        assert summary["baseline"] is None
        assert "em_diff" not in summary["runs"][0]
        assert "Paired difference" not in (tmp_path / TABLE_FILE).read_text()

    def test_table_of_summaries_without_intervals(self, tmp_path):
        records = make_evaluator(tmp_path, strategies=["concatenation"]).run()
        plain = [
            {k: v for k, v in run.items() if not k.endswith("_ci")} for run in summarize_runs(ReportView.of(records))
        ]
        table = markdown_table(plain)
        assert "| concatenation | 2 | 50.0 | 50.0 | 0.0% |" in table
        assert "bootstrap" not in table

    def test_no_records(self, tmp_path):
        with pytest.raises(ValueError, match="no answered questions"):
            write_report([], tmp_path)

    def test_several_noise_ratios_in_one_table_and_chart(self, tmp_path):
        records = []
        for ratio in (0.0, 0.5):
            evaluator = make_evaluator(
                tmp_path / str(ratio), strategies=["concatenation"], setting=PassageSetting(noise_ratio=ratio)
            )
            records += evaluator.run()
        summary = write_report(records, tmp_path, title="noise")
        assert [run["setting"] for run in summary["runs"]] == ["retrieved, noise ratio 0", "retrieved, noise ratio 0.5"]
        table = (tmp_path / TABLE_FILE).read_text()
        assert "| strategy | setting | top-k |" in table
        assert "| concatenation | retrieved, noise ratio 0.5 |" in table
        assert (tmp_path / NOISE_CHART).stat().st_size > 0

    def test_report_command_merges_runs(self, tmp_path, capsys):
        make_evaluator(tmp_path / "a", strategies=["concatenation"]).run()
        make_evaluator(tmp_path / "b", strategies=["post_fusion"]).run()
        assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "both")]) == 0
        assert "| post_fusion |" in (tmp_path / "both" / TABLE_FILE).read_text()
        assert main(["report", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
