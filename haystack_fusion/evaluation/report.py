"""
The evaluation report: summary JSON, a markdown table laid out like paper 000's Table 1, and PNG charts.

Charts are drawn with matplotlib's headless Agg backend (the `eval` extra).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from haystack_fusion.evaluation.metrics import summarize
from haystack_fusion.evaluation.runner import QuestionRecord

SUMMARY_FILE = "summary.json"
TABLE_FILE = "results.md"
TOKENS_CHART = "em_vs_tokens.png"
TOPK_CHART = "em_vs_top_k.png"
NOISE_CHART = "em_vs_noise_ratio.png"


def summarize_runs(records: Sequence[QuestionRecord]) -> list[dict[str, Any]]:
    """
    One summary per (strategy, k, setting), in the order the records first name them.

    :param records: Question records of one evaluation, or of several (e.g. one per noise ratio).
    :returns: Dicts with `strategy`, `top_k`, `setting` and every key of `metrics.summarize`.
    """
    groups: dict[tuple[str, int, str], list[QuestionRecord]] = {}
    for record in records:
        groups.setdefault((record.strategy, record.top_k, record.setting), []).append(record)
    return [
        {"strategy": strategy, "top_k": top_k, "setting": setting, **summarize([r.score for r in group])}
        for (strategy, top_k, setting), group in groups.items()
    ]


def noise_ratio(setting: str) -> float | None:
    """The noise ratio of a setting label ("retrieved, noise ratio 0.4" -> 0.4), None without one."""
    match = re.search(r"noise ratio ([0-9.]+)", setting)
    return float(match.group(1)) if match else None


def _cell(value: Any, percent: bool = False, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}%" if percent else f"{value:.{digits}f}"


def _row(s: dict[str, Any], *, with_setting: bool) -> str:
    setting = f" {s['setting']} |" if with_setting else ""
    return (
        f"| {s['strategy']} |{setting} {s['top_k']} | {_cell(s['em'])} | {_cell(s['f1'])} "
        f"| {_cell(s['unknown_rate'], True)} | {_cell(s['nm_rate'], True)} | {_cell(s['accuracy'])} "
        f"| {_cell(s['reject_rate'], True)} | {_cell(s['recall_at_k'], True)} "
        f"| {_cell(s['calls_per_question'], digits=2)} | {_cell(s['tokens_per_question'], digits=0)} "
        f"| {_cell(s['latency_p50'], digits=2)} | {_cell(s['latency_p95'], digits=2)} |"
    )


def markdown_table(summaries: Sequence[dict[str, Any]], *, title: str = "") -> str:
    """
    The results as a markdown table laid out like paper 000's Table 1 (EM, F1, %Unk, %NM per strategy), plus
    accuracy, reject rate on unanswerable questions, retrieval recall@k, LLM calls and tokens per question, and
    latency. With several settings (e.g. noise ratios, paper 004 Table 3) a setting column is added.

    :param summaries: From `summarize_runs`.
    :param title: A line above the table.
    :returns: Markdown text.
    """
    several = len({s["setting"] for s in summaries}) > 1
    header = (
        f"| strategy |{' setting |' if several else ''} top-k | EM | F1 | %Unk | %NM | accuracy | reject rate "
        f"| recall@k | calls/q | tokens/q | p50 s | p95 s |\n|---|{'---|' if several else ''}---|---|---|---|---|"
        "---|---|---|---|---|---|---|"
    )
    rows = [_row(s, with_setting=several) for s in summaries]
    first = summaries[0] if summaries else {}
    notes = (
        f"\n\n{first.get('answerable', 0)} answerable and {first.get('unanswerable', 0)} unanswerable questions; "
        "EM, F1, accuracy, %Unk, %NM and recall@k over answerable questions, reject rate over unanswerable ones "
        "(an unknown answer is correct there). %NM: share of the questions whose post-fusion pool holds a gold "
        "answer where the majority picked another."
    )
    return (f"{title}\n\n" if title else "") + header + "\n" + "\n".join(rows) + notes + "\n"


def _em_lines(points: Sequence[tuple[str, Any, float]], path: Path, *, xlabel: str, title: str) -> Path:
    """One line of EM over x per strategy, from (strategy, x, EM) points, saved as a PNG at `path`."""
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for strategy in dict.fromkeys(name for name, _, _ in points):
        series = sorted((x, em) for name, x, em in points if name == strategy)
        axes.plot([x for x, _ in series], [em for _, em in series], marker="o", label=strategy)
    axes.set_xlabel(xlabel)
    axes.set_ylabel("EM (answerable questions)")
    axes.set_title(title)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def draw_charts(summaries: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    """
    EM vs tokens per question (one point per strategy, at the smallest k, first setting), EM vs top-k when k was
    swept, and EM vs noise ratio when several noise ratios were run (paper 004 Table 3).

    :param summaries: From `summarize_runs`.
    :param out: The folder the PNG files go to.
    :returns: The paths written.
    :raises ImportError: Without matplotlib (`pip install "haystack-fusion[eval]"`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    smallest = min(s["top_k"] for s in summaries)
    first_setting = summaries[0]["setting"]
    points = [s for s in summaries if s["top_k"] == smallest and s["setting"] == first_setting and s["em"] is not None]
    figure, axes = plt.subplots(figsize=(6, 4))
    for index, s in enumerate(points):
        axes.scatter(s["tokens_per_question"], s["em"])
        offset = (4, 4) if index % 2 == 0 else (4, -12)  # alternate, so labels of nearby points do not overlap
        axes.annotate(s["strategy"], (s["tokens_per_question"], s["em"]), textcoords="offset points", xytext=offset)
    axes.set_xlabel("tokens per question (prompt + completion)")
    axes.set_ylabel("EM (answerable questions)")
    axes.set_title(f"EM vs tokens, top-{smallest} (cf. paper 000 Figure 3)")
    figure.tight_layout()
    figure.savefig(out / TOKENS_CHART, dpi=120)
    plt.close(figure)
    written.append(out / TOKENS_CHART)
    if len({s["top_k"] for s in summaries}) > 1:
        by_k = [(s["strategy"], s["top_k"], s["em"]) for s in summaries if s["em"] is not None]
        written.append(
            _em_lines(by_k, out / TOPK_CHART, xlabel="top-k passages", title="EM vs top-k (cf. paper 000 Figure 4)")
        )
    noisy = [(s["strategy"], noise_ratio(s["setting"]), s["em"]) for s in summaries if s["em"] is not None]
    noisy = [(strategy, ratio, em) for strategy, ratio, em in noisy if ratio is not None]
    if len({ratio for _, ratio, _ in noisy}) > 1:
        written.append(
            _em_lines(
                noisy,
                out / NOISE_CHART,
                xlabel="noise ratio (share of irrelevant passages in the top-k)",
                title="EM vs noise ratio (cf. paper 004 Table 3)",
            )
        )
    return written


def write_report(records: Sequence[QuestionRecord], out: str | Path, *, title: str = "") -> dict[str, Any]:
    """
    Write `summary.json`, `results.md` and the charts into `out`.

    :param records: The question records of the evaluation.
    :param out: The output folder.
    :param title: The heading of the markdown table.
    :returns: The summary that was written.
    :raises ValueError: If there are no records.
    """
    if not records:
        raise ValueError("no answered questions to report")
    out = Path(out)
    summaries = summarize_runs(records)
    summary = {"title": title, "runs": summaries}
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2), encoding="utf-8")
    (out / TABLE_FILE).write_text(markdown_table(summaries, title=title), encoding="utf-8")
    draw_charts(summaries, out)
    return summary
