"""
An evaluation run as Haystack's evaluation types, and an optional semantic-answer-similarity (SAS) score.

`to_evaluation_run_results` turns a run's records into one `haystack.evaluation.EvaluationRunResult` per (strategy,
k, setting), so Haystack's `aggregated_report`, `detailed_report` and `comparative_detailed_report` work on them, with
our scores (`metrics`) as fractions in [0, 1] as Haystack's evaluators report them. `sas_scores` adds Haystack's
`SASEvaluator` on the packaged all-MiniLM-L6-v2 model (the `dense` extra). See `docs/evaluation-haystack.md`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from haystack import logging
from haystack.evaluation import EvaluationRunResult

from haystack_fusion.corpus import Question
from haystack_fusion.evaluation.datasets import EvalDataset
from haystack_fusion.evaluation.runner import RESULTS_FILE, QuestionRecord, read_records

if TYPE_CHECKING:
    from haystack.components.evaluators import SASEvaluator

logger = logging.getLogger(__name__)

__all__ = [
    "INPUT_COLUMNS",
    "METRICS",
    "RecordKey",
    "load_evaluation_run_results",
    "record_key",
    "records_sas",
    "run_name",
    "sas_scores",
    "to_evaluation_run_results",
]

RecordKey = tuple[str, int, str, str]
"""Identifies one record: (strategy, top_k, setting, question_id); the key of the `sas` mapping."""

INPUT_COLUMNS = ("question_id", "question", "ground_truth_answers", "answerable", "predicted_answer")
"""The `inputs` of every `EvaluationRunResult`, in order (the leading columns of its detailed report)."""

METRICS = ("exact_match", "f1", "accuracy", "reject")
"""The metrics every `EvaluationRunResult` holds; `sas` comes after them when SAS scores are given."""

_SAS_EXTRA = (
    'SAS needs the `dense` extra (sentence-transformers and the packaged model): pip install "haystack-fusion[dense]"'
)


def record_key(record: QuestionRecord) -> RecordKey:
    """The key of a record in the `sas` mapping: (strategy, top_k, setting, question_id)."""
    return (record.strategy, record.top_k, record.setting, record.question_id)


def run_name(strategy: str, top_k: int, setting: str, *, single: bool) -> str:
    """The name of a run's `EvaluationRunResult`: the strategy when `single` (one k, one setting), else
    "<strategy> top-<k> <setting>"."""
    return strategy if single else f"{strategy} top-{top_k} {setting}"


def _mean(values: Iterable[float]) -> float | None:
    """The mean of the values that are not NaN; None when there are none."""
    kept = [value for value in values if not math.isnan(value)]
    return math.fsum(kept) / len(kept) if kept else None


def _metric(individual_scores: list[float]) -> dict[str, float | list[float] | None]:
    return {"score": _mean(individual_scores), "individual_scores": individual_scores}


def _questions_in_order(records: Sequence[QuestionRecord], dataset: EvalDataset) -> list[Question]:
    """The dataset's questions that some record answers, in dataset order; ValueError for an unknown id."""
    answered = {record.question_id for record in records}
    known = {question.id for question in dataset.questions}
    unknown = sorted(answered - known)
    if unknown:
        shown = ", ".join(repr(question_id) for question_id in unknown[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise ValueError(
            f"{len(unknown)} question id(s) of the records are not in dataset {dataset.name!r}: {shown}{more}; "
            "pass the dataset (and `--questions` / `--limit` choice) the run was made with"
        )
    return [question for question in dataset.questions if question.id in answered]


def _group(records: Sequence[QuestionRecord]) -> dict[tuple[str, int, str], dict[str, QuestionRecord]]:
    """Records by (strategy, k, setting), then question id, in first-appearance order (a repeated key: its first)."""
    groups: dict[tuple[str, int, str], dict[str, QuestionRecord]] = {}
    duplicates = 0
    for record in records:
        group = groups.setdefault((record.strategy, record.top_k, record.setting), {})
        if record.question_id in group:
            duplicates += 1
            continue
        group[record.question_id] = record
    if duplicates:
        logger.warning(
            "{count} records repeat the (strategy, top_k, setting, question id) of an earlier record; the first one "
            "is kept",
            count=duplicates,
        )
    return groups


def to_evaluation_run_results(
    records: Iterable[QuestionRecord],
    dataset: EvalDataset,
    *,
    sas: Mapping[RecordKey, float | None] | None = None,
) -> dict[str, EvaluationRunResult]:
    """
    Convert the records of an evaluation run into one Haystack `EvaluationRunResult` per (strategy, k, setting).

    Every result lists the same questions in the same order (those some record answers, in dataset order), so any two
    compare row by row with `comparative_detailed_report`; a question a run did not answer has `predicted_answer` None
    and NaN scores. Question texts and gold answers come from `dataset`.

    `inputs` (`INPUT_COLUMNS`): `question_id`, `question`, `ground_truth_answers` (`[]` for an unanswerable question),
    `answerable`, `predicted_answer`. `results`, fractions in [0, 1] (`{"score", "individual_scores"}`):
    `exact_match`, `f1`, `accuracy` on answerable questions, `reject` (1.0 for an abstention) on unanswerable ones,
    and `sas` on answerable ones when given. A row a metric does not apply to holds NaN, and `score` is the mean of
    the others (`summary.json`'s figure / 100), None when none applies.

    ### Usage example
    ```python
    from pathlib import Path

    from haystack_fusion.evaluation.datasets import load_dataset
    from haystack_fusion.evaluation.haystack_eval import to_evaluation_run_results
    from haystack_fusion.evaluation.runner import RESULTS_FILE, read_records

    dataset = load_dataset("squad2-dev-subset.json")
    records = read_records(Path("runs/squad") / RESULTS_FILE)
    results = to_evaluation_run_results(records, dataset)
    print(results["concat_pf"].aggregated_report())
    print(results["concatenation"].comparative_detailed_report(results["concat_pf"], keep_columns=["predicted_answer"]))
    ```

    :param records: The records of one run or several, in any order; of repeated keys the first is kept.
    :param dataset: The dataset the run was made with.
    :param sas: SAS score by `record_key` (`records_sas`); None leaves the `sas` metric out.
    :returns: `EvaluationRunResult` by `run_name`, in the order the records first name each run.
    :raises ValueError: If there are no records, a record's question id is not in `dataset` or its `answerable`
        disagrees with it, or `sas` has no score for an answered answerable question.
    """
    records = list(records)
    if not records:
        raise ValueError("no records to convert: the run answered no question")
    questions = _questions_in_order(records, dataset)
    groups = _group(records)
    single = len({top_k for _, top_k, _ in groups}) == 1 and len({setting for _, _, setting in groups}) == 1

    results: dict[str, EvaluationRunResult] = {}
    for (strategy, top_k, setting), by_id in groups.items():
        name = run_name(strategy, top_k, setting, single=single)
        missing = len(questions) - len(by_id)
        if missing:
            logger.warning(
                "Run {run_name!r} did not answer {missing} of the {total} questions; their rows have no prediction "
                "and NaN scores",
                run_name=name,
                missing=missing,
                total=len(questions),
            )
        inputs: dict[str, list] = {column: [] for column in INPUT_COLUMNS}
        scores: dict[str, list[float]] = {metric: [] for metric in (*METRICS, *(("sas",) if sas is not None else ()))}
        for question in questions:
            record = by_id.get(question.id)
            answerable = not question.is_impossible
            if record is not None and record.answerable != answerable:
                raise ValueError(
                    f"Record {record_key(record)} says answerable={record.answerable}, but question {question.id!r} "
                    f"of dataset {dataset.name!r} is {'answerable' if answerable else 'unanswerable'}: "
                    "is this the dataset the run was made with?"
                )
            inputs["question_id"].append(question.id)
            inputs["question"].append(question.question)
            inputs["ground_truth_answers"].append(list(question.answers))
            inputs["answerable"].append(answerable)
            inputs["predicted_answer"].append(record.prediction if record is not None else None)
            for metric, value in _row_scores(record, answerable, sas).items():
                scores[metric].append(value)
        results[name] = EvaluationRunResult(
            run_name=name, inputs=inputs, results={metric: _metric(values) for metric, values in scores.items()}
        )
    return results


def _row_scores(
    record: QuestionRecord | None, answerable: bool, sas: Mapping[RecordKey, float | None] | None
) -> dict[str, float]:
    """One question's individual scores by metric; NaN where the metric does not apply or there is no record."""
    row = dict.fromkeys((*METRICS, *(("sas",) if sas is not None else ())), math.nan)
    if record is None:
        return row
    if not answerable:
        row["reject"] = float(record.score.unknown)
        return row
    row.update(exact_match=record.score.em, f1=record.score.f1, accuracy=record.score.accuracy)
    if sas is not None:
        value = sas.get(record_key(record))
        if value is None:
            raise ValueError(
                f"`sas` has no score for the answerable record {record_key(record)}: compute it with `records_sas` "
                "over the same records"
            )
        row["sas"] = float(value)
    return row


def _sas_evaluator(model: str | None, batch_size: int) -> SASEvaluator:
    """A warmed-up `SASEvaluator` on `model` (None: the packaged all-MiniLM-L6-v2)."""
    try:
        import sentence_transformers  # noqa: F401
    except ImportError as error:
        raise ImportError(_SAS_EXTRA) from error
    from haystack.components.evaluators import SASEvaluator

    from haystack_fusion.embeddings import packaged_embedding_model_path

    evaluator = SASEvaluator(model=packaged_embedding_model_path() if model is None else model, batch_size=batch_size)
    evaluator.warm_up()
    return evaluator


def sas_scores(
    predictions: Sequence[str],
    golds: Sequence[Sequence[str]],
    *,
    model: str | None = None,
    batch_size: int = 32,
) -> list[float | None]:
    """
    Semantic answer similarity (SAS) of each prediction to its gold answers, with Haystack's `SASEvaluator`.

    A question with several gold answers scores the best of them (each distinct pair is scored once); an
    unanswerable question is not scored (None). Unit: with a bi-encoder such as all-MiniLM-L6-v2, the cosine similarity
    of the two embeddings, about 0.0 (unrelated) to 1.0 (same meaning), not calibrated ("Paris, France" vs "Paris"
    about 0.93, "banana" vs "Paris" about 0.17); a cross-encoder's score, squashed by a sigmoid when above 1. Texts
    beyond the model's `max_seq_length` (256 word pieces) are truncated. The other words of a long answer dilute it:
    compare strategies whose answers have a similar length (`docs/evaluation-haystack.md`).

    ### Usage example
    ```python
    from haystack_fusion.evaluation.haystack_eval import sas_scores

    print(sas_scores(["Paris, France", "banana", "unknown"], [["Paris"], ["Paris"], []]))
    # [0.93..., 0.16..., None]
    ```

    :param predictions: The predicted answers, one per question.
    :param golds: The gold answers of each question; empty for unanswerable ones.
    :param model: A sentence-transformers model folder or name; None: the packaged all-MiniLM-L6-v2, nothing downloaded.
    :param batch_size: Texts encoded at once.
    :returns: One score per question, in order; None for a question without gold answers.
    :raises ValueError: If `predictions` and `golds` differ in length.
    :raises ImportError: If the `dense` extra is not installed.
    :raises FileNotFoundError: If `model` is None and the packaged model folder is missing.
    """
    if len(predictions) != len(golds):
        raise ValueError(f"`predictions` has {len(predictions)} entries but `golds` has {len(golds)}")
    pairs: dict[tuple[str, str], int] = {}
    for prediction, answers in zip(predictions, golds, strict=True):
        for gold in answers:
            pairs.setdefault((prediction, gold), len(pairs))
    if not pairs:
        return [None] * len(predictions)
    evaluator = _sas_evaluator(model, batch_size)
    unique = list(pairs)
    output = evaluator.run(
        ground_truth_answers=[gold for _, gold in unique], predicted_answers=[prediction for prediction, _ in unique]
    )
    individual_scores: list[float] = output["individual_scores"]  # type: ignore[assignment]
    similarity = [float(score) for score in individual_scores]
    logger.debug("SAS scored {pairs} (prediction, gold) pairs", pairs=len(unique))
    return [
        max(similarity[pairs[(prediction, gold)]] for gold in answers) if answers else None
        for prediction, answers in zip(predictions, golds, strict=True)
    ]


def records_sas(
    records: Iterable[QuestionRecord],
    dataset: EvalDataset,
    *,
    model: str | None = None,
    batch_size: int = 32,
) -> dict[RecordKey, float | None]:
    """
    The SAS of every record (`sas_scores` against the dataset's gold answers, one model load), for the `sas`
    parameter of `to_evaluation_run_results`; None for unanswerable questions.

    :raises ValueError: If a record's question id is not in `dataset`.
    :raises ImportError: If the `dense` extra is not installed (only when some question has a gold answer).
    """
    records = list(records)
    by_id = {question.id: question for question in _questions_in_order(records, dataset)}
    scores = sas_scores(
        [record.prediction for record in records],
        [list(by_id[record.question_id].answers) for record in records],
        model=model,
        batch_size=batch_size,
    )
    return {record_key(record): score for record, score in zip(records, scores, strict=True)}


def load_evaluation_run_results(
    runs: str | Path | Sequence[str | Path],
    dataset: EvalDataset,
    *,
    sas: bool = False,
    sas_model: str | None = None,
) -> dict[str, EvaluationRunResult]:
    """
    Read evaluation run folders (`eval --out`) and convert their records with `to_evaluation_run_results`.

    ### Usage example
    ```python
    from haystack_fusion.evaluation.datasets import load_dataset
    from haystack_fusion.evaluation.haystack_eval import load_evaluation_run_results

    results = load_evaluation_run_results("runs/squad", load_dataset("squad2-dev-subset.json"), sas=True)
    for name, result in results.items():
        print(name, result.aggregated_report())
    ```

    :param runs: One run folder or several (e.g. one per noise ratio).
    :param sas: Whether to add the `sas` metric (`records_sas`, the `dense` extra), with `sas_model`.
    :raises FileNotFoundError: If the folders hold no records.
    :raises ValueError: As `to_evaluation_run_results`.
    """
    folders = [Path(runs)] if isinstance(runs, str | Path) else [Path(run) for run in runs]
    records = [record for folder in folders for record in read_records(folder / RESULTS_FILE)]
    if not records:
        raise FileNotFoundError(f"No {RESULTS_FILE} records in {', '.join(str(folder) for folder in folders)}")
    scores = records_sas(records, dataset, model=sas_model) if sas else None
    return to_evaluation_run_results(records, dataset, sas=scores)
