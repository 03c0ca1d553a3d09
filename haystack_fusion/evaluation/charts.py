"""The report's PNG charts, drawn with matplotlib (the `eval` extra); each `draw_*` raises ImportError without it."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from haystack_fusion.evaluation.records import QuestionRecord
from haystack_fusion.evaluation.view import ReportView

TOKENS_CHART = "em_vs_tokens.png"
TOPK_CHART = "em_vs_top_k.png"
NOISE_CHART = "em_vs_noise_ratio.png"
COST_CHART = "accuracy_vs_cost.png"
SELECTIVE_CHART = "selective_answering.png"


def label(summary: Mapping[str, Any]) -> str:
    """A run's name in a chart: its strategy, after its run label when it has one."""
    return f"{summary['run']}: {summary['strategy']}" if summary.get("run") else str(summary["strategy"])


def noise_ratio(setting: str) -> float | None:
    """The noise ratio of a setting label ("retrieved, noise ratio 0.4" -> 0.4), None without one."""
    return float(match.group(1)) if (match := re.search(r"noise ratio ([0-9.]+)", setting)) else None


@contextmanager
def _chart(path: Path, size: tuple[float, float] = (6, 4)) -> Iterator[Any]:
    """The axes of a new figure, saved as a PNG at `path` (120 dpi) when the block ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=size)
    try:
        yield axes
        figure.tight_layout()
        figure.savefig(path, dpi=120)
    finally:
        plt.close(figure)


def _em_lines(points: Sequence[tuple[str, Any, float]], path: Path, *, xlabel: str, title: str) -> None:
    """One line of EM over x per strategy, from (strategy, x, EM) points."""
    with _chart(path) as axes:
        for strategy in dict.fromkeys(name for name, _, _ in points):
            series = sorted((x, em) for name, x, em in points if name == strategy)
            axes.plot([x for x, _ in series], [em for _, em in series], marker="o", label=strategy)
        axes.set(xlabel=xlabel, ylabel="EM (answerable questions)", title=title)
        axes.legend()


def draw_charts(view: ReportView, summaries: Sequence[dict[str, Any]], sweep_rows: Sequence[dict[str, Any]],
                out: Path) -> tuple[str | None, str | None]:  # fmt: skip
    """Draw EM vs tokens (Liu et al. Figure 3), EM vs top-k (Figure 4), EM vs noise ratio (Yu et al. Table 3), accuracy
    against cost and selective answering, each when it has points.
    :returns: The file names of the cost and the selective answering charts, None for one not drawn."""
    cost = draw_cost_chart(summaries, sweep_rows, out)
    selective = draw_selective_chart(view, out)
    smallest, first_setting = min(s["top_k"] for s in summaries), summaries[0]["setting"]
    points = [s for s in summaries if s["top_k"] == smallest and s["setting"] == first_setting and s["em"] is not None]
    with _chart(out / TOKENS_CHART) as axes:
        _scatter(axes, [(s["tokens_per_question"], s["em"], label(s)) for s in points])
        axes.set(xlabel="tokens per question (prompt + completion)", ylabel="EM (answerable questions)",
                 title=f"EM vs tokens, top-{smallest} (cf. Liu et al. Figure 3)")  # fmt: skip
    if len({s["top_k"] for s in summaries}) > 1:
        by_k = [(label(s), s["top_k"], s["em"]) for s in summaries if s["em"] is not None]
        _em_lines(by_k, out / TOPK_CHART, xlabel="top-k passages", title="EM vs top-k (cf. Liu et al. Figure 4)")
    noisy = [(label(s), noise_ratio(s["setting"]), s["em"]) for s in summaries if s["em"] is not None]
    noisy = [(strategy, ratio, em) for strategy, ratio, em in noisy if ratio is not None]
    if len({ratio for _, ratio, _ in noisy}) > 1:
        _em_lines(noisy, out / NOISE_CHART, xlabel="noise ratio (share of irrelevant passages in the top-k)",
                  title="EM vs noise ratio (cf. Yu et al. Table 3)")  # fmt: skip
    return (cost.name if cost else None), (selective.name if selective else None)


def _scatter(axes: Any, points: Sequence[tuple[float, float, str]], **text: Any) -> None:
    """Labelled points, the labels alternately above and below, so labels of nearby points do not overlap."""
    for index, (x, y, name) in enumerate(points):
        axes.scatter(x, y)
        axes.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4) if index % 2 == 0 else (4, -12), **text)


def draw_cost_chart(summaries: Sequence[dict[str, Any]], sweep_rows: Sequence[dict[str, Any]],
                    out: Path) -> Path | None:  # fmt: skip
    """Draw EM (answerable questions) against cost per question: one point per priced run, and the replayed concat_pf
    (`calibration.sweep`) as a line over its priced taus, at the first k and setting it has.
    :returns: The chart's path; None (nothing drawn) when no run or tau has a cost."""
    points = [s for s in summaries if s.get("cost_per_question") is not None and s["em"] is not None]
    first = next(((r["top_k"], r["setting"]) for r in sweep_rows), None)
    line = sorted((r["cost_per_question"], r["em"], r["tau"]) for r in sweep_rows if (r["top_k"], r["setting"]) == first
                  and None not in (r["tau"], r["cost_per_question"], r["em"]))  # fmt: skip
    if not points and not line:
        return None
    with _chart(out / COST_CHART, (6.4, 4.4)) as axes:
        runs = [(s["cost_per_question"], s["em"], f"{label(s)} (top-{s['top_k']})") for s in points]
        _scatter(axes, runs, fontsize=8)
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
    return out / COST_CHART


def selective_curve(records: Sequence[QuestionRecord]) -> list[tuple[float, float]]:
    """Selective answering: (coverage, accuracy) points in percent as the confidence threshold falls."""
    answered = sorted(((float(r.evidence["confidence"]), r.answerable and r.score.em == 1.0) for r in records
                       if r.evidence.get("confidence") is not None and not r.score.unknown), reverse=True)  # fmt: skip
    right = np.cumsum([correct for _, correct in answered])
    return [(100.0 * i / len(records), 100.0 * float(right[i - 1]) / i) for i in range(1, len(answered) + 1)]


def draw_selective_chart(view: ReportView, out: Path) -> Path | None:
    """Draw `selective_answering.png` (one line per run with confidences); None when no run has them."""
    curves = {f"{strategy} (top-{top_k})": curve for (strategy, top_k, _), group in view.by_strategy.items()
              if (curve := selective_curve([question.record for question in group]))}  # fmt: skip
    if not curves:
        return None
    with _chart(out / SELECTIVE_CHART, (6.4, 4.4)) as axes:
        for name, curve in curves.items():
            axes.plot([c for c, _ in curve], [a for _, a in curve], label=name)
        axes.set(xlabel="coverage (% of questions answered)", ylabel="accuracy of the answered questions (EM %)",
                 title="Selective answering: threshold on answer confidence", xlim=(0, 100), ylim=(0, 100))  # fmt: skip
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    return out / SELECTIVE_CHART
