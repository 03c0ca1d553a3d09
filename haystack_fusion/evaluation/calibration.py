"""
Calibration of answer confidence, from evaluation records: AUROC, selective answering, and `concat_pf`'s threshold.

A record's confidence is `evidence["confidence"]` (`answers.answer_confidence`); its AUROC (Mann-Whitney U over n+ x
n-) is read as `correct` (among answerable questions) and `answerable` (against unanswerable ones). Decoding is greedy,
so `concat_pf` at tau is replayed exactly from the concatenation and post_fusion records, with what each tau costs
(`cost.question_cost`).
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from scipy import stats

from haystack_fusion.evaluation.cost import Price, fell_back, model_usage, question_cost, usage_cost
from haystack_fusion.evaluation.metrics import (
    _RNG_KEYWORD,
    BOOTSTRAP_RESAMPLES,
    CONFIDENCE,
    DEFAULT_SEED,
    mean_ci,
    rate_ci,
)
from haystack_fusion.evaluation.records import QuestionRecord, group_runs

SELECTIVE_CHART = "selective_answering.png"

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


def calibration(records: Sequence[QuestionRecord], *, seed: int = DEFAULT_SEED) -> list[dict[str, Any]]:
    """Both AUROC readings (`correct`, `answerable`: `auroc` results) for every run with confidences."""
    rows = []
    for (strategy, top_k, setting), group in group_runs(records).items():
        scored = [(record, value) for record in group if (value := answering_confidence(record)) is not None]
        answerable = [(record, value) for record, value in scored if record.answerable]
        if scored:
            correct = auroc([v for _, v in answerable], [r.score.em == 1.0 for r, _ in answerable], seed=seed)
            versus = auroc([v for _, v in scored], [r.answerable for r, _ in scored], seed=seed)
            rows.append({"strategy": strategy, "top_k": top_k, "setting": setting, "n": len(scored),
                         "correct": correct, "answerable": versus})  # fmt: skip
    return rows


def selective_curve(records: Sequence[QuestionRecord]) -> list[tuple[float, float]]:
    """Selective answering: (coverage, accuracy) points in percent as the confidence threshold falls."""
    answered = sorted(
        ((float(r.evidence["confidence"]), r.answerable and r.score.em == 1.0) for r in records
         if r.evidence.get("confidence") is not None and not r.score.unknown),
        reverse=True,
    )  # fmt: skip
    right = np.cumsum([correct for _, correct in answered])
    return [(100.0 * i / len(records), 100.0 * float(right[i - 1]) / i) for i in range(1, len(answered) + 1)]


def draw_selective_chart(records: Sequence[QuestionRecord], out: Path) -> Path | None:
    """Draw `selective_answering.png` (one line per run with confidences); None when no run has them."""
    curves = {
        f"{strategy} (top-{top_k})": curve
        for (strategy, top_k, _), group in group_runs(records).items()
        if (curve := selective_curve(group))
    }
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.4))
    for label, curve in curves.items():
        axes.plot([c for c, _ in curve], [a for _, a in curve], label=label)
    axes.set(xlabel="coverage (% of questions answered)", ylabel="accuracy of the answered questions (EM %)",
             title="Selective answering: threshold on answer confidence", xlim=(0, 100), ylim=(0, 100))  # fmt: skip
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / SELECTIVE_CHART, dpi=120)
    plt.close(figure)
    return out / SELECTIVE_CHART


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


def _fallback_records(records: Sequence[QuestionRecord]) -> dict[tuple[int, str, str], QuestionRecord]:
    """The fallback rounds' record of each (k, setting, question): a `post_fusion` record, else a record of a question
    that fell back (`concat_pf`, `cascade`), whose answer the fallback rounds gave; the first such of the folders."""
    later: dict[tuple[int, str, str], QuestionRecord] = {}
    for record in records:
        if record.strategy == "post_fusion" or fell_back(record):
            key = (record.top_k, record.setting, record.question_id)
            if record.strategy == "post_fusion" and later.get(key, record).strategy != "post_fusion":
                del later[key]
            later.setdefault(key, record)
    return later


def _judged(records: Sequence[QuestionRecord]) -> dict[tuple[int, str, str], QuestionRecord]:
    """The `concat_pf` or `cascade` record of each (k, setting, question) whose stage trace holds the first round's
    confidence (its router's: the agreement of sampled answers, or log-probabilities); the first of the folders."""
    judged: dict[tuple[int, str, str], QuestionRecord] = {}
    for record in records:
        stages = record.evidence.get("stages") or [{}]
        if stages[0].get("confidence") is not None:
            judged.setdefault((record.top_k, record.setting, record.question_id), record)
    return judged


def _first_cost(
    first: QuestionRecord, judged: QuestionRecord | None, prices: Mapping[str, Price] | None
) -> float | None:
    """The first round's cost: the concatenation record's; with a judging record, that record's usage on the first
    round's models (its call and the agreement's samples)."""
    if prices is None:
        return None
    if judged is None:
        return question_cost(first, prices)
    models = model_usage(first)
    costs = [usage_cost(usage, prices.get(m)) for m, usage in model_usage(judged).items() if m in models]
    return None if None in costs else sum(c for c in costs if c is not None)


def _later_cost(later: QuestionRecord, first_cost: float | None, prices: Mapping[str, Price]) -> float | None:
    """The fallback rounds' cost: a post_fusion record's whole cost; a fallen-back record's cost less its first round,
    taken to be the replayed one's (same first-round model, greedy decoding)."""
    cost = question_cost(later, prices)
    if cost is None or later.strategy == "post_fusion":
        return cost
    return None if first_cost is None else max(0.0, cost - first_cost)


def replay(
    records: Sequence[QuestionRecord], tau: float | None, *, prices: Mapping[str, Price] | None = None
) -> dict[tuple[int, str], dict[str, Replayed]]:
    """
    Replay `concat_pf` at tau (None: the text-only fallback, Liu et al.) from the questions with a `concatenation`
    record (the first round; the first of the folders) with a confidence, its own or, when it has none, the one a
    `concat_pf` or `cascade` run's router gave the same first answer (`_judged`: the agreement of sampled answers,
    which a lone concatenation call does not have), and a fallback rounds' record at the same k and setting
    (`_fallback_records`: a `post_fusion` record, else a `concat_pf` or `cascade` record that fell back, from any
    folder, e.g. one run on a stronger model). A question answered at the first round by the judging run has no
    fallback record: it is replayed at the taus that keep its answer (confidence >= tau), left out at the others
    (`sweep` keeps only the taus that replay every question). An unknown first answer, or one the answer checks rejected
    (`answer_source` "invalid"), is passed on at every tau, as `UnknownRouter` passes it on.

    :param prices: US dollars per million tokens per model: each outcome's `cost` is the first round's cost plus, when
        the question is passed on, the fallback rounds' cost.
    :returns: (k, setting) -> question id -> `Replayed`.
    """
    index: dict[tuple[str, int, str, str], QuestionRecord] = {}
    for record in records:
        index.setdefault(record.key(), record)
    later, judging = _fallback_records(records), _judged(records)
    replayed: dict[tuple[int, str], dict[str, Replayed]] = {}
    for (strategy, top_k, setting, question_id), first in index.items():
        fused, judged = later.get((top_k, setting, question_id)), judging.get((top_k, setting, question_id))
        confidence = first.evidence.get("confidence")
        if confidence is not None:
            judged = None  # the first round's own confidence: the run judged its answer as a replay would
        elif judged is not None:
            confidence = judged.evidence["stages"][0]["confidence"]
        if strategy != "concatenation" or confidence is None or (fused is None and judged is None):
            continue
        rejected = first.evidence.get("answer_source") == "invalid"  # the router passes a rejected answer on too
        fell_back = first.score.unknown or rejected or (tau is not None and confidence < tau)
        if fell_back and fused is None:
            continue
        chosen, stage = (fused, "post_fusion") if fell_back and fused else (first, "concatenation")
        cost = _first_cost(first, judged, prices)
        if fell_back and cost is not None and fused is not None:
            extra = _later_cost(fused, cost, prices or {})
            cost = None if extra is None else cost + extra
        outcome = Replayed(chosen.answerable, chosen.score.em, chosen.score.f1, chosen.score.unknown, stage, cost)
        replayed.setdefault((top_k, setting), {})[question_id] = outcome
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
    records: Sequence[QuestionRecord],
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    *,
    seed: int = DEFAULT_SEED,
    prices: Mapping[str, Price] | None = None,
) -> list[dict[str, Any]]:
    """Replay `concat_pf` at each tau of a grid and at tau None (text only): one row per (k, setting, tau), those keys
    plus `replay_summary`'s rates (and cost, with `prices`); a tau that replays fewer questions than tau None (above
    the tau of a judging run, `replay`) has no row."""
    rows = [
        {"top_k": top_k, "setting": setting, "tau": tau, **replay_summary(outcomes.values(), seed=seed)}
        for tau in [None, *thresholds]
        for (top_k, setting), outcomes in replay(records, tau, prices=prices).items()
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


def consistency(records: Sequence[QuestionRecord]) -> tuple[int, int]:
    """How many `concat_pf` records the text-only replay reproduces: (same prediction outcome, compared), a check that
    the replay is exact on this run."""
    replayed = replay(records, None)
    pairs = [
        (outcome, record.score)
        for record in records
        if record.strategy == "concat_pf"
        and (outcome := replayed.get((record.top_k, record.setting), {}).get(record.question_id)) is not None
    ]
    same = sum((o.em, o.f1, o.unknown) == (score.em, score.f1, score.unknown) for o, score in pairs)
    return same, len(pairs)


def _percent(count: float, total: int) -> float | None:
    return 100.0 * count / total if total else None


def verification_stats(records: Sequence[QuestionRecord]) -> list[dict[str, Any]]:
    """How much SuRe's verification decided, per run with verifier scores (Kim et al., Eq. 4-6), in %."""
    rows = []
    for (strategy, top_k, setting), group in group_runs(records).items():
        scored = [scores for r in group if len(scores := r.evidence.get("scores") or []) > 1]
        counted = [r.evidence for r in group if r.evidence.get("label_summaries") is not None]
        judged = [v for scores in scored if None not in (v := [s.get("validity") for s in scores])]
        if scored:
            rows.append({
                "strategy": strategy, "top_k": top_k, "setting": setting, "verified": len(scored),
                "not_all_valid": _percent(sum(any(x < 0.5 for x in v) for v in judged), len(judged)),
                "first_wins": _percent(sum(scores[0].get("candidate_index") == 0 for scores in scored), len(scored)),
                "label_summaries": _percent(sum(e["label_summaries"] for e in counted),
                                            sum(len(e.get("candidates") or []) for e in counted)),
            })  # fmt: skip
    return rows


def _reason_kind(reason: str | None) -> str:
    """A stage trace's reason without its figures: "confidence 0.18 < 0.25" -> "low confidence"."""
    if not reason:
        return "none"
    if reason.startswith("confidence"):
        return "low confidence"
    return "split vote" if reason.startswith("vote share") else reason


def stage_stats(records: Sequence[QuestionRecord]) -> list[dict[str, Any]]:
    """Which stage of a fallback strategy answered (`answered_at`, %) and why questions left a stage (`reasons`)."""
    order = ["concatenation", "post_fusion", "sure"]
    rows = []
    for (strategy, top_k, setting), group in group_runs(records).items():
        traces: list[list[dict[str, Any]]] = [trace for r in group if (trace := r.evidence.get("stages"))]
        if not traces:
            continue
        answered = Counter(trace[-1]["stage"] for trace in traces)
        reasons: dict[str, dict[str, int]] = {}
        for step in (step for trace in traces for step in trace[:-1]):
            kinds = reasons.setdefault(step["stage"], {})
            kind = _reason_kind(step.get("reason"))
            kinds[kind] = kinds.get(kind, 0) + 1
        stages = sorted(answered, key=lambda stage: order.index(stage) if stage in order else len(order))
        shares = {stage: 100.0 * answered[stage] / len(traces) for stage in stages}
        rows.append({"strategy": strategy, "top_k": top_k, "setting": setting, "n": len(traces),
                     "answered_at": shares, "reasons": reasons})  # fmt: skip
    return rows


def _pct(value: float | None, ci: Sequence[float] | None = None) -> str:
    if value is None:
        return "–"
    return f"{value:.1f}" + (f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "")


def dollars(value: float | None, ci: Sequence[float] | None = None, *, missing: str = "–") -> str:
    """US dollars to three significant digits, with the interval when there is one: `0.000123 [0.000101, 0.00015]`;
    `missing` for None."""
    if value is None:
        return missing
    return f"{value:.3g}" + (f" [{ci[0]:.3g}, {ci[1]:.3g}]" if ci else "")


def _auc(result: dict[str, Any] | None) -> str:
    if result is None:
        return "–"
    interval = f" [{result['ci'][0]:.2f}, {result['ci'][1]:.2f}]" if result["ci"] else ""
    return f"{result['auroc']:.2f}{interval} ({result['positives']}/{result['negatives']})"


def markdown(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table: the header, then one line per row of cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def calibration_report(
    records: Sequence[QuestionRecord],
    out: Path,
    *,
    seed: int = DEFAULT_SEED,
    prices: Mapping[str, Price] | None = None,
    target_accuracy: float | None = None,
    target_fallback: float | None = None,
) -> tuple[str, dict[str, Any]]:
    """
    The calibration sections of a report, each only when its records are there.

    :param prices: US dollars per million tokens per model, for the replay's cost per question.
    :param target_accuracy: The SQuAD 2.0 EM (%) the chosen tau must reach (`choose`).
    :param target_fallback: The largest share of questions that fall back (%) the chosen tau may have (`choose`).
    :returns: (markdown, summary dict with `auroc`, `concat_pf_sweep`, `tau_choice` (the chosen `tau`, `top_k`,
        `setting`, `target`, `reason`; None without a sweep), `consistency`, `verification`, `stages`).
    :raises ValueError: As `choose`.
    """
    targets = {"target_accuracy": target_accuracy, "target_fallback": target_fallback}
    rows = sweep(records, seed=seed, prices=prices)
    best = choose(rows, **targets)
    summary: dict[str, Any] = {
        "auroc": calibration(records, seed=seed),
        "concat_pf_sweep": rows,
        "tau_choice": {
            **({key: best[key] for key in ("tau", "top_k", "setting")} if best else {"tau": None}),
            "target": {key: value for key, value in targets.items() if value is not None} or None,
            "reason": choice_reason(best, **targets),
        }
        if rows
        else None,
        "consistency": consistency(records),
        "verification": verification_stats(records),
        "stages": stage_stats(records),
    }
    parts = []
    if summary["auroc"]:
        chart = draw_selective_chart(records, out)
        table = markdown(
            ["strategy", "top-k", "questions", "AUROC correct", "AUROC answerable"],
            ([r["strategy"], r["top_k"], r["n"], _auc(r["correct"]), _auc(r["answerable"])] for r in summary["auroc"]),
        )
        parts.append(
            "\n## Answer confidence\n\nAUROC of the answering confidence with its 95% bootstrap CI and "
            "(positives/negatives): `correct` = answered exactly right among answerable questions; `answerable` = "
            f"answerable against unanswerable.\n\n{table}"
            + (f"\n\n![selective answering]({chart.name})\n" if chart else "")
        )
    if rows:
        priced = any(row["cost_per_question"] is not None for row in rows)
        shown = [
            row for row in rows if row is best or row["tau"] is None or round(row["tau"] * 100) in (20, 40, 60, 80)
        ]
        table = markdown(
            ["top-k", "tau", "questions", "SQuAD 2.0 EM", "EM", "F1", "reject rate", "fallback %",
             *(["cost/q $"] if priced else [])],
            ([r["top_k"], "–" if r["tau"] is None else r["tau"], r["n"],
              _pct(r["squad2_em"], r["squad2_em_ci"]) + (" **chosen**" if r is best else ""), _pct(r["em"], r["em_ci"]),
              _pct(r["f1"], r["f1_ci"]), _pct(r["reject_rate"], r["reject_rate_ci"]), _pct(r["fallback_rate"]),
              *([dollars(r["cost_per_question"], r["cost_per_question_ci"])] if priced else [])]
             for r in shown),
        )  # fmt: skip
        same, compared = summary["consistency"]
        parts.append(
            "\n## concat_pf replayed at each threshold\n\nReplayed exactly from the concatenation records (the first "
            "round) and the fallback rounds' records of the same questions: post_fusion, else a concat_pf or cascade "
            "record that fell back, from any folder given (tau `–`: text only, the paper's); a selection of the grid, "
            "all of it in summary.json. SQuAD 2.0 EM counts an unanswerable question right when the answer is unknown; "
            "fallback %: the share passed on to the fallback rounds"
            + ("; cost/q: the first round's cost, plus the fallback rounds' when passed on" if priced else "")
            + f".\n\n{table}\n\n{summary['tau_choice']['reason']}"
            + (f"\n\nThe text-only replay reproduces {same} of {compared} concat_pf records." if compared else "")
        )
    if summary["verification"]:
        table = markdown(
            ["strategy", "top-k", "verified", "validity not all True %", "candidate (a) wins %",
             "label-only summaries %"],
            ([r["strategy"], r["top_k"], r["verified"], _pct(r["not_all_valid"]), _pct(r["first_wins"]),
              _pct(r["label_summaries"])] for r in summary["verification"]),
        )  # fmt: skip
        parts.append(f"\n## SuRe's verification\n\n{table}")
    if summary["stages"]:
        table = markdown(
            ["strategy", "top-k", "questions", "answered at", "left a stage because"],
            ([r["strategy"], r["top_k"], r["n"],
              ", ".join(f"{stage} {share:.1f}%" for stage, share in r["answered_at"].items()),
              "; ".join(f"{stage}: " + ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items()))
                        for stage, kinds in r["reasons"].items()) or "–"] for r in summary["stages"]),
        )  # fmt: skip
        parts.append(
            "\n## Which stage answered\n\nThe fallback strategies' stage traces: the share of questions answered at "
            f"each stage, and why questions left a stage (number of questions).\n\n{table}"
        )
    return "\n".join(parts) + ("\n" if parts else ""), summary
