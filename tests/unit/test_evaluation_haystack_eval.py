"""Unit tests of haystack_fusion.evaluation.haystack_eval: a run as Haystack EvaluationRunResults, SAS plumbing."""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

import pytest
from haystack import Document
from haystack.evaluation import EvaluationRunResult

from haystack_fusion.corpus import Question
from haystack_fusion.evaluation import haystack_eval
from haystack_fusion.evaluation.datasets import EvalDataset
from haystack_fusion.evaluation.haystack_eval import (
    INPUT_COLUMNS,
    load_evaluation_run_results,
    records_sas,
    sas_scores,
    to_evaluation_run_results,
)
from haystack_fusion.evaluation.metrics import QuestionScore, accuracy, exact_match, f1, is_unknown, summarize
from haystack_fusion.evaluation.records import RESULTS_FILE, QuestionRecord

SETTING = "retrieved"

DATASET = EvalDataset(
    name="tiny",
    documents=[Document(content="Paris is the capital of France."), Document(content="Hastings was fought in 1066.")],
    questions=[
        Question(
            id="q1", question="What is the capital of France?", answers=("Paris", "City of Paris"), is_impossible=False
        ),
        Question(id="q2", question="When was the battle of Hastings?", answers=("1066",), is_impossible=False),
        Question(id="q3", question="Who is the king of France today?", answers=(), is_impossible=True),
        Question(id="q4", question="A question no run answered?", answers=("nothing",), is_impossible=False),
    ],
)
QUESTIONS = {question.id: question for question in DATASET.questions}


def make_record(strategy: str, question_id: str, prediction: str, *, top_k: int = 5, setting: str = SETTING,
                answerable: bool | None = None) -> QuestionRecord:  # fmt: skip
    """
    A QuestionRecord scored with our metrics. The one place that knows QuestionRecord's constructor: fields it no
    longer has (the lead is removing `question` and `gold`) are left out.
    """
    question = QUESTIONS.get(question_id)
    golds = list(question.answers) if question else []
    is_answerable = (not question.is_impossible if question else True) if answerable is None else answerable
    score = QuestionScore(
        id=question_id,
        answerable=is_answerable,
        em=exact_match(prediction, golds),
        f1=f1(prediction, golds),
        accuracy=accuracy(prediction, golds),
        unknown=is_unknown(prediction),
        pool_has_gold=None,
        majority_correct=None,
        retrieval_hit=None,
        prompt_tokens=10,
        completion_tokens=2,
        calls=1,
        seconds=0.5,
    )
    values: dict[str, Any] = {
        "strategy": strategy,
        "top_k": top_k,
        "setting": setting,
        "question_id": question_id,
        "question": question.question if question else "?",
        "gold": golds,
        "answerable": is_answerable,
        "prediction": prediction,
        "evidence": {},
        "passages": [],
        "score": score,
    }
    names = {field.name for field in dataclasses.fields(QuestionRecord)}
    return QuestionRecord(**{name: value for name, value in values.items() if name in names})


def two_strategies() -> list[QuestionRecord]:
    """concatenation then concat_pf, each answering q1-q3 (not q4), in different orders."""
    return [
        make_record("concatenation", "q2", "in 1066"),
        make_record("concatenation", "q1", "Paris."),
        make_record("concatenation", "q3", "Louis XIV"),
        make_record("concat_pf", "q3", "unknown"),
        make_record("concat_pf", "q1", "The capital is the City of Paris, on the Seine"),
        make_record("concat_pf", "q2", "1066"),
    ]


def same(actual: list[float], expected: list[float]) -> bool:
    """List equality where NaN equals NaN."""
    return len(actual) == len(expected) and all(
        (math.isnan(a) and math.isnan(e)) or a == pytest.approx(e) for a, e in zip(actual, expected, strict=True)
    )


def test_one_result_per_strategy_named_after_it():
    results = to_evaluation_run_results(two_strategies(), DATASET)

    assert list(results) == ["concatenation", "concat_pf"]
    assert all(isinstance(result, EvaluationRunResult) for result in results.values())
    assert [result.run_name for result in results.values()] == ["concatenation", "concat_pf"]
    assert list(results["concat_pf"].results) == ["exact_match", "f1", "accuracy", "reject"]


def test_inputs_come_from_the_dataset_aligned_in_dataset_order():
    results = to_evaluation_run_results(two_strategies(), DATASET)

    concatenation, concat_pf = results["concatenation"].inputs, results["concat_pf"].inputs
    assert list(concatenation) == list(INPUT_COLUMNS)
    for inputs in (concatenation, concat_pf):
        assert inputs["question_id"] == ["q1", "q2", "q3"]  # q4 was answered by no run
        assert inputs["question"] == [QUESTIONS[q].question for q in ("q1", "q2", "q3")]
        assert inputs["ground_truth_answers"] == [["Paris", "City of Paris"], ["1066"], []]
        assert inputs["answerable"] == [True, True, False]
    assert concatenation["predicted_answer"] == ["Paris.", "in 1066", "Louis XIV"]
    assert concat_pf["predicted_answer"] == ["The capital is the City of Paris, on the Seine", "1066", "unknown"]


def test_scores_are_the_records_scores_and_their_means_match_the_summary():
    records = two_strategies()
    results = to_evaluation_run_results(records, DATASET)["concatenation"].results

    assert same(results["exact_match"]["individual_scores"], [1.0, 0.0, math.nan])
    assert same(results["f1"]["individual_scores"], [1.0, 2 / 3, math.nan])
    assert same(results["accuracy"]["individual_scores"], [1.0, 1.0, math.nan])
    assert same(results["reject"]["individual_scores"], [math.nan, math.nan, 0.0])
    summary = summarize([r.score for r in records if r.strategy == "concatenation"])
    for metric, key in (("exact_match", "em"), ("f1", "f1"), ("accuracy", "accuracy"), ("reject", "reject_rate")):
        assert results[metric]["score"] == pytest.approx(summary[key] / 100)


def test_comparative_detailed_report_between_two_strategies():
    results = to_evaluation_run_results(two_strategies(), DATASET)
    concatenation, concat_pf = results["concatenation"], results["concat_pf"]

    report = concatenation.comparative_detailed_report(concat_pf, keep_columns=["predicted_answer"])

    assert isinstance(report, dict)
    assert report["question_id"] == ["q1", "q2", "q3"]
    assert report["concatenation_predicted_answer"] == ["Paris.", "in 1066", "Louis XIV"]
    assert report["concat_pf_predicted_answer"][2] == "unknown"
    assert same(report["concatenation_exact_match"], [1.0, 0.0, math.nan])
    assert same(report["concat_pf_exact_match"], [0.0, 1.0, math.nan])
    assert same(report["concat_pf_reject"], [math.nan, math.nan, 1.0])
    assert len({len(column) for column in report.values()}) == 1
    default = concatenation.comparative_detailed_report(concat_pf)
    assert {"question_id", "predicted_answer", "concatenation_f1", "concat_pf_f1"} <= set(default)


def test_detailed_and_aggregated_reports_accept_the_nan_rows():
    result = to_evaluation_run_results(two_strategies(), DATASET)["concat_pf"]

    detailed = result.detailed_report()
    aggregated = result.aggregated_report()

    assert isinstance(detailed, dict)
    assert same(detailed["accuracy"], [1.0, 1.0, math.nan])
    assert aggregated == {
        "metrics": ["exact_match", "f1", "accuracy", "reject"],
        "score": [0.5, pytest.approx(0.8), 1.0, 1.0],
    }


def test_unknown_question_id_raises():
    records = [*two_strategies(), make_record("concat_pf", "not-in-dataset", "Paris")]

    with pytest.raises(ValueError, match=r"not in dataset 'tiny': 'not-in-dataset'"):
        to_evaluation_run_results(records, DATASET)


def test_no_records_raises():
    with pytest.raises(ValueError, match="no records"):
        to_evaluation_run_results([], DATASET)


def test_answerable_disagreeing_with_the_dataset_raises():
    records = [make_record("concatenation", "q3", "unknown", answerable=True)]

    with pytest.raises(ValueError, match=r"answerable=True.*unanswerable"):
        to_evaluation_run_results(records, DATASET)


def test_a_question_one_run_missed_is_a_row_without_prediction():
    records = [r for r in two_strategies() if (r.strategy, r.question_id) != ("concat_pf", "q1")]

    results = to_evaluation_run_results(records, DATASET)

    concat_pf = results["concat_pf"]
    assert concat_pf.inputs["question_id"] == results["concatenation"].inputs["question_id"] == ["q1", "q2", "q3"]
    assert concat_pf.inputs["predicted_answer"] == [None, "1066", "unknown"]
    assert same(concat_pf.results["exact_match"]["individual_scores"], [math.nan, 1.0, math.nan])
    assert concat_pf.results["exact_match"]["score"] == 1.0


def test_several_ks_and_settings_name_the_runs_in_full():
    records = [
        make_record("concat_pf", "q1", "Paris", top_k=5),
        make_record("concat_pf", "q1", "Lyon", top_k=10),
        make_record("concat_pf", "q1", "Paris", top_k=5, setting="retrieved, noise ratio 0.4"),
    ]

    results = to_evaluation_run_results(records, DATASET)

    assert list(results) == [
        "concat_pf top-5 retrieved",
        "concat_pf top-10 retrieved",
        "concat_pf top-5 retrieved, noise ratio 0.4",
    ]
    assert results["concat_pf top-10 retrieved"].results["exact_match"]["score"] == 0.0


def test_no_unanswerable_question_gives_reject_score_none():
    results = to_evaluation_run_results([make_record("concatenation", "q1", "Paris")], DATASET)

    assert results["concatenation"].results["reject"]["score"] is None


def test_sas_mapping_adds_the_sas_metric_on_answerable_questions():
    records = two_strategies()
    sas = {r.key(): (None if r.question_id == "q3" else 0.25 * len(r.prediction) / 100) for r in records}

    results = to_evaluation_run_results(records, DATASET, sas=sas)

    sas_result = results["concat_pf"].results["sas"]
    assert list(results["concat_pf"].results) == ["exact_match", "f1", "accuracy", "reject", "sas"]
    assert same(sas_result["individual_scores"], [0.25 * 46 / 100, 0.25 * 4 / 100, math.nan])
    assert sas_result["score"] == pytest.approx(0.25 * 25 / 100)


def test_sas_mapping_without_a_score_for_an_answerable_record_raises():
    records = two_strategies()
    sas = {r.key(): 0.5 for r in records if r.question_id != "q2"}

    with pytest.raises(ValueError, match="no score for the answerable record"):
        to_evaluation_run_results(records, DATASET, sas=sas)


class FakeSAS:
    """Stands in for a warmed-up SASEvaluator: 1.0 for identical strings, else 1 / (1 + length difference)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], list[str]]] = []

    def run(self, ground_truth_answers: list[str], predicted_answers: list[str]) -> dict[str, Any]:
        self.calls.append((ground_truth_answers, predicted_answers))
        scores = [
            1.0 if g == p else 1 / (1 + abs(len(g) - len(p)))
            for g, p in zip(ground_truth_answers, predicted_answers, strict=True)
        ]
        return {"score": sum(scores) / len(scores), "individual_scores": scores}


@pytest.fixture
def fake_sas(monkeypatch) -> FakeSAS:
    fake = FakeSAS()
    monkeypatch.setattr(haystack_eval, "_sas_evaluator", lambda model, batch_size: fake)
    return fake


def test_sas_scores_take_the_best_gold_once_per_pair_and_skip_questions_without_gold(fake_sas):
    scores = sas_scores(["Paris", "Paris", "1066", "unknown"], [["City of Paris", "Paris"], ["Paris"], ["1066 AD"], []])

    assert scores == [1.0, 1.0, pytest.approx(1 / 4), None]
    assert len(fake_sas.calls) == 1
    golds, predictions = fake_sas.calls[0]
    pairs = list(zip(predictions, golds, strict=True))
    assert pairs == [("Paris", "City of Paris"), ("Paris", "Paris"), ("1066", "1066 AD")]


def test_sas_scores_without_any_gold_loads_no_model(monkeypatch):
    def fail(model, batch_size):
        raise AssertionError("no model should be loaded")

    monkeypatch.setattr(haystack_eval, "_sas_evaluator", fail)

    assert sas_scores(["unknown", "Louis XIV"], [[], []]) == [None, None]
    assert sas_scores([], []) == []


def test_sas_scores_length_mismatch_raises():
    with pytest.raises(ValueError, match="2 entries but `golds` has 1"):
        sas_scores(["a", "b"], [["a"]])


def test_sas_without_sentence_transformers_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)

    with pytest.raises(ImportError, match=r"haystack-fusion\[dense\]"):
        sas_scores(["Paris"], [["Paris"]])


def test_records_sas_keys_every_record_and_feeds_the_conversion(fake_sas):
    records = two_strategies()

    sas = records_sas(records, DATASET)

    assert set(sas) == {r.key() for r in records}
    assert sas[("concat_pf", 5, SETTING, "q2")] == 1.0
    assert sas[("concat_pf", 5, SETTING, "q3")] is None
    results = to_evaluation_run_results(records, DATASET, sas=sas)
    assert results["concat_pf"].results["sas"]["individual_scores"][1] == 1.0


def test_load_evaluation_run_results_reads_run_folders(tmp_path, fake_sas):
    records = two_strategies()
    for folder, strategy in (("a", "concatenation"), ("b", "concat_pf")):
        (tmp_path / folder).mkdir()
        lines = [r.to_json() for r in records if r.strategy == strategy]
        (tmp_path / folder / RESULTS_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")

    results = load_evaluation_run_results([tmp_path / "a", tmp_path / "b"], DATASET, sas=True)
    only_a = load_evaluation_run_results(str(tmp_path / "a"), DATASET)

    assert list(results) == ["concatenation", "concat_pf"]
    assert "sas" in results["concat_pf"].results
    assert list(only_a) == ["concatenation"]
    assert "sas" not in only_a["concatenation"].results
    with pytest.raises(FileNotFoundError, match=r"No results\.jsonl records"):
        load_evaluation_run_results(tmp_path / "empty", DATASET)


def test_a_repeated_record_keeps_the_first_one(caplog):
    records = [*two_strategies(), make_record("concat_pf", "q2", "in 1066")]

    results = to_evaluation_run_results(records, DATASET)

    assert results["concat_pf"].inputs["predicted_answer"][1] == "1066"
    assert "1 records repeat" in caplog.text
