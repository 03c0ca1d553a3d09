"""Calibration of answer confidence (`evidence["confidence"]`) from evaluation records: AUROC (Mann-Whitney U), and
`concat_pf` replayed exactly at each threshold tau (decoding is greedy) with what each tau costs."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
from scipy import stats

from haystack_fusion.evaluation.metrics import BOOTSTRAP_RESAMPLES, DEFAULT_SEED, _bootstrap, mean_ci, rate_ci
from haystack_fusion.evaluation.records import QuestionRecord
from haystack_fusion.evaluation.view import Question, ReportView, total

DEFAULT_THRESHOLDS: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(1, 20))  # 0.05, ..., 0.95


def answering_confidence(record: QuestionRecord) -> float | None:
    """The confidence that the system answers: the answer's confidence, 1 minus it for an abstention; None without."""
    confidence = record.evidence.get("confidence")
    return None if confidence is None else 1.0 - float(confidence) if record.score.unknown else float(confidence)


def _auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    positives, negatives = scores[labels], scores[~labels]
    if not len(positives) or not len(negatives):
        return math.nan
    return float(stats.mannwhitneyu(positives, negatives).statistic / (len(positives) * len(negatives)))


def auroc(scores: Sequence[float], labels: Sequence[bool], *, seed: int = DEFAULT_SEED,
          resamples: int = BOOTSTRAP_RESAMPLES) -> dict[str, Any] | None:  # fmt: skip
    """The AUROC of scores against binary labels, with its stratified 95% bootstrap CI (Kim et al. Appendix H).
    :returns: `auroc` in [0, 1], `ci` (None with fewer than two of a class), `positives`, `negatives`; None when
        either class is empty. :raises ValueError: If the lengths differ."""
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
        low, high = _bootstrap((positives, negatives), lambda pos, neg: _auroc(
            np.concatenate([pos, neg]), np.arange(len(pos) + len(neg)) < len(pos)), paired=False, vectorized=False,
            seed=seed, resamples=resamples)  # fmt: skip
    if not (math.isnan(low) or math.isnan(high)):
        result["ci"] = [low, high]
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
    """One question's scores under a replayed tau, the stage that answered it and its cost in US dollars (or None)."""

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


def replay(view: ReportView, tau: float | None) -> dict[tuple[int, str], dict[str, Replayed]]:
    """Replay `concat_pf` at tau (None: the text-only fallback, Liu et al.) from the questions with a `concatenation`
    record (the first of the folders) with a confidence, its own or else the one a `concat_pf` or `cascade` run's
    router gave the same first answer, and a fallback rounds' record at the same k and setting (`post_fusion`, else a
    fallen-back `concat_pf` or `cascade` record, from any folder). A question the judging run answered at the first
    round is replayed only at the taus that keep its answer. An unknown or rejected (`answer_source` "invalid") first
    answer is passed on at every tau, as `UnknownRouter` does. `cost`: the first round's, plus the fallback rounds'
    when passed on (a fallen-back record's cost less its first round).
    :returns: (k, setting) -> question id -> `Replayed`."""
    return _replay_at(_first_rounds(view), tau)


_FirstRound = tuple[Question, Question | None, Question | None, float]  # concatenation, fallback, judging, confidence


def _first_rounds(view: ReportView) -> list[_FirstRound]:
    index: dict[tuple[str, int, str, str], Question] = {}
    later: dict[tuple[int, str, str], Question] = {}  # the fallback rounds': post_fusion's, else a fallen-back one's
    judging: dict[tuple[int, str, str], Question] = {}  # those whose stage trace holds the first round's confidence
    for question in (q for run in view.runs.values() for q in run.questions):  # folder by folder
        record = question.record
        key = (record.top_k, record.setting, record.question_id)
        index.setdefault(record.key(), question)
        if record.strategy == "post_fusion" and (key not in later or later[key].record.strategy != "post_fusion"):
            later[key] = question
        elif question.fell_back:
            later.setdefault(key, question)
        if (record.evidence.get("stages") or [{}])[0].get("confidence") is not None:
            judging.setdefault(key, question)
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
        # a judging record's first round: its cost on the first round's models (its call and the agreement's samples)
        cost = first.cost if judged is None else total(c for m, c in judged.model_costs.items() if m in first.usage)
        if fell_back and cost is not None and fused is not None:
            extra = fused.cost
            if extra is not None and fused.record.strategy != "post_fusion":
                extra = max(0.0, extra - cost)  # the fallen-back record's own first round, taken to be the replayed one
            cost = None if extra is None else cost + extra
        outcome = Replayed(chosen.answerable, chosen.score.em, chosen.score.f1, chosen.score.unknown, stage, cost)
        replayed.setdefault((first.record.top_k, first.record.setting), {})[first.record.question_id] = outcome
    return replayed


def replay_summary(outcomes: Iterable[Replayed], *, seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """The rates of replayed outcomes in percent with 95% bootstrap CIs: `squad2_em`, `em`, `f1`, `reject_rate`,
    `fallback_rate`; `cost_per_question` in US dollars with its CI (None unless every outcome has a cost)."""
    items = list(outcomes)
    values: dict[str, list[Any]] = {
        "squad2_em": [o.correct for o in items], "em": [o.em for o in items if o.answerable],
        "f1": [o.f1 for o in items if o.answerable], "reject_rate": [o.unknown for o in items if not o.answerable],
        "fallback_rate": [o.stage != "concatenation" for o in items]}  # fmt: skip
    summary: dict[str, Any] = {"n": len(items)}
    for name, flags in values.items():
        summary[name] = 100.0 * sum(flags) / len(flags) if flags else None
        summary[f"{name}_ci"] = rate_ci(flags, seed=seed) if flags else None
    costs = [o.cost for o in items if o.cost is not None]
    priced = bool(costs) and len(costs) == len(items)
    summary["cost_per_question"] = sum(costs) / len(costs) if priced else None
    summary["cost_per_question_ci"] = mean_ci(costs, seed=seed) if priced else None
    return summary


def sweep(view: ReportView, thresholds: Sequence[float] = DEFAULT_THRESHOLDS, *,
          seed: int = DEFAULT_SEED) -> list[dict[str, Any]]:  # fmt: skip
    """`replay` at tau None and each tau of a grid: one row per (k, setting, tau) with `replay_summary`'s figures; a
    tau that replays fewer questions than tau None has no row."""
    rounds = _first_rounds(view)
    rows = [{"top_k": k, "setting": setting, "tau": tau, **replay_summary(outcomes.values(), seed=seed)}
            for tau in [None, *thresholds] for (k, setting), outcomes in _replay_at(rounds, tau).items()]  # fmt: skip
    whole = {(row["top_k"], row["setting"]): row["n"] for row in rows if row["tau"] is None}
    return [row for row in rows if row["n"] >= whole.get((row["top_k"], row["setting"]), 0)]


def _cheapness(row: dict[str, Any]) -> float:
    """A row's cost per question, else its fallback rate when the cost is unknown."""
    return row["fallback_rate"] if row.get("cost_per_question") is None else row["cost_per_question"]


def choose(rows: Sequence[dict[str, Any]], *, target_accuracy: float | None = None,
           target_fallback: float | None = None) -> dict[str, Any] | None:  # fmt: skip
    """The sweep row (a tau, not the text-only row) to run with. With no target: the highest SQuAD 2.0 EM, ties to the
    smaller fallback rate, then to the smaller tau. `target_accuracy` (SQuAD 2.0 EM, %): the cheapest row that reaches
    it (cost per question, else fallback rate). `target_fallback` (%): the most accurate row whose fallback rate is
    at most it.
    :returns: The row; None for no rows, or no row that meets the target.
    :raises ValueError: If both targets are given, or a target is outside [0, 100]."""
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


def choice_reason(best: dict[str, Any] | None, *, target_accuracy: float | None = None,
                  target_fallback: float | None = None) -> str:  # fmt: skip
    """Why `choose` picked its row (or none), one sentence for the report."""
    if target_accuracy is not None:
        cost = "cheapest" if (best or {}).get("cost_per_question") is not None else "least falling back (no prices)"
        return (f"No tau reaches {target_accuracy:g}% SQuAD 2.0 EM." if best is None
                else f"tau {best['tau']:g} is the {cost} tau with SQuAD 2.0 EM >= {target_accuracy:g}%.")  # fmt: skip
    if target_fallback is not None:
        if best is None:
            return f"No tau passes at most {target_fallback:g}% of the questions on to the fallback rounds."
        return f"tau {best['tau']:g} is the most accurate tau whose fallback rate is at most {target_fallback:g}%."
    return "" if best is None else f"tau {best['tau']:g} has the highest SQuAD 2.0 EM."


def calibrate(view: ReportView, *, seed: int = DEFAULT_SEED, target_accuracy: float | None = None,
              target_fallback: float | None = None) -> dict[str, Any]:  # fmt: skip
    """The calibration figures of a report: `auroc` (`calibration`), `concat_pf_sweep` (`sweep`) and `tau_choice`
    (`choose`'s `tau`, `top_k`, `setting`, the `target`, the `reason`; None without a sweep). :raises ValueError: As
    `choose`."""
    targets = {"target_accuracy": target_accuracy, "target_fallback": target_fallback}
    rows = sweep(view, seed=seed)
    best = choose(rows, **targets)
    choice = {**({key: best[key] for key in ("tau", "top_k", "setting")} if best else {"tau": None}),
              "target": {key: value for key, value in targets.items() if value is not None} or None,
              "reason": choice_reason(best, **targets)}  # fmt: skip
    return {"auroc": calibration(view, seed=seed), "concat_pf_sweep": rows, "tau_choice": choice if rows else None}
