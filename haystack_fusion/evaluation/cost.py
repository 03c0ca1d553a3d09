"""
What a run costs: prices per model, each question's cost in US dollars, calls and tokens per model, the share of
questions that fell back, and accuracy against cost as a chart (matplotlib, the `eval` extra).

A price is US dollars per million prompt (input) and completion (output) tokens. A question's usage per model is
`evidence["usage_by_model"]` (model name -> `prompt_tokens`, `completion_tokens`, `calls`, ...); a record without it
counts its whole usage against the run's one model (`with_model`). A question falls back when the first round
(concatenation) passes it on to the fallback rounds (`evidence["fallback"]`, set by `concat_pf` and `cascade`);
FrugalGPT (Chen et al., 2023) reads a cascade by these two figures, the cost and the share that reached the strong
model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from haystack_fusion.evaluation.metrics import DEFAULT_SEED, mean_ci, rate_ci
from haystack_fusion.evaluation.records import QuestionRecord

Price = tuple[float, float]
"""US dollars per million (prompt, completion) tokens."""

UNNAMED_MODEL = "model"
"""The model name of records without `usage_by_model` when their run does not name its model."""

TOKENS_PER_PRICE = 1_000_000
COST_CHART = "accuracy_vs_cost.png"


def parse_price(text: str) -> tuple[str, Price]:
    """
    Read `MODEL=IN,OUT` (US dollars per million input and output tokens), e.g. `gpt-4o-mini=0.15,0.60`.

    :returns: (model, (input price, output price)).
    :raises ValueError: If the text is not of that form or a price is negative or not a number.
    """
    model, _, figures = text.rpartition("=")
    parts = figures.split(",")
    try:
        if not model.strip() or len(parts) != 2:
            raise ValueError
        prompt, completion = float(parts[0]), float(parts[1])
    except ValueError:
        raise ValueError(
            f"price {text!r}: expected MODEL=IN,OUT in US dollars per million input and output tokens, "
            "e.g. gpt-4o-mini=0.15,0.60"
        ) from None
    if not all(math.isfinite(value) and value >= 0 for value in (prompt, completion)):
        raise ValueError(f"price {text!r}: prices must be finite numbers >= 0")
    return model.strip(), (prompt, completion)


def parse_prices(texts: Iterable[str]) -> dict[str, Price]:
    """`parse_price` of each text, a later price of a model replacing an earlier one. :raises ValueError: As it."""
    return dict(parse_price(text) for text in texts)


def _score_usage(record: QuestionRecord) -> dict[str, int]:
    score = record.score
    return {"prompt_tokens": score.prompt_tokens, "completion_tokens": score.completion_tokens, "calls": score.calls}


def with_model(records: Iterable[QuestionRecord], model: str) -> list[QuestionRecord]:
    """The records (same order), those without `usage_by_model` given one that counts all their usage against
    `model`."""
    return [
        record
        if record.evidence.get("usage_by_model")
        else dataclasses.replace(record, evidence={**record.evidence, "usage_by_model": {model: _score_usage(record)}})
        for record in records
    ]


def model_usage(record: QuestionRecord) -> dict[str, Mapping[str, Any]]:
    """A question's usage per model: `evidence["usage_by_model"]`, else its whole usage under `UNNAMED_MODEL`."""
    by_model = record.evidence.get("usage_by_model")
    if isinstance(by_model, Mapping) and by_model:
        return {str(name): usage for name, usage in by_model.items()}
    return {UNNAMED_MODEL: _score_usage(record)}


def usage_cost(usage: Mapping[str, Any], price: Price | None) -> float | None:
    """The cost in US dollars of one model's usage at `price`; None without a price (0.0 for no tokens)."""
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    if price is None:
        return 0.0 if prompt + completion == 0 else None
    return (prompt * price[0] + completion * price[1]) / TOKENS_PER_PRICE


def question_cost(record: QuestionRecord, prices: Mapping[str, Price]) -> float | None:
    """A question's cost in US dollars over every model it used; None when a model that spent tokens has no price."""
    costs = [usage_cost(usage, prices.get(model)) for model, usage in model_usage(record).items()]
    return None if None in costs else sum(c for c in costs if c is not None)


def fell_back(record: QuestionRecord) -> bool | None:
    """Whether the first round passed the question on to the fallback rounds; None for a strategy without rounds."""
    fallback = record.evidence.get("fallback")
    return None if fallback is None else bool(fallback)


def run_cost(
    records: Sequence[QuestionRecord], prices: Mapping[str, Price], *, seed: int = DEFAULT_SEED
) -> dict[str, Any]:
    """
    A run's cost figures, means over its questions.

    :returns: `cost_per_question` (US dollars; None when a model lacks a price) and `cost_per_question_ci` (95%
        bootstrap, `metrics.mean_ci`), `escalated_rate` (% of the questions that fell back; None for strategies
        without rounds) and its `_ci`, `models` (one dict per model: `model`, `calls_per_question`,
        `prompt_tokens_per_question`, `completion_tokens_per_question`, `cost_per_question`), `unpriced_models`.
    """
    n = len(records)
    usages = [model_usage(record) for record in records]
    costs = [question_cost(record, prices) for record in records]
    flags = [flag for record in records if (flag := fell_back(record)) is not None]
    models = []
    for model in dict.fromkeys(name for usage in usages for name in usage):
        mine = [usage.get(model) or {} for usage in usages]
        spent = [usage_cost(usage, prices.get(model)) for usage in mine]
        models.append({
            "model": model,
            **{f"{key}_per_question": sum(int(u.get(key) or 0) for u in mine) / n
               for key in ("calls", "prompt_tokens", "completion_tokens")},
            "cost_per_question": None if None in spent else sum(c for c in spent if c is not None) / n,
        })  # fmt: skip
    known = [cost for cost in costs if cost is not None]
    priced = bool(known) and len(known) == n
    cost_ci = mean_ci(known, seed=seed) if priced else None
    fallback_ci = rate_ci(flags, seed=seed) if flags else None
    return {
        "cost_per_question": sum(known) / n if priced else None,
        "cost_per_question_ci": list(cost_ci) if cost_ci else None,
        "escalated_rate": 100.0 * sum(flags) / len(flags) if flags else None,
        "escalated_rate_ci": list(fallback_ci) if fallback_ci else None,
        "models": models,
        "unpriced_models": [m["model"] for m in models if m["cost_per_question"] is None],
    }


def label(summary: Mapping[str, Any]) -> str:
    """A run's name in a chart: its strategy, after its run label when it has one."""
    return f"{summary['run']}: {summary['strategy']}" if summary.get("run") else str(summary["strategy"])


def draw_cost_chart(
    summaries: Sequence[dict[str, Any]], sweep_rows: Sequence[dict[str, Any]], out: Path
) -> Path | None:
    """
    Draw EM (answerable questions) against cost per question: one labelled point per run, and the replayed concat_pf
    (`calibration.sweep`) as a line over its taus, at the first k and setting it has. Only priced runs and taus.

    :returns: The chart's path; None (nothing drawn) when no run or tau has a cost.
    :raises ImportError: Without matplotlib (the `eval` extra).
    """
    points = [s for s in summaries if s.get("cost_per_question") is not None and s["em"] is not None]
    first = next(((r["top_k"], r["setting"]) for r in sweep_rows), None)
    line = sorted(
        (r["cost_per_question"], r["em"], r["tau"]) for r in sweep_rows
        if (r["top_k"], r["setting"]) == first and r["tau"] is not None and r["cost_per_question"] is not None
        and r["em"] is not None
    )  # fmt: skip
    if not points and not line:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.4))
    for index, s in enumerate(points):
        axes.scatter(s["cost_per_question"], s["em"])
        offset = (4, 4) if index % 2 == 0 else (4, -12)
        axes.annotate(f"{label(s)} (top-{s['top_k']})", (s["cost_per_question"], s["em"]), fontsize=8,
                      textcoords="offset points", xytext=offset)  # fmt: skip
    if line:
        axes.plot([c for c, _, _ in line], [em for _, em, _ in line], marker=".", alpha=0.6,
                  label=f"concat_pf replayed over tau (top-{first[0]})" if first else None)  # fmt: skip
        spots: dict[tuple[float, float], list[float]] = {}  # taus that replay alike share a point and a label
        for cost, em, tau in line:
            spots.setdefault((cost, em), []).append(tau)
        for (cost, em), taus in spots.items():
            text = f"tau {taus[0]:g}" + (f"-{taus[-1]:g}" if len(taus) > 1 else "")
            axes.annotate(text, (cost, em), fontsize=7, textcoords="offset points", xytext=(3, -10))
        axes.legend(fontsize=8)
    axes.set(xlabel="cost per question (US dollars)", ylabel="EM (answerable questions)",
             title="Accuracy against cost")  # fmt: skip
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(out / COST_CHART, dpi=120)
    plt.close(figure)
    return out / COST_CHART
