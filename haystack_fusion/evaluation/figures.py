"""The figures of each `view.Run` of a report: rates with 95% bootstrap intervals, answer outcomes, the paired
difference against a baseline (Kim et al., Appendix H), cost per question in US dollars, share that fell back, SAS."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from haystack_fusion.answers import DEMONSTRATION
from haystack_fusion.evaluation.metrics import (
    DEFAULT_SEED,
    excludes_zero,
    mean_ci,
    outcome_counts,
    paired_difference_ci,
    rate_ci,
    summarize_with_intervals,
)
from haystack_fusion.evaluation.view import ReportView, Run, total

DEFAULT_BASELINE = "concatenation"


def _ci(interval: Sequence[float] | None) -> list[float] | None:
    return list(interval) if interval is not None else None


def answer_outcomes(run: Run, *, seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """`metrics.outcome_counts`, invalid reasons, demonstration copies (no rate for a strategy without any)."""
    records, prompts = run.records, run.questions[0].demo_copies  # the same prompts for every question of a run
    flags = [any(question.demo_copies.values()) for question in run.questions]
    rejected = [r.evidence.get("invalid_reason") == DEMONSTRATION or any(DEMONSTRATION in str(stage.get("reason") or "")
                for stage in r.evidence.get("stages") or []) for r in records]  # fmt: skip
    reasons = Counter(str(r.evidence.get("invalid_reason")) for r in records if r.score.invalid)
    return {**outcome_counts(run.scores), "invalid_reasons": dict(sorted(reasons.items())),
            "demo_copy_count": sum(flags), "demo_copy_rate": 100.0 * sum(flags) / len(flags) if prompts else None,
            "demo_copy_rate_ci": _ci(rate_ci(flags, seed=seed)) if prompts else None,
            "demo_copy_prompts": {name: sum(q.demo_copies[name] for q in run.questions) for name in prompts},
            "demo_rejected_count": sum(rejected)}  # fmt: skip


def resolve_baseline(view: ReportView, baseline: str | None = None) -> str | None:
    """`baseline`, else `concatenation` when it ran, else None. :raises ValueError: If `baseline` did not run."""
    present = list(dict.fromkeys(record.strategy for record in view.records))
    if baseline is None:
        return DEFAULT_BASELINE if DEFAULT_BASELINE in present else None
    if baseline not in present:
        raise ValueError(f"baseline {baseline!r} did not run; the strategies in the records are: {', '.join(present)}")
    return baseline


def baseline_run(view: ReportView, run: Run, baseline: str) -> Run | None:
    """The baseline's run at the same k and setting, of the same label, else the first; None for the baseline."""
    if run.strategy == baseline:
        return None
    same = [r for r in view.runs.values() if (r.strategy, r.top_k, r.setting) == (baseline, run.top_k, run.setting)]
    return view.runs.get((run.label, baseline, run.top_k, run.setting)) or (same[0] if same else None)


def baseline_difference(run: Run, base: Run | None, *, seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """The EM and F1 difference against the baseline run (`metrics.paired_difference_ci`), over answerable questions
    both answered."""
    theirs = {r.question_id: r.score for r in (base.records if base else []) if r.score.answerable}
    mine = {r.question_id: r.score for r in run.records if r.score.answerable and r.question_id in theirs}
    entry: dict[str, Any] = {"paired_questions": len(mine)}
    for metric in ("em", "f1"):
        ours = [getattr(score, metric) for score in mine.values()]
        base_values = [getattr(theirs[question_id], metric) for question_id in mine]
        result = paired_difference_ci(ours, base_values, seed=seed)
        # fewer than two pairs: the difference without an interval
        entry[f"{metric}_diff"] = result[0] if result else (100.0 * (ours[0] - base_values[0]) if ours else None)
        entry[f"{metric}_diff_ci"] = [result[1], result[2]] if result else None
    entry.update({f"{metric}_diff_significant": excludes_zero(entry[f"{metric}_diff_ci"]) for metric in ("em", "f1")})
    entry["diff_significant"] = entry["em_diff_significant"] or entry["f1_diff_significant"]
    return entry


def run_cost(run: Run, *, seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """A run's cost figures, means over its questions: `cost_per_question` (US dollars; None when a model lacks a price)
    and its `_ci`, `escalated_rate` (%, None for strategies without rounds) and its `_ci`, `models` (per model:
    `model`, `calls_per_question`, `prompt_tokens_per_question`, `completion_tokens_per_question`,
    `cost_per_question`), `unpriced_models`."""
    questions, n = run.questions, len(run.questions)
    flags = [q.fell_back for q in questions if q.fell_back is not None]
    models = []
    for model in dict.fromkeys(name for q in questions for name in q.usage):
        mine = [q.usage.get(model) or {} for q in questions]
        spent = total(q.model_costs.get(model, 0.0) for q in questions)
        models.append({
            "model": model,
            **{f"{key}_per_question": sum(int(u.get(key) or 0) for u in mine) / n
               for key in ("calls", "prompt_tokens", "completion_tokens")},
            "cost_per_question": None if spent is None else spent / n,
        })  # fmt: skip
    known = [cost for q in questions if (cost := q.cost) is not None]
    priced = bool(known) and len(known) == n
    return {"cost_per_question": sum(known) / n if priced else None,
            "cost_per_question_ci": _ci(mean_ci(known, seed=seed)) if priced else None,
            "escalated_rate": 100.0 * sum(flags) / len(flags) if flags else None,
            "escalated_rate_ci": _ci(rate_ci(flags, seed=seed)) if flags else None,
            "models": models,
            "unpriced_models": [m["model"] for m in models if m["cost_per_question"] is None]}  # fmt: skip


def summarize_runs(view: ReportView, *, seed: int = DEFAULT_SEED, baseline: str | None = None,
                   sas: Mapping[tuple[str, int, str, str], float | None] | None = None,
                   ) -> list[dict[str, Any]]:  # fmt: skip
    """One summary per run: `Run.head`, `metrics.summarize_with_intervals`, `answer_outcomes`, `baseline_difference`
    (with a `baseline`), `run_cost`, and `sas` with `sas_ci` (with `sas`: `haystack_eval.records_sas`)."""
    summaries = []
    for run in view.runs.values():
        summary = {**run.head(), **summarize_with_intervals(run.scores, seed=seed), **answer_outcomes(run, seed=seed)}
        if baseline is not None and run.strategy != baseline:
            summary.update(baseline_difference(run, baseline_run(view, run, baseline), seed=seed))
        summary.update(run_cost(run, seed=seed))
        if sas is not None:
            values = [float(v) for r in run.records if r.answerable and (v := sas.get(r.key())) is not None]
            summary["sas"] = 100 * sum(values) / len(values) if values else None
            summary["sas_ci"] = _ci(rate_ci(values, seed=seed))
        summaries.append(summary)
    return summaries
