"""The evaluation report of `eval` and `report`: `summary.json`, `results.md` and PNG charts, every section read from
one `view.ReportView` (`figures`, `calibration`, `charts`, `tables`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from haystack_fusion.evaluation.calibration import calibrate
from haystack_fusion.evaluation.charts import draw_charts
from haystack_fusion.evaluation.figures import resolve_baseline, summarize_runs
from haystack_fusion.evaluation.metrics import DEFAULT_SEED, bootstrap_settings
from haystack_fusion.evaluation.records import QuestionRecord
from haystack_fusion.evaluation.tables import report_markdown
from haystack_fusion.evaluation.view import Price, ReportView

SUMMARY_FILE = "summary.json"
TABLE_FILE = "results.md"


def write_report(records: Sequence[QuestionRecord], out: str | Path, *, title: str = "", baseline: str | None = None,
                 seed: int = DEFAULT_SEED, sas: Mapping[tuple[str, int, str, str], float | None] | None = None,
                 notes: Sequence[str] = (), runs: Sequence[str] | None = None,
                 prices: Mapping[str, Price] | None = None, target_accuracy: float | None = None,
                 target_fallback: float | None = None) -> dict[str, Any]:  # fmt: skip
    """Write `summary.json` (`title`, `baseline`, `bootstrap`, `prices`, `runs`, `calibration`, `notes`), `results.md`
    and the charts into `out`; return the summary. `baseline`: the strategy the others are compared with (None:
    `concatenation` when it ran); `sas`: `haystack_eval.records_sas`; `runs`: a run label per record (e.g. its folder);
    `prices`: US dollars per million prompt and completion tokens per model; `target_accuracy` / `target_fallback`:
    `calibration.choose`'s targets (%).
    :raises ValueError: If there are no records, `baseline` did not run, `runs` does not have one label per record,
        or the targets are invalid."""
    if not records:
        raise ValueError("no answered questions to report")
    out = Path(out)
    view = ReportView.of(records, runs, prices)
    resolved = resolve_baseline(view, baseline)
    summaries = summarize_runs(view, seed=seed, baseline=resolved, sas=sas)
    calibration = calibrate(view, seed=seed, target_accuracy=target_accuracy, target_fallback=target_fallback)
    unpriced = list(dict.fromkeys(model for s in summaries for model in s["unpriced_models"]))
    if view.prices and unpriced:
        notes = [*notes, f"No price for {', '.join(unpriced)}: their runs' cost is unknown (-)."]
    summary = {
        "title": title,
        "baseline": resolved,
        "bootstrap": bootstrap_settings(seed),
        "prices": {model: list(price) for model, price in view.prices.items()},
        "runs": summaries,
        "calibration": calibration,
        "notes": list(notes),
    }
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2), encoding="utf-8")
    cost_chart, selective_chart = draw_charts(view, summaries, calibration["concat_pf_sweep"], out)
    text = report_markdown(summary, models=view.by_model, cost_chart=cost_chart, selective_chart=selective_chart)
    (out / TABLE_FILE).write_text(text, encoding="utf-8")
    return summary
