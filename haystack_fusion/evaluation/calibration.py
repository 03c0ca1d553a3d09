"""
Calibration of answer confidence, from evaluation records: AUROC, selective answering, and `concat_pf`'s threshold.

A record's confidence is `evidence["confidence"]` (`answers.answer_confidence`, the geometric mean of the answer tokens'
probabilities), recorded when the LLM returned log-probabilities; for an abstention it is the confidence in abstaining,
so the confidence that the system *answers* is `answering_confidence`. Its AUROC (`scipy.stats.mannwhitneyu`'s U over n+
x n-, ties counting half) is read two ways: `correct` (answered exactly right, among answerable questions) and
`answerable` (answerable against unanswerable questions). SQuAD 2.0 EM (`squad2_em`) counts an answerable question when
its answer matches and an unanswerable one when the system abstains.

`concat_pf`'s threshold tau is replayed from records, exactly: decoding is greedy, so `concat_pf` at tau answers with
the concatenation record's answer unless it abstains or its confidence is below tau, and then with the post_fusion
record's answer (the same k single-passage calls).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from haystack_fusion.evaluation.records import QuestionRecord
from haystack_fusion.evaluation.stats import _RNG_KEYWORD, BOOTSTRAP_RESAMPLES, CONFIDENCE, DEFAULT_SEED, rate_ci

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
    The AUROC of scores against binary labels, with its 95% percentile-bootstrap CI over questions.

    The bootstrap is stratified: positives and negatives are resampled apart (`scipy.stats.bootstrap` with two
    independent samples), so every resample has both classes; 1,000 resamples, as Kim et al. Appendix H.

    :param scores: One score per question.
    :param labels: One label per question (True: positive).
    :returns: `auroc` (in [0, 1]), `ci` ([low, high]; None with fewer than two of a class),
        `positives`, `negatives`; None when either class is empty.
    :raises ValueError: If the lengths differ.
    """
    if len(scores) != len(labels):
        raise ValueError(f"one label per score: got {len(scores)} scores and {len(labels)} labels")
    values, flags = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    value = _auroc(values, flags)
    if math.isnan(value):
        return None
    positives, negatives = values[flags], values[~flags]
    if len(positives) < 2 or len(negatives) < 2:
        return {"auroc": value, "ci": None, "positives": len(positives), "negatives": len(negatives)}
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
    ci = None if math.isnan(interval.low) or math.isnan(interval.high) else [interval.low, interval.high]
    return {"auroc": value, "ci": ci, "positives": int(flags.sum()), "negatives": int((~flags).sum())}


def calibration(records: Sequence[QuestionRecord], *, seed: int = DEFAULT_SEED) -> list[dict[str, Any]]:
    """
    Both AUROC readings for every run with confidences: `strategy`, `top_k`, `setting`, `n` (records with a
    confidence), `correct` and `answerable` (each an `auroc` result, or None when a class is missing).
    """
    rows = []
    for (strategy, top_k, setting), group in _runs(records).items():
        scored = [(record, value) for record in group if (value := answering_confidence(record)) is not None]
        if not scored:
            continue
        answerable = [(record, value) for record, value in scored if record.answerable]
        rows.append(
            {
                "strategy": strategy,
                "top_k": top_k,
                "setting": setting,
                "n": len(scored),
                "correct": auroc([v for _, v in answerable], [r.score.em == 1.0 for r, _ in answerable], seed=seed),
                "answerable": auroc([v for _, v in scored], [r.answerable for r, _ in scored], seed=seed),
            }
        )
    return rows


def selective_curve(records: Sequence[QuestionRecord]) -> list[tuple[float, float]]:
    """
    Accuracy against coverage as the confidence threshold varies (selective answering): at threshold t the system
    answers the non-unknown answers with confidence >= t. Coverage: answered share of all questions; accuracy: share
    of the answered ones exactly right (an answered unanswerable question is wrong).

    :returns: (coverage, accuracy) points in percent, from the highest threshold down.
    """
    answered = sorted(
        (float(r.evidence["confidence"]), r.answerable and r.score.em == 1.0)
        for r in records
        if r.evidence.get("confidence") is not None and not r.score.unknown
    )[::-1]
    total = len(records)
    points: list[tuple[float, float]] = []
    right = 0
    for index, (_, correct) in enumerate(answered, start=1):
        right += correct
        points.append((100.0 * index / total, 100.0 * right / index))
    return points


def draw_selective_chart(records: Sequence[QuestionRecord], out: Path) -> Path | None:
    """Draw `selective_answering.png` (one line per run with confidences); None when no run has them."""
    curves = {
        f"{strategy} (top-{top_k})": curve
        for (strategy, top_k, _), group in _runs(records).items()
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
    axes.set_xlabel("coverage (% of questions answered)")
    axes.set_ylabel("accuracy of the answered questions (EM %)")
    axes.set_title("Selective answering: threshold on answer confidence")
    axes.set_xlim(0, 100)
    axes.set_ylim(0, 100)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    path = out / SELECTIVE_CHART
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


@dataclass(frozen=True)
class Replayed:
    """One question's scores under a replayed tau: `correct` (SQuAD 2.0 EM), `em`, `f1`, `unknown`, `stage`."""

    answerable: bool
    em: float
    f1: float
    unknown: bool
    stage: str

    @property
    def correct(self) -> bool:
        return bool(self.em == 1.0) if self.answerable else self.unknown


def _replayed(record: QuestionRecord, stage: str) -> Replayed:
    return Replayed(record.answerable, record.score.em, record.score.f1, record.score.unknown, stage)


def replay(records: Sequence[QuestionRecord], tau: float | None) -> dict[tuple[int, str], dict[str, Replayed]]:
    """
    Replay `concat_pf` at tau from the records of one evaluation; tau None replays the text-only fallback (Liu et al.).

    Needs, per question, a `concatenation` record with a confidence and a `post_fusion` record at the same k and
    setting; other questions are in no row.

    :returns: (k, setting) -> question id -> `Replayed`.
    """
    index = {(r.strategy, r.top_k, r.setting, r.question_id): r for r in records}
    replayed: dict[tuple[int, str], dict[str, Replayed]] = {}
    for (strategy, top_k, setting, question_id), first in index.items():
        fused = index.get(("post_fusion", top_k, setting, question_id))
        confidence = first.evidence.get("confidence")
        if strategy != "concatenation" or fused is None or confidence is None:
            continue
        unsure = tau is not None and not first.score.unknown and confidence < tau
        fell_back = first.score.unknown or unsure
        outcome = _replayed(fused, "post_fusion") if fell_back else _replayed(first, "concatenation")
        replayed.setdefault((top_k, setting), {})[question_id] = outcome
    return replayed


def replay_summary(outcomes: Iterable[Replayed], *, seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """
    The rates of replayed outcomes, in percent with 95% bootstrap CIs: `squad2_em`, `em`, `f1` (answerable),
    `reject_rate` (unanswerable answered "unknown") and `fallback_rate` (answered by post-fusion).
    """
    items = list(outcomes)
    answerable = [o for o in items if o.answerable]
    unanswerable = [o for o in items if not o.answerable]
    values: dict[str, list[Any]] = {
        "squad2_em": [o.correct for o in items],
        "em": [o.em for o in answerable],
        "f1": [o.f1 for o in answerable],
        "reject_rate": [o.unknown for o in unanswerable],
        "fallback_rate": [o.stage != "concatenation" for o in items],
    }
    summary: dict[str, Any] = {"n": len(items)}
    for name, flags in values.items():
        summary[name] = 100.0 * sum(flags) / len(flags) if flags else None
        summary[f"{name}_ci"] = rate_ci(flags, seed=seed) if flags else None
    return summary


def sweep(
    records: Sequence[QuestionRecord], thresholds: Sequence[float] = DEFAULT_THRESHOLDS, *, seed: int = DEFAULT_SEED
) -> list[dict[str, Any]]:
    """
    Replay `concat_pf` at each tau of a grid and at tau None (text only).

    :returns: One row per (k, setting, tau): those keys plus `replay_summary`'s rates.
    """
    return [
        {"top_k": top_k, "setting": setting, "tau": tau, **replay_summary(outcomes.values(), seed=seed)}
        for tau in [None, *thresholds]
        for (top_k, setting), outcomes in replay(records, tau).items()
    ]


def choose(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """
    The sweep row with the highest SQuAD 2.0 EM; ties to the smaller fallback rate (fewer LLM calls), then to the
    smaller tau. None for no rows.
    """
    candidates = [row for row in rows if row.get("squad2_em") is not None and row.get("tau") is not None]
    return max(candidates, key=lambda row: (row["squad2_em"], -row["fallback_rate"], -row["tau"]), default=None)


def consistency(records: Sequence[QuestionRecord]) -> tuple[int, int]:
    """
    How many `concat_pf` records the text-only replay reproduces: (same prediction outcome, compared), a check that
    the replay is exact on this run.
    """
    replayed = replay(records, None)
    same = compared = 0
    for record in records:
        if record.strategy != "concat_pf":
            continue
        outcome = replayed.get((record.top_k, record.setting), {}).get(record.question_id)
        if outcome is None:
            continue
        compared += 1
        same += (outcome.em, outcome.f1, outcome.unknown) == (record.score.em, record.score.f1, record.score.unknown)
    return same, compared


def _runs(records: Sequence[QuestionRecord]) -> dict[tuple[str, int, str], list[QuestionRecord]]:
    groups: dict[tuple[str, int, str], list[QuestionRecord]] = {}
    for record in records:
        groups.setdefault((record.strategy, record.top_k, record.setting), []).append(record)
    return groups


def verification_stats(records: Sequence[QuestionRecord]) -> list[dict[str, Any]]:
    """
    How much SuRe's verification decided, per run with verifier scores (Kim et al., Eq. 4-6): `strategy`, `top_k`,
    `setting`, `verified` (questions with 2+ scored candidates), and in % of them `not_all_valid` (some validity not
    True, or below 0.5), `first_wins` (won by candidate (a)), and `label_summaries` (% of the summaries, over the
    records that counted them, that are only a candidate's label).
    """
    rows = []
    for (strategy, top_k, setting), group in _runs(records).items():
        scored = [r.evidence.get("scores") or [] for r in group]
        scored = [scores for scores in scored if len(scores) > 1]
        labels = [r.evidence.get("label_summaries") for r in group]
        summaries = sum(
            len(r.evidence.get("candidates") or []) for r in group if r.evidence.get("label_summaries") is not None
        )
        if not scored:
            continue
        validities = [[s.get("validity") for s in scores] for scores in scored]
        judged = [v for v in validities if all(x is not None for x in v)]
        rows.append(
            {
                "strategy": strategy,
                "top_k": top_k,
                "setting": setting,
                "verified": len(scored),
                "not_all_valid": 100.0 * sum(any(x < 0.5 for x in v) for v in judged) / len(judged) if judged else None,
                "first_wins": 100.0 * sum(scores[0].get("candidate_index") == 0 for scores in scored) / len(scored),
                "label_summaries": 100.0 * sum(x for x in labels if x is not None) / summaries if summaries else None,
            }
        )
    return rows


def _reason_kind(reason: str | None) -> str:
    """A stage trace's reason without its figures: "confidence 0.18 < 0.25" -> "confidence"."""
    if not reason:
        return "none"
    if reason.startswith("confidence"):
        return "low confidence"
    if reason.startswith("vote share"):
        return "split vote"
    return reason


def stage_stats(records: Sequence[QuestionRecord]) -> list[dict[str, Any]]:
    """
    Which stage of a fallback strategy answered, per run with stage traces (`concat_pf`, `cascade`): `strategy`,
    `top_k`, `setting`, `n`, `answered_at` (stage -> % of the n questions, in pipeline order) and `reasons` (stage ->
    {"unknown answer" | "low confidence" | "split vote" | "tie at the top" -> questions that left it for that}).
    """
    rows = []
    for (strategy, top_k, setting), group in _runs(records).items():
        traces: list[list[dict[str, Any]]] = [trace for r in group if (trace := r.evidence.get("stages"))]
        if not traces:
            continue
        answered: dict[str, int] = {}
        reasons: dict[str, dict[str, int]] = {}
        for trace in traces:
            answered[trace[-1]["stage"]] = answered.get(trace[-1]["stage"], 0) + 1
            for step in trace[:-1]:
                kinds = reasons.setdefault(step["stage"], {})
                kind = _reason_kind(step.get("reason"))
                kinds[kind] = kinds.get(kind, 0) + 1
        order = ["concatenation", "post_fusion", "sure"]
        stages = sorted(answered, key=lambda stage: order.index(stage) if stage in order else len(order))
        rows.append(
            {
                "strategy": strategy,
                "top_k": top_k,
                "setting": setting,
                "n": len(traces),
                "answered_at": {stage: 100.0 * answered[stage] / len(traces) for stage in stages},
                "reasons": reasons,
            }
        )
    return rows


def _pct(value: float | None, ci: Sequence[float] | None = None) -> str:
    if value is None:
        return "–"
    return f"{value:.1f}" + (f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "")


def _auc(result: dict[str, Any] | None) -> str:
    if result is None:
        return "–"
    ci = result["ci"]
    interval = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
    return f"{result['auroc']:.2f}{interval} ({result['positives']}/{result['negatives']})"


def _shown(row: dict[str, Any], best: dict[str, Any] | None) -> bool:
    """The rows a report's table shows (summary.json has them all): text only, tau = 0.2, 0.4, 0.6, 0.8, the best."""
    return row is best or row["tau"] is None or round(row["tau"] * 100) in (20, 40, 60, 80)


def calibration_report(
    records: Sequence[QuestionRecord],
    out: Path,
    *,
    seed: int = DEFAULT_SEED,
) -> tuple[str, dict[str, Any]]:
    """
    The calibration sections of a report: AUROC per run, the selective-answering chart, the replayed `concat_pf`
    tau sweep, SuRe's verification figures and the fallback strategies' stage shares (`stage_stats`); each part only
    when its records are there.

    :returns: (markdown, summary dict with `auroc`, `concat_pf_sweep`, `consistency`, `verification`, `stages`).
    """
    summary: dict[str, Any] = {
        "auroc": calibration(records, seed=seed),
        "concat_pf_sweep": sweep(records, seed=seed),
        "consistency": consistency(records),
        "verification": verification_stats(records),
        "stages": stage_stats(records),
    }
    parts = []
    if summary["auroc"]:
        chart = draw_selective_chart(records, out)
        lines = [
            "\n## Answer confidence\n",
            "AUROC of the answering confidence with its 95% bootstrap CI and (positives/negatives): `correct` = "
            "answered exactly right among answerable questions; `answerable` = answerable against unanswerable.\n",
            "| strategy | top-k | questions | AUROC correct | AUROC answerable |",
            "|---|---|---|---|---|",
        ]
        for row in summary["auroc"]:
            lines.append(
                f"| {row['strategy']} | {row['top_k']} | {row['n']} | {_auc(row['correct'])} | "
                f"{_auc(row['answerable'])} |"
            )
        if chart is not None:
            lines.append(f"\n![selective answering]({chart.name})\n")
        parts.append("\n".join(lines))
    rows = summary["concat_pf_sweep"]
    if rows:
        best = choose(rows)
        lines = [
            "\n## concat_pf replayed at each threshold\n",
            "Replayed exactly from the concatenation and post_fusion records (tau `–`: text only, the paper's); a "
            "selection of the grid, all of it in summary.json. SQuAD 2.0 EM counts an unanswerable question right "
            "when the answer is unknown.\n",
            "| top-k | tau | questions | SQuAD 2.0 EM | EM | F1 | reject rate | fallback % |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in (row for row in rows if _shown(row, best)):
            lines.append(
                f"| {row['top_k']} | {'–' if row['tau'] is None else row['tau']} | {row['n']} | "
                f"{_pct(row['squad2_em'], row['squad2_em_ci'])}{' **best**' if row is best else ''} | "
                f"{_pct(row['em'], row['em_ci'])} | {_pct(row['f1'], row['f1_ci'])} | "
                f"{_pct(row['reject_rate'], row['reject_rate_ci'])} | {_pct(row['fallback_rate'])} |"
            )
        if summary["consistency"][1]:
            same, compared = summary["consistency"]
            lines.append(f"\nThe text-only replay reproduces {same} of {compared} concat_pf records.")
        parts.append("\n".join(lines))
    if summary["verification"]:
        lines = [
            "\n## SuRe's verification\n",
            "| strategy | top-k | verified | validity not all True % | candidate (a) wins % | label-only summaries % |",
            "|---|---|---|---|---|---|",
        ]
        for row in summary["verification"]:
            lines.append(
                f"| {row['strategy']} | {row['top_k']} | {row['verified']} | {_pct(row['not_all_valid'])} | "
                f"{_pct(row['first_wins'])} | {_pct(row['label_summaries'])} |"
            )
        parts.append("\n".join(lines))
    if summary["stages"]:
        lines = [
            "\n## Which stage answered\n",
            "The fallback strategies' stage traces: the share of questions answered at each stage, and why questions "
            "left a stage (number of questions).\n",
            "| strategy | top-k | questions | answered at | left a stage because |",
            "|---|---|---|---|---|",
        ]
        for row in summary["stages"]:
            answered = ", ".join(f"{stage} {share:.1f}%" for stage, share in row["answered_at"].items())
            reasons = "; ".join(
                f"{stage}: " + ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items()))
                for stage, kinds in row["reasons"].items()
            )
            lines.append(f"| {row['strategy']} | {row['top_k']} | {row['n']} | {answered} | {reasons or '–'} |")
        parts.append("\n".join(lines))
    return "\n".join(parts) + ("\n" if parts else ""), summary
