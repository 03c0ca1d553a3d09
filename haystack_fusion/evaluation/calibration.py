"""
Calibration of answer confidence, from evaluation records: AUROC, selective answering, and `concat_pf`'s threshold.

A record's confidence is `evidence["confidence"]` (`answers.answer_confidence`); its AUROC (Mann-Whitney U over n+ x
n-) is read as `correct` (among answerable questions) and `answerable` (against unanswerable ones). Decoding is greedy,
so `concat_pf` at tau is replayed exactly from the concatenation and post_fusion records, with what each tau costs
(`view.question_cost`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
from scipy import stats

from haystack_fusion.evaluation.metrics import (
    _RNG_KEYWORD,
    BOOTSTRAP_RESAMPLES,
    CONFIDENCE,
    DEFAULT_SEED,
    mean_ci,
    rate_ci,
)
from haystack_fusion.evaluation.records import QuestionRecord
from haystack_fusion.evaluation.view import Question, ReportView, total

DEFAULT_THRESHOLDS: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(1, 20))
"""The tau grid of a sweep: 0.05, 0.10, ..., 0.95."""


def answering_confidence(record: QuestionRecord) -> float | None:
    """The confidence that the system answers: the answer's confidence, 1 minus it for an abstention; None without."""
    confidence = record.evidence.get("confidence")
    if confidence is None:
        return None
    return 1.0 - float(confidence) if record.score.unknown else float(confidence)


def _auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    positives, negatives = scores[labels], scores[~labels]
    if not len(positives) or not len(negatives):
        return math.nan
    return float(stats.mannwhitneyu(positives, negatives).statistic / (len(positives) * len(negatives)))


def auroc(
    scores: Sequence[float], labels: Sequence[bool], *, seed: int = DEFAULT_SEED, resamples: int = BOOTSTRAP_RESAMPLES
) -> dict[str, Any] | None:
    """
    The AUROC of scores against binary labels, with its stratified 95% bootstrap CI (Kim et al. Appendix H).

    :returns: `auroc` in [0, 1], `ci` (None with fewer than two of a class), `positives`, `negatives`; None when
        either class is empty.
    :raises ValueError: If the lengths differ.
    """
    if len(scores) != len(labels):
        raise ValueError(f"one label per score: got {len(scores)} scores and {len(labels)} labels")
    values, flags = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    value = _auroc(values, flags)
    if math.isnan(value):
        return None
    positives, negatives = values[flags], values[~flags]
    result: dict[str, Any] = {"auroc": value, "ci": None, "positives": len(positives), "negatives": len(negatives)}
    if len(positives) < 2 or len(negatives) < 2:
        return result
    with warnings.catch_warnings():  # a constant statistic (perfect separation) is a point interval, not a problem
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        interval = stats.bootstrap(
            (positives, negatives),
            lambda pos, neg: _auroc(np.concatenate([pos, neg]), np.arange(len(pos) + len(neg)) < len(pos)),
            vectorized=False,
            n_resamples=resamples,
            confidence_level=CONFIDENCE,
            method="percentile",
            **{_RNG_KEYWORD: np.random.default_rng(seed)},
        ).confidence_interval
    if not (math.isnan(interval.low) or math.isnan(interval.high)):
        result["ci"] = [interval.low, interval.high]
    return result


def calibration(view: ReportView, *, seed: int = DEFAULT_SEED) -> list[dict[str, Any]]:
    """Both AUROC readings (`correct`, `answerable`: `auroc` results) for every run with confidences."""
    rows = []
    for (strategy, top_k, setting), group in view.by_strategy.items():
        scored = [(q.record, value) for q in group if (value := answering_confidence(q.record)) is not None]
        answerable = [(record, value) for record, value in scored if record.answerable]
        if scored:
            correct = auroc([v for _, v in answerable], [r.score.em == 1.0 for r, _ in answerable], seed=seed)
            versus = auroc([v for _, v in scored], [r.answerable for r, _ in scored], seed=seed)
            rows.append({"strategy": strategy, "top_k": top_k, "setting": setting, "n": len(scored),
                         "correct": correct, "answerable": versus})  # fmt: skip
    return rows


class Replayed(NamedTuple):
    """One question's scores under a replayed tau, the stage that answered it and its cost in US dollars (None
    without prices)."""

    answerable: bool
    em: float
    f1: float
    unknown: bool
    stage: str
    cost: float | None = None

    @property
    def correct(self) -> bool:
        """SQuAD 2.0 EM: exactly right on an answerable question, an abstention on an unanswerable one."""
        return bool(self.em == 1.0) if self.answerable else self.unknown


def _fallback_records(questions: Sequence[Question]) -> dict[tuple[int, str, str], Question]:
    """The fallback rounds' question of each (k, setting, question id): a `post_fusion` record, else a record of a
    question that fell back (`concat_pf`, `cascade`), whose answer the fallback rounds gave; the first found."""
    later: dict[tuple[int, str, str], Question] = {}
    for question in questions:
        record = question.record
        if record.strategy == "post_fusion" or question.fell_back:
            key = (record.top_k, record.setting, record.question_id)
            if record.strategy == "post_fusion" and later.get(key, question).record.strategy != "post_fusion":
                del later[key]
            later.setdefault(key, question)
    return later


def _judged(questions: Sequence[Question]) -> dict[tuple[int, str, str], Question]:
    """The `concat_pf` or `cascade` question of each (k, setting, question id) whose stage trace holds the first
    round's confidence (its router's: the agreement of sampled answers, or log-probabilities); the first of them."""
    judged: dict[tuple[int, str, str], Question] = {}
    for question in questions:
        record = question.record
        if (record.evidence.get("stages") or [{}])[0].get("confidence") is not None:
            judged.setdefault((record.top_k, record.setting, record.question_id), question)
    return judged


def _first_cost(first: Question, judged: Question | None) -> float | None:
    """The first round's cost: the concatenation record's; with a judging record, that record's cost on the first
    round's models (its call and the agreement's samples)."""
    if judged is None:
        return first.cost
    return total(cost for model, cost in judged.model_costs.items() if model in first.usage)


def _later_cost(later: Question, first_cost: float | None) -> float | None:
    """The fallback rounds' cost: a post_fusion record's whole cost; a fallen-back record's cost less its first round,
    taken to be the replayed one's (same first-round model, greedy decoding)."""
    cost = later.cost
    if cost is None or later.record.strategy == "post_fusion":
        return cost
    return None if first_cost is None else max(0.0, cost - first_cost)


def replay(view: ReportView, tau: float | None) -> dict[tuple[int, str], dict[str, Replayed]]:
    """
    Replay `concat_pf` at tau (None: the text-only fallback, Liu et al.) from the questions with a `concatenation`
    record (the first round; the first of the folders) with a confidence, its own or, when it has none, the one a
    `concat_pf` or `cascade` run's router gave the same first answer (`_judged`: the agreement of sampled answers,
    which a lone concatenation call does not have), and a fallback rounds' record at the same k and setting
    (`_fallback_records`: a `post_fusion` record, else a `concat_pf` or `cascade` record that fell back, from any
    folder, e.g. one run on a stronger model). A question answered at the first round by the judging run has no
    fallback record: it is replayed at the taus that keep its answer (confidence >= tau), left out at the others
    (`sweep` keeps only the taus that replay every question). An unknown first answer, or one the answer checks rejected
    (`answer_source` "invalid"), is passed on at every tau, as `UnknownRouter` passes it on. Each outcome's `cost`
    (with the view's prices) is the first round's cost plus, when the question is passed on, the fallback rounds' cost.

    :returns: (k, setting) -> question id -> `Replayed`.
    """
    return _replay_at(_first_rounds(view), tau)


_FirstRound = tuple[Question, Question | None, Question | None, float]
"""A replayable question: (its concatenation record, fallback record, judging record, first-round confidence)."""


def _first_rounds(view: ReportView) -> list[_FirstRound]:
    """The questions `replay` replays, the same at every tau (`replay` says which)."""
    index: dict[tuple[str, int, str, str], Question] = {}
    questions = [q for run in view.runs.values() for q in run.questions]  # folder by folder
    for question in questions:
        index.setdefault(question.record.key(), question)
    later, judging = _fallback_records(questions), _judged(questions)
    rounds = []
    for (strategy, top_k, setting, question_id), first in index.items():
        fused, judged = later.get((top_k, setting, question_id)), judging.get((top_k, setting, question_id))
        confidence = first.record.evidence.get("confidence")
        if confidence is not None:
            judged = None  # the first round's own confidence: the run judged its answer as a replay would
        elif judged is not None:
            confidence = judged.record.evidence["stages"][0]["confidence"]
        if strategy == "concatenation" and confidence is not None and (fused is not None or judged is not None):
            rounds.append((first, fused, judged, float(confidence)))
    return rounds


def _replay_at(rounds: Sequence[_FirstRound], tau: float | None) -> dict[tuple[int, str], dict[str, Replayed]]:
    replayed: dict[tuple[int, str], dict[str, Replayed]] = {}
    for first, fused, judged, confidence in rounds:
        rejected = first.record.evidence.get("answer_source") == "invalid"  # the router passes it on too
        fell_back = first.record.score.unknown or rejected or (tau is not None and confidence < tau)
        if fell_back and fused is None:
            continue
        chosen, stage = (fused.record, "post_fusion") if fell_back and fused else (first.record, "concatenation")
        cost = _first_cost(first, judged)
        if fell_back and cost is not None and fused is not None:
            extra = _later_cost(fused, cost)
            cost = None if extra is None else cost + extra
        outcome = Replayed(chosen.answerable, chosen.score.em, chosen.score.f1, chosen.score.unknown, stage, cost)
        replayed.setdefault((first.record.top_k, first.record.setting), {})[first.record.question_id] = outcome
    return replayed


def replay_summary(outcomes: Iterable[Replayed], *, seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """
    The rates of replayed outcomes, in percent with 95% bootstrap CIs: `squad2_em`, `em`, `f1` (answerable),
    `reject_rate` (unanswerable answered "unknown") and `fallback_rate` (passed on to the fallback rounds); and
    `cost_per_question` in US dollars with its CI (None unless every outcome has a cost).
    """
    items = list(outcomes)
    values: dict[str, list[Any]] = {
        "squad2_em": [o.correct for o in items],
        "em": [o.em for o in items if o.answerable],
        "f1": [o.f1 for o in items if o.answerable],
        "reject_rate": [o.unknown for o in items if not o.answerable],
        "fallback_rate": [o.stage != "concatenation" for o in items],
    }
    summary: dict[str, Any] = {"n": len(items)}
    for name, flags in values.items():
        summary[name] = 100.0 * sum(flags) / len(flags) if flags else None
        summary[f"{name}_ci"] = rate_ci(flags, seed=seed) if flags else None
    costs = [o.cost for o in items]
    priced = bool(costs) and None not in costs
    summary["cost_per_question"] = sum(c for c in costs if c is not None) / len(costs) if priced else None
    summary["cost_per_question_ci"] = mean_ci([c for c in costs if c is not None], seed=seed) if priced else None
    return summary


def sweep(
    view: ReportView, thresholds: Sequence[float] = DEFAULT_THRESHOLDS, *, seed: int = DEFAULT_SEED
) -> list[dict[str, Any]]:
    """Replay `concat_pf` at each tau of a grid and at tau None (text only): one row per (k, setting, tau), those keys
    plus `replay_summary`'s rates and cost; a tau that replays fewer questions than tau None (above
    the tau of a judging run, `replay`) has no row."""
    rounds = _first_rounds(view)
    rows = [
        {"top_k": top_k, "setting": setting, "tau": tau, **replay_summary(outcomes.values(), seed=seed)}
        for tau in [None, *thresholds]
        for (top_k, setting), outcomes in _replay_at(rounds, tau).items()
    ]
    whole = {(row["top_k"], row["setting"]): row["n"] for row in rows if row["tau"] is None}
    return [row for row in rows if row["n"] >= whole.get((row["top_k"], row["setting"]), 0)]


def _cheapness(row: dict[str, Any]) -> float:
    """A row's cost per question, else its fallback rate (the fallback rounds' calls) when the cost is unknown."""
    return row["cost_per_question"] if row.get("cost_per_question") is not None else row["fallback_rate"]


def choose(
    rows: Sequence[dict[str, Any]],
    *,
    target_accuracy: float | None = None,
    target_fallback: float | None = None,
) -> dict[str, Any] | None:
    """
    The sweep row (a tau, not the text-only row) to run with. With no target: the highest SQuAD 2.0 EM, ties to the
    smaller fallback rate, then to the smaller tau. `target_accuracy` (SQuAD 2.0 EM, %): the cheapest row that reaches
    it (cost per question, else fallback rate). `target_fallback` (%): the most accurate row whose fallback rate is
    at most it.

    :returns: The row; None for no rows, or no row that meets the target.
    :raises ValueError: If both targets are given, or a target is outside [0, 100].
    """
    if target_accuracy is not None and target_fallback is not None:
        raise ValueError("give `target_accuracy` or `target_fallback`, not both")
    for name, target in (("target_accuracy", target_accuracy), ("target_fallback", target_fallback)):
        if target is not None and not 0.0 <= target <= 100.0:
            raise ValueError(f"`{name}` is a percentage in [0, 100], got {target!r}")
    candidates = [row for row in rows if row.get("squad2_em") is not None and row.get("tau") is not None]
    if target_accuracy is not None:
        reaching = [row for row in candidates if row["squad2_em"] >= target_accuracy]
        return min(reaching, key=lambda row: (_cheapness(row), -row["squad2_em"], row["tau"]), default=None)
    if target_fallback is not None:
        candidates = [row for row in candidates if row["fallback_rate"] <= target_fallback]
    return max(candidates, key=lambda row: (row["squad2_em"], -row["fallback_rate"], -row["tau"]), default=None)


def choice_reason(
    best: dict[str, Any] | None, *, target_accuracy: float | None = None, target_fallback: float | None = None
) -> str:
    """Why `choose` picked its row (or none), one sentence for the report."""
    if target_accuracy is not None:
        if best is None:
            return f"No tau reaches {target_accuracy:g}% SQuAD 2.0 EM."
        cost = "cheapest" if best.get("cost_per_question") is not None else "least falling back (no prices)"
        return f"tau {best['tau']:g} is the {cost} tau with SQuAD 2.0 EM >= {target_accuracy:g}%."
    if target_fallback is not None:
        if best is None:
            return f"No tau passes at most {target_fallback:g}% of the questions on to the fallback rounds."
        return f"tau {best['tau']:g} is the most accurate tau whose fallback rate is at most {target_fallback:g}%."
    return "" if best is None else f"tau {best['tau']:g} has the highest SQuAD 2.0 EM."


def calibrate(
    view: ReportView,
    *,
    seed: int = DEFAULT_SEED,
    target_accuracy: float | None = None,
    target_fallback: float | None = None,
) -> dict[str, Any]:
    """
    The calibration figures of a report: `auroc` (`calibration`), `concat_pf_sweep` (`sweep`, costs at the view's
    prices) and `tau_choice` (`choose`'s `tau`, `top_k`, `setting`, the `target`, the `reason`; None without a sweep).

    :param target_accuracy: The SQuAD 2.0 EM (%) the chosen tau must reach.
    :param target_fallback: The largest share of questions that fall back (%) the chosen tau may have.
    :raises ValueError: As `choose`.
    """
    targets = {"target_accuracy": target_accuracy, "target_fallback": target_fallback}
    rows = sweep(view, seed=seed)
    best = choose(rows, **targets)
    return {
        "auroc": calibration(view, seed=seed),
        "concat_pf_sweep": rows,
        "tau_choice": {
            **({key: best[key] for key in ("tau", "top_k", "setting")} if best else {"tau": None}),
            "target": {key: value for key, value in targets.items() if value is not None} or None,
            "reason": choice_reason(best, **targets),
        }
        if rows
        else None,
    }
