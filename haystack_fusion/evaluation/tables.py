"""The report's markdown (`results.md`) from the figures of `summary.json`; the main table as Liu et al.'s Table 1."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from haystack_fusion.evaluation.metrics import BOOTSTRAP_RESAMPLES, RATES


def _cell(value: Any, ci: Sequence[float] | None = None, *, spec: str = ".1f", suffix: str = "",
          missing: str = "-") -> str:  # fmt: skip
    """`value` as `spec` (then `suffix`), with the interval `ci` when there is one: `32.5% [28.1, 37.0]`."""
    if value is None:
        return missing
    return f"{value:{spec}}{suffix}" + (f" [{ci[0]:{spec}}, {ci[1]:{spec}}]" if ci else "")


def dollars(value: float | None, ci: Sequence[float] | None = None, *, missing: str = "–") -> str:
    """US dollars to three significant digits, with the interval when there is one; `missing` for None."""
    return _cell(value, ci, spec=".3g", missing=missing)


def _auc(result: dict[str, Any] | None) -> str:
    if result is None:
        return "–"
    return _cell(result["auroc"], result["ci"], spec=".2f") + f" ({result['positives']}/{result['negatives']})"


def markdown(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table: the header, then one line per row of cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def _rate(s: dict[str, Any], key: str, percent: bool = False) -> str:
    return _cell(s[key], s.get(f"{key}_ci"), suffix="%" if percent else "")


def _signed(value: float) -> str:
    """Percentage points with their sign, one decimal; a rounded zero is +0.0, never -0.0."""
    return "+0.0" if (text := f"{value:+.1f}") == "-0.0" else text


def _difference(s: dict[str, Any], metric: str) -> str:
    """A difference's cell, `+4.2 [0.8, 7.5]*`, the star when the interval excludes 0."""
    difference, interval = s.get(f"{metric}_diff"), s.get(f"{metric}_diff_ci")
    if difference is None or interval is None:
        return "-" if difference is None else _signed(difference)
    star = "*" if interval[0] > 0 or interval[1] < 0 else ""  # the interval excludes 0
    return f"{_signed(difference)} [{_signed(interval[0])}, {_signed(interval[1])}]{star}"


Columns = dict[str, Callable[[dict[str, Any]], Any]]
"""A table's columns: header -> the cell of a run's summary (or of a model's figures)."""

MAIN_COLUMNS: Columns = {
    "EM": lambda s: _rate(s, "em"), "F1": lambda s: _rate(s, "f1"), "%Unk": lambda s: _rate(s, "unknown_rate", True),
    "%NM": lambda s: _cell(s["nm_rate"], suffix="%"), "accuracy": lambda s: _rate(s, "accuracy"),
    "reject rate": lambda s: _rate(s, "reject_rate", True), "recall@k": lambda s: _rate(s, "recall_at_k", True),
    "calls/q": lambda s: _cell(s["calls_per_question"], spec=".2f"),
    "tokens/q": lambda s: _cell(s["tokens_per_question"], spec=".0f"),
    "p50 s": lambda s: _cell(s["latency_p50"], spec=".2f"),
    "p95 s": lambda s: _cell(s["latency_p95"], spec=".2f")}  # fmt: skip
"""The main table's columns after strategy, (setting,) top-k."""

COST_COLUMNS: Columns = {"cost/q $": lambda s: dollars(s["cost_per_question"], s.get("cost_per_question_ci"),
                                                       missing="-"),
                         "fallback %": lambda s: _rate(s, "escalated_rate", True)}  # fmt: skip
"""Main-table columns after F1, each only when some run has its figure (`figures.run_cost`)."""

MODEL_COLUMNS: Columns = {
    "model": itemgetter("model"), "calls/q": lambda m: _cell(m["calls_per_question"], spec=".2f"),
    "prompt tokens/q": lambda m: _cell(m["prompt_tokens_per_question"], spec=".0f"),
    "completion tokens/q": lambda m: _cell(m["completion_tokens_per_question"], spec=".0f"),
    "cost/q $": lambda m: dollars(m["cost_per_question"], missing="-")}  # fmt: skip

DIFFERENCE_COLUMNS: Columns = {"ΔEM": lambda s: _difference(s, "em"), "ΔF1": lambda s: _difference(s, "f1"),
                               "n": lambda s: s.get("paired_questions", 0)}  # fmt: skip

OUTCOME_COLUMNS: Columns = {
    **{name: itemgetter(key) for name, key in (
        ("questions", "questions"), ("answered", "answered_count"), ("unknown", "unknown_count"),
        ("empty", "empty_count"), ("invalid", "invalid_count"), ("truncated", "truncated_count"),
        ("cut calls", "truncated_calls"), ("demo copies", "demo_copy_count"))},
    "demo copy rate": lambda s: _rate(s, "demo_copy_rate", True),
    "demo rejected": itemgetter("demo_rejected_count")}  # fmt: skip

OUTCOME_NOTE = ("Counts over all questions (answerable and unanswerable). answered: neither empty, invalid nor "
    "unknown. unknown: abstentions (%Unk and the reject rate count these). empty: blank answers, the rejected ones "
    "included. invalid: answers the answer checks rejected (passage markup, a demonstration answer no passage holds, "
    "an empty enumeration, a repeat of the question); they are not unknown and score 0. truncated: answers whose "
    "reply the token cap cut (the answer's own reply where the records keep its finish reason, else any call of the "
    "question); cut calls: LLM calls the cap cut (both 0 for records that keep no finish reason). demo copies: final "
    "answers equal, after normalization, to a few-shot demonstration answer of the strategy's prompts (rate over all "
    "questions, brackets as above; - for a strategy without demonstrations); demo rejected: answers the checks "
    "rejected as a demonstration answer.")  # fmt: skip

SAS_NOTE = ("SAS: semantic answer similarity x100, the cosine similarity of the prediction's and the best gold "
    "answer's all-MiniLM-L6-v2 embeddings (Haystack's SASEvaluator), mean over the answerable questions; brackets as "
    "above. It credits long answers that EM misses, but a long right answer can score below a short wrong one: read "
    "it with accuracy (docs/evaluation-haystack.md).")  # fmt: skip


def _table(runs: Sequence[dict[str, Any]], columns: Columns, setting: bool) -> str:
    """One row per run: (run, when labelled,) strategy, (setting,) top-k, then `columns`."""
    labelled = any("run" in s for s in runs)
    header = [*(["run"] if labelled else []), "strategy", *(["setting"] if setting else []), "top-k", *columns]
    return markdown(header, ([*([s.get("run", "")] if labelled else []), s["strategy"], *([s["setting"]] if setting
                             else []), s["top_k"], *(c(s) for c in columns.values())] for s in runs))  # fmt: skip


def main_columns(summaries: Sequence[dict[str, Any]]) -> Columns:
    """`MAIN_COLUMNS` with the `COST_COLUMNS` some run has a figure for after F1."""
    figures = {"cost/q $": "cost_per_question", "fallback %": "escalated_rate"}
    columns: Columns = {}
    for name, cell in MAIN_COLUMNS.items():
        columns[name] = cell
        if name == "F1":
            columns.update((key, c) for key, c in COST_COLUMNS.items() if any(s.get(figures[key]) is not None
                                                                              for s in summaries))  # fmt: skip
    return columns


def markdown_table(summaries: Sequence[dict[str, Any]], *, baseline: str | None = None,
                   bootstrap: dict[str, Any] | None = None) -> str:  # fmt: skip
    """The results as a markdown table laid out like Liu et al.'s Table 1, and with a baseline paired differences."""
    several = len({s["setting"] for s in summaries}) > 1
    first = summaries[0] if summaries else {}
    notes = (
        f"\n\n{first.get('answerable', 0)} answerable and {first.get('unanswerable', 0)} unanswerable questions; "
        "EM, F1, accuracy, %Unk, %NM and recall@k over answerable questions, reject rate over unanswerable ones "
        "(an unknown answer is correct there). %NM: share of the questions whose post-fusion pool holds a gold "
        "answer where the majority picked another."
    )
    if any(f"{key}_ci" in s for s in summaries for key in RATES):
        settings = bootstrap or {}
        notes += (
            f"\n\nBrackets: {100 * settings.get('confidence', 0.95):g}% bootstrap confidence intervals over the same "
            f"questions as the rate, {settings.get('resamples', BOOTSTRAP_RESAMPLES)} resamples of the questions"
            + (f", {settings['method']} method" if "method" in settings else "")
            + (f", seed {settings['seed']}" if "seed" in settings else "")
            + " (Kim et al., Appendix H); none with fewer than two questions."
        )
    if any(s.get("cost_per_question") is not None for s in summaries):
        notes += ("\n\ncost/q $: US dollars per question at the prices below, mean over all questions (bracket: 95% "
                  "bootstrap interval).")  # fmt: skip
    if any(s.get("escalated_rate") is not None for s in summaries):
        notes += ("\n\nfallback %: share of the questions the first round (concatenation) passed on to the fallback "
                  "rounds; - for strategies without rounds.")  # fmt: skip
    compared = [s for s in summaries if s["strategy"] != baseline and "em_diff" in s] if baseline else []
    if compared:
        notes += (
            f"\n\nPaired difference vs {baseline} (answerable questions)\n\n"
            f"{_table(compared, DIFFERENCE_COLUMNS, several)}\n\nΔEM and ΔF1: percentage points, strategy minus "
            f"{baseline} at the same top-k and setting, over the n answerable questions both answered; brackets: "
            "paired 95% bootstrap confidence interval (the same resampled questions for both strategies). * marks a "
            "difference whose interval excludes 0."
        )
    return _table(summaries, main_columns(summaries), several) + notes + "\n"


def calibration_markdown(calibration: Mapping[str, Any], selective_chart: str | None) -> str:
    """The calibration sections (`calibration.calibrate`'s figures), each only when it has figures."""
    summary, rows, chosen = calibration, calibration["concat_pf_sweep"], calibration["tau_choice"] or {}
    best = next((r for r in rows if r["tau"] is not None and all(r[k] == chosen.get(k) for k in ("tau", "top_k",
                 "setting"))), None)  # fmt: skip
    parts = []
    if summary["auroc"]:
        table = markdown(
            ["strategy", "top-k", "questions", "AUROC correct", "AUROC answerable"],
            ([r["strategy"], r["top_k"], r["n"], _auc(r["correct"]), _auc(r["answerable"])] for r in summary["auroc"]),
        )
        parts.append(
            "\n## Answer confidence\n\nAUROC of the answering confidence with its 95% bootstrap CI and "
            "(positives/negatives): `correct` = answered exactly right among answerable questions; `answerable` = "
            f"answerable against unanswerable.\n\n{table}"
            + (f"\n\n![selective answering]({selective_chart})\n" if selective_chart else "")
        )
    if rows:
        priced = any(row["cost_per_question"] is not None for row in rows)
        shown = [r for r in rows if r is best or r["tau"] is None or round(r["tau"] * 100) in (20, 40, 60, 80)]
        table = markdown(
            ["top-k", "tau", "questions", "SQuAD 2.0 EM", "EM", "F1", "reject rate", "fallback %",
             *(["cost/q $"] if priced else [])],
            ([r["top_k"], "–" if r["tau"] is None else r["tau"], r["n"],
              _cell(r["squad2_em"], r["squad2_em_ci"], missing="–") + (" **chosen**" if r is best else ""),
              *(_cell(r[key], r[f"{key}_ci"], missing="–") for key in ("em", "f1", "reject_rate")),
              _cell(r["fallback_rate"], missing="–"),
              *([dollars(r["cost_per_question"], r["cost_per_question_ci"])] if priced else [])]
             for r in shown),
        )  # fmt: skip
        parts.append(
            "\n## concat_pf replayed at each threshold\n\nReplayed exactly from the concatenation records (the first "
            "round) and the fallback records of the same questions: post_fusion, else a fallen-back concat_pf or "
            "cascade record, from any folder given (tau `–`: text only, the paper's); a selection of the grid, all of "
            "it in summary.json. SQuAD 2.0 EM counts an unanswerable question right when the answer is unknown; "
            "fallback %: the share passed on to the fallback rounds"
            + ("; cost/q: the first round's cost, plus the fallback rounds' when passed on" if priced else "")
            + f".\n\n{table}\n\n{summary['tau_choice']['reason']}"
        )
    return "\n".join(parts) + ("\n" if parts else "")


def report_markdown(summary: Mapping[str, Any], *, models: bool, cost_chart: str | None,
                    selective_chart: str | None) -> str:  # fmt: skip
    """`results.md`: the title, notes, `markdown_table`, the table per model (with `models`, or prices), answer
    outcomes, SAS (when some run has it), the cost chart and the calibration."""
    summaries, prices, notes, title = summary["runs"], summary["prices"], summary["notes"], summary["title"]
    several = len({s["setting"] for s in summaries}) > 1
    table = markdown_table(summaries, baseline=summary["baseline"], bootstrap=summary["bootstrap"])
    text = (f"{title}\n\n" if title else "") + "".join(f"Note: {note}\n\n" for note in notes) + table[:-1]
    if prices or models:
        per_model = [{**s, **model} for s in summaries for model in s["models"]]
        text += (
            f"\n\nCalls and tokens per model (means over all questions)\n\n{_table(per_model, MODEL_COLUMNS, several)}"
            + ("\n\nPrices, US dollars per million input / output tokens: "
               + "; ".join(f"{model} {price[0]:g} / {price[1]:g}" for model, price in prices.items()) if prices else "")
        )  # fmt: skip
    text += f"\n\nAnswer outcomes\n\n{_table(summaries, OUTCOME_COLUMNS, several)}\n\n{OUTCOME_NOTE}\n"
    if any(s.get("sas") is not None for s in summaries):
        sas_table = _table(summaries, {"SAS": lambda s: _rate(s, "sas")}, several)
        text += f"\n\nSemantic answer similarity (answerable questions)\n\n{sas_table}\n\n{SAS_NOTE}\n"
    if cost_chart is not None:
        text += f"\n![accuracy against cost]({cost_chart})\n"
    return text + calibration_markdown(summary["calibration"], selective_chart)
