"""
The evaluation report: summary JSON, a markdown table laid out like Liu et al.'s Table 1, and PNG charts.

Rates carry 95% bootstrap intervals; strategies are compared with a baseline by paired bootstrap intervals of their EM
and F1 difference (Kim et al., Appendix H; `metrics.rate_ci`). With prices, each run's cost per question in US dollars
and the share of questions that fell back (`cost.run_cost`), and accuracy against cost as a chart. Records of several
run folders are told apart by a run label per record. Charts need matplotlib (`eval` extra).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any

from haystack_fusion.answers import DEMONSTRATION, copies_demonstration
from haystack_fusion.evaluation.calibration import calibration_report, dollars, markdown
from haystack_fusion.evaluation.cost import Price, draw_cost_chart, label, run_cost
from haystack_fusion.evaluation.metrics import (
    BOOTSTRAP_RESAMPLES,
    DEFAULT_SEED,
    bootstrap_settings,
    excludes_zero,
    outcome_counts,
    paired_difference_ci,
    rate_ci,
    summarize,
    with_answer_outcome,
)
from haystack_fusion.evaluation.records import QuestionRecord, group_runs
from haystack_fusion.prompts import PROMPTS
from haystack_fusion.strategies import STRATEGIES

SUMMARY_FILE = "summary.json"
TABLE_FILE = "results.md"
TOKENS_CHART = "em_vs_tokens.png"
TOPK_CHART = "em_vs_top_k.png"
NOISE_CHART = "em_vs_noise_ratio.png"
DEFAULT_BASELINE = "concatenation"
# The rates of `metrics.summarize` that carry a bootstrap confidence interval (`<key>_ci`), and the per-question values
# each is the mean of, over the same questions as `summarize`.
RATES: dict[str, Callable[[Sequence[Any]], list[Any]]] = {
    "em": lambda scores: [s.em for s in scores if s.answerable],
    "f1": lambda scores: [s.f1 for s in scores if s.answerable],
    "accuracy": lambda scores: [s.accuracy for s in scores if s.answerable],
    "unknown_rate": lambda scores: [s.unknown for s in scores if s.answerable],
    "reject_rate": lambda scores: [s.unknown for s in scores if not s.answerable],
    "recall_at_k": lambda scores: [s.retrieval_hit for s in scores if s.answerable and s.retrieval_hit is not None],
}

_RunKey = tuple[str, str, int, str]
"""(run label, strategy, k, setting); the label is "" for records of one run."""


def _ci(values: Sequence[Any], seed: int) -> list[float] | None:
    interval = rate_ci(values, seed=seed)
    return list(interval) if interval is not None else None


def outcome_records(records: Sequence[QuestionRecord]) -> list[QuestionRecord]:
    """The records (same order) with their scores' answer-outcome flags set (`metrics.with_answer_outcome`)."""
    return [
        dataclasses.replace(record, score=with_answer_outcome(record.score, record.prediction, record.evidence))
        for record in records
    ]


def demonstration_answers(strategy: str) -> dict[str, tuple[str, ...]]:
    """Prompt name -> few-shot demonstration answers, for the prompts of a strategy that have any (none if unknown)."""
    spec = STRATEGIES.get(strategy)
    return {name: PROMPTS[name].demonstrations for name in spec.prompts if PROMPTS[name].demonstrations} if spec else {}


def run_groups(
    records: Sequence[QuestionRecord], runs: Sequence[str] | None = None
) -> dict[_RunKey, list[QuestionRecord]]:
    """
    The records per run: `records.group_runs` within each run label (`runs`: one per record, same order; None: all "").

    :raises ValueError: If `runs` does not have one label per record.
    """
    labels = [""] * len(records) if runs is None else list(runs)
    if len(labels) != len(records):
        raise ValueError(f"one run label per record: got {len(labels)} labels and {len(records)} records")
    return {
        (label, *key): group
        for label in dict.fromkeys(labels)
        for key, group in group_runs(r for r, mine in zip(records, labels, strict=True) if mine == label).items()
    }


def answer_outcomes(
    records: Sequence[QuestionRecord], *, seed: int = DEFAULT_SEED, runs: Sequence[str] | None = None
) -> dict[_RunKey, dict[str, Any]]:
    """The answers that are not answers per run: `metrics.outcome_counts`, invalid reasons, demonstration copies."""
    outcomes: dict[_RunKey, dict[str, Any]] = {}
    for key, group in run_groups(outcome_records(records), runs).items():
        demos = demonstration_answers(key[1])
        every = tuple(answer for answers in demos.values() for answer in answers)
        flags = [copies_demonstration(record.prediction, every, ()) for record in group]
        rejected = [
            r.evidence.get("invalid_reason") == DEMONSTRATION
            or any(DEMONSTRATION in str(stage.get("reason") or "") for stage in r.evidence.get("stages") or [])
            for r in group
        ]
        reasons = Counter(str(r.evidence.get("invalid_reason")) for r in group if r.score.invalid)
        outcomes[key] = {
            **outcome_counts([record.score for record in group]),
            "invalid_reasons": dict(sorted(reasons.items())),
            "demo_copy_count": sum(flags),
            "demo_copy_rate": 100.0 * sum(flags) / len(flags) if demos else None,
            "demo_copy_rate_ci": _ci(flags, seed) if demos else None,
            "demo_copy_prompts": {
                name: sum(copies_demonstration(record.prediction, answers, ()) for record in group)
                for name, answers in demos.items()
            },
            "demo_rejected_count": sum(rejected),
        }
    return outcomes


def summarize_runs(
    records: Sequence[QuestionRecord], *, seed: int = DEFAULT_SEED, runs: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """One `metrics.summarize` per run, with `<key>_ci` (`metrics.rate_ci`) after each rate of `RATES`; `run` first
    when the run has a label."""
    summaries = []
    for (run, strategy, top_k, setting), group in run_groups(records, runs).items():
        scores = [record.score for record in group]
        summary: dict[str, Any] = {**({"run": run} if run else {}), "strategy": strategy, "top_k": top_k,
                                   "setting": setting}  # fmt: skip
        for key, value in summarize(scores).items():
            summary[key] = value
            if key in RATES:
                summary[f"{key}_ci"] = _ci(RATES[key](scores), seed)
        summaries.append(summary)
    return summaries


def resolve_baseline(records: Sequence[QuestionRecord], baseline: str | None = None) -> str | None:
    """`baseline`, else `concatenation` when it ran, else None. :raises ValueError: If `baseline` did not run."""
    present = list(dict.fromkeys(record.strategy for record in records))
    if baseline is None:
        return DEFAULT_BASELINE if DEFAULT_BASELINE in present else None
    if baseline not in present:
        raise ValueError(f"baseline {baseline!r} did not run; the strategies in the records are: {', '.join(present)}")
    return baseline


def baseline_differences(
    records: Sequence[QuestionRecord], baseline: str, *, seed: int = DEFAULT_SEED, runs: Sequence[str] | None = None
) -> dict[_RunKey, dict[str, Any]]:
    """The EM and F1 difference of every other run against the baseline at the same k and setting (of the same run
    label, else of the first that has it), in percentage points with paired bootstrap intervals
    (`metrics.paired_difference_ci`), over answerable questions both answered."""
    groups = run_groups(records, runs)
    differences = {}
    for (run, strategy, top_k, setting), group in groups.items():
        if strategy == baseline:
            continue
        same = [g for (label, name, k, s), g in groups.items() if (name, k, s) == (baseline, top_k, setting)]
        base_group = groups.get((run, baseline, top_k, setting)) or (same[0] if same else [])
        theirs = {r.question_id: r.score for r in base_group if r.score.answerable}
        mine = {r.question_id: r.score for r in group if r.score.answerable and r.question_id in theirs}
        entry: dict[str, Any] = {"paired_questions": len(mine)}
        for metric in ("em", "f1"):
            ours = [getattr(score, metric) for score in mine.values()]
            base = [getattr(theirs[question_id], metric) for question_id in mine]
            result = paired_difference_ci(ours, base, seed=seed)
            # fewer than two pairs: the difference without an interval
            entry[f"{metric}_diff"] = result[0] if result else (100.0 * (ours[0] - base[0]) if ours else None)
            entry[f"{metric}_diff_ci"] = [result[1], result[2]] if result else None
        for metric in ("em", "f1"):
            entry[f"{metric}_diff_significant"] = excludes_zero(entry[f"{metric}_diff_ci"])
        entry["diff_significant"] = entry["em_diff_significant"] or entry["f1_diff_significant"]
        differences[(run, strategy, top_k, setting)] = entry
    return differences


def noise_ratio(setting: str) -> float | None:
    """The noise ratio of a setting label ("retrieved, noise ratio 0.4" -> 0.4), None without one."""
    match = re.search(r"noise ratio ([0-9.]+)", setting)
    return float(match.group(1)) if match else None


def _cell(value: Any, percent: bool = False, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}" + ("%" if percent else "")


def _rate(s: dict[str, Any], key: str, percent: bool = False) -> str:
    """A rate's cell with its confidence interval when the summary has one: `32.5 [28.1, 37.0]`."""
    interval = s.get(f"{key}_ci")
    cell = _cell(s[key], percent)
    return f"{cell} [{interval[0]:.1f}, {interval[1]:.1f}]" if s[key] is not None and interval else cell


def _signed(value: float) -> str:
    """Percentage points with their sign, one decimal; a rounded zero is +0.0, never -0.0."""
    text = f"{value:+.1f}"
    return "+0.0" if text == "-0.0" else text


def _difference(s: dict[str, Any], metric: str) -> str:
    """A difference's cell, `+4.2 [0.8, 7.5]*`, the star when the interval excludes 0."""
    difference, interval = s.get(f"{metric}_diff"), s.get(f"{metric}_diff_ci")
    if difference is None or interval is None:
        return "-" if difference is None else _signed(difference)
    star = "*" if excludes_zero(interval) else ""
    return f"{_signed(difference)} [{_signed(interval[0])}, {_signed(interval[1])}]{star}"


MAIN_COLUMNS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "EM": lambda s: _rate(s, "em"),
    "F1": lambda s: _rate(s, "f1"),
    "%Unk": lambda s: _rate(s, "unknown_rate", True),
    "%NM": lambda s: _cell(s["nm_rate"], True),
    "accuracy": lambda s: _rate(s, "accuracy"),
    "reject rate": lambda s: _rate(s, "reject_rate", True),
    "recall@k": lambda s: _rate(s, "recall_at_k", True),
    "calls/q": lambda s: _cell(s["calls_per_question"], digits=2),
    "tokens/q": lambda s: _cell(s["tokens_per_question"], digits=0),
    "p50 s": lambda s: _cell(s["latency_p50"], digits=2),
    "p95 s": lambda s: _cell(s["latency_p95"], digits=2),
}
"""The main table's columns after strategy, (setting,) top-k: header -> the cell of a run's summary."""

COST_COLUMNS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "cost/q $": lambda s: dollars(s["cost_per_question"], s.get("cost_per_question_ci"), missing="-"),
    "fallback %": lambda s: _rate(s, "escalated_rate", True),
}
"""Main-table columns after F1, each only when some run has its figure (`cost.run_cost`)."""

MODEL_COLUMNS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "model": itemgetter("model"),
    "calls/q": lambda m: _cell(m["calls_per_question"], digits=2),
    "prompt tokens/q": lambda m: _cell(m["prompt_tokens_per_question"], digits=0),
    "completion tokens/q": lambda m: _cell(m["completion_tokens_per_question"], digits=0),
    "cost/q $": lambda m: dollars(m["cost_per_question"], missing="-"),
}

DIFFERENCE_COLUMNS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "ΔEM": lambda s: _difference(s, "em"),
    "ΔF1": lambda s: _difference(s, "f1"),
    "n": lambda s: s.get("paired_questions", 0),
}

OUTCOME_COLUMNS: dict[str, Callable[[dict[str, Any]], Any]] = {
    **{
        name: itemgetter(key)
        for name, key in (
            ("questions", "questions"),
            ("answered", "answered_count"),
            ("unknown", "unknown_count"),
            ("empty", "empty_count"),
            ("invalid", "invalid_count"),
            ("truncated", "truncated_count"),
            ("cut calls", "truncated_calls"),
            ("demo copies", "demo_copy_count"),
        )
    },
    "demo copy rate": lambda s: _rate(s, "demo_copy_rate", True),
    "demo rejected": lambda s: s["demo_rejected_count"],
}

OUTCOME_NOTE = (
    "Counts over all questions (answerable and unanswerable). answered: neither empty, invalid nor unknown. "
    "unknown: abstentions (%Unk and the reject rate count these). empty: blank answers, the rejected ones "
    "included. invalid: answers the answer checks rejected (passage markup, a demonstration answer no passage "
    "holds, an empty enumeration, a repeat of the question); they are not unknown and score 0. truncated: "
    "answers whose reply the token cap cut (the answer's own reply where the records keep its finish reason, "
    "else any call of the question); cut calls: LLM calls the cap cut (both 0 for records that keep no finish "
    "reason). demo copies: final answers equal, after normalization, to a few-shot demonstration answer of the "
    "strategy's prompts (rate over all questions, brackets as above; - for a strategy without demonstrations); "
    "demo rejected: answers the checks rejected as a demonstration answer."
)

SAS_NOTE = (
    "SAS: semantic answer similarity x100, the cosine similarity of the prediction's and the best gold answer's "
    "all-MiniLM-L6-v2 embeddings (Haystack's SASEvaluator), mean over the answerable questions; brackets as "
    "above. It credits long answers that EM misses, but a long right answer can score below a short wrong one: "
    "read it with accuracy (docs/evaluation-haystack.md)."
)


def _table(
    runs: Sequence[dict[str, Any]], columns: Mapping[str, Callable[[dict[str, Any]], Any]], setting: bool
) -> str:
    """A markdown table of one row per run: (run,) strategy, (setting,) top-k, then `columns` (header -> cell of a
    run); the run column when the runs have labels."""
    labelled = any("run" in s for s in runs)
    header = [*(["run"] if labelled else []), "strategy", *(["setting"] if setting else []), "top-k", *columns]
    return markdown(
        header,
        ([*([s.get("run", "")] if labelled else []), s["strategy"], *([s["setting"]] if setting else []), s["top_k"],
          *(c(s) for c in columns.values())] for s in runs),
    )  # fmt: skip


def main_columns(summaries: Sequence[dict[str, Any]]) -> dict[str, Callable[[dict[str, Any]], Any]]:
    """`MAIN_COLUMNS` with the `COST_COLUMNS` some run has a figure for after F1."""
    figures = {"cost/q $": "cost_per_question", "fallback %": "escalated_rate"}
    columns: dict[str, Callable[[dict[str, Any]], Any]] = {}
    for name, cell in MAIN_COLUMNS.items():
        columns[name] = cell
        if name == "F1":
            columns.update((key, c) for key, c in COST_COLUMNS.items() if any(s.get(figures[key]) is not None
                                                                              for s in summaries))  # fmt: skip
    return columns


def markdown_table(
    summaries: Sequence[dict[str, Any]],
    *,
    baseline: str | None = None,
    bootstrap: dict[str, Any] | None = None,
) -> str:
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
        notes += (
            "\n\ncost/q $: US dollars per question at the prices below, mean over all questions (bracket: 95% "
            "bootstrap interval)."
        )
    if any(s.get("escalated_rate") is not None for s in summaries):
        notes += (
            "\n\nfallback %: share of the questions the first round (concatenation) passed on to the fallback rounds; "
            "- for strategies without rounds."
        )
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


def _em_lines(points: Sequence[tuple[str, Any, float]], path: Path, *, xlabel: str, title: str) -> None:
    """One line of EM over x per strategy, from (strategy, x, EM) points, saved as a PNG at `path`."""
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for strategy in dict.fromkeys(name for name, _, _ in points):
        series = sorted((x, em) for name, x, em in points if name == strategy)
        axes.plot([x for x, _ in series], [em for _, em in series], marker="o", label=strategy)
    axes.set(xlabel=xlabel, ylabel="EM (answerable questions)", title=title)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def draw_charts(summaries: Sequence[dict[str, Any]], out: Path) -> None:
    """
    Draw EM vs tokens (Liu et al. Figure 3), EM vs top-k (Figure 4) and EM vs noise ratio (Yu et al. Table 3).

    :raises ImportError: Without matplotlib (the `eval` extra).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    smallest = min(s["top_k"] for s in summaries)
    first_setting = summaries[0]["setting"]
    points = [s for s in summaries if s["top_k"] == smallest and s["setting"] == first_setting and s["em"] is not None]
    figure, axes = plt.subplots(figsize=(6, 4))
    for index, s in enumerate(points):
        axes.scatter(s["tokens_per_question"], s["em"])
        offset = (4, 4) if index % 2 == 0 else (4, -12)  # alternate, so labels of nearby points do not overlap
        axes.annotate(label(s), (s["tokens_per_question"], s["em"]), textcoords="offset points", xytext=offset)
    axes.set(xlabel="tokens per question (prompt + completion)", ylabel="EM (answerable questions)",
             title=f"EM vs tokens, top-{smallest} (cf. Liu et al. Figure 3)")  # fmt: skip
    figure.tight_layout()
    figure.savefig(out / TOKENS_CHART, dpi=120)
    plt.close(figure)
    if len({s["top_k"] for s in summaries}) > 1:
        by_k = [(label(s), s["top_k"], s["em"]) for s in summaries if s["em"] is not None]
        _em_lines(by_k, out / TOPK_CHART, xlabel="top-k passages", title="EM vs top-k (cf. Liu et al. Figure 4)")
    noisy = [(label(s), noise_ratio(s["setting"]), s["em"]) for s in summaries if s["em"] is not None]
    noisy = [(strategy, ratio, em) for strategy, ratio, em in noisy if ratio is not None]
    if len({ratio for _, ratio, _ in noisy}) > 1:
        _em_lines(noisy, out / NOISE_CHART, xlabel="noise ratio (share of irrelevant passages in the top-k)",
                  title="EM vs noise ratio (cf. Yu et al. Table 3)")  # fmt: skip


def write_report(
    records: Sequence[QuestionRecord],
    out: str | Path,
    *,
    title: str = "",
    baseline: str | None = None,
    seed: int = DEFAULT_SEED,
    sas: Mapping[tuple[str, int, str, str], float | None] | None = None,
    notes: Sequence[str] = (),
    runs: Sequence[str] | None = None,
    prices: Mapping[str, Price] | None = None,
    target_accuracy: float | None = None,
    target_fallback: float | None = None,
) -> dict[str, Any]:
    """
    Write `summary.json` (`title`, `baseline`, `bootstrap`, `prices`, `runs`, `calibration`, `notes`), `results.md`
    and the charts into `out`.

    :param baseline: The strategy the others are compared with; None for `concatenation` when it ran.
    :param sas: SAS per record key (`haystack_eval.records_sas`, in [-1, 1]): adds each run's `sas` and `sas_ci`.
    :param runs: A run label per record (same order), e.g. its folder, to tell apart runs of one strategy made with
        other LLM setups; None: one run.
    :param prices: US dollars per million prompt and completion tokens per model (`cost.parse_prices`): each run's
        `cost_per_question` and the `accuracy_vs_cost.png` chart.
    :param target_accuracy: SQuAD 2.0 EM (%) the calibrated tau must reach (`calibration.choose`).
    :param target_fallback: The largest share of questions that fall back (%) the calibrated tau may have
        (`calibration.choose`).
    :returns: The summary written.
    :raises ValueError: If there are no records, `baseline` names a strategy that has no records, `runs` does not
        have one label per record, or the targets are invalid (`calibration.choose`).
    """
    if not records:
        raise ValueError("no answered questions to report")
    resolved = resolve_baseline(records, baseline)
    out = Path(out)
    prices = dict(prices or {})
    records = outcome_records(records)
    summaries = summarize_runs(records, seed=seed, runs=runs)
    outcomes = answer_outcomes(records, seed=seed, runs=runs)
    differences = baseline_differences(records, resolved, seed=seed, runs=runs) if resolved is not None else {}
    groups = run_groups(records, runs)
    for s in summaries:
        key = (s.get("run", ""), s["strategy"], s["top_k"], s["setting"])
        s.update(outcomes[key])
        s.update(differences.get(key, {}))
        s.update(run_cost(groups[key], prices, seed=seed))
        if sas is not None:
            values = [float(v) for r in groups[key] if r.answerable and (v := sas.get(r.key())) is not None]
            s["sas"] = 100 * sum(values) / len(values) if values else None
            s["sas_ci"] = _ci(values, seed)
    bootstrap = bootstrap_settings(seed)
    calibrated, calibration = calibration_report(
        records, out, seed=seed, prices=prices, target_accuracy=target_accuracy, target_fallback=target_fallback
    )
    unpriced = list(dict.fromkeys(model for s in summaries for model in s["unpriced_models"]))
    if prices and unpriced:
        notes = [*notes, f"No price for {', '.join(unpriced)}: their runs' cost is unknown (-)."]
    summary = {
        "title": title,
        "baseline": resolved,
        "bootstrap": bootstrap,
        "prices": {model: list(price) for model, price in prices.items()},
        "runs": summaries,
        "calibration": calibration,
        "notes": list(notes),
    }
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2), encoding="utf-8")
    several = len({s["setting"] for s in summaries}) > 1
    table = markdown_table(summaries, baseline=resolved, bootstrap=bootstrap)
    text = (f"{title}\n\n" if title else "") + "".join(f"Note: {note}\n\n" for note in notes) + table[:-1]
    if prices or any(r.evidence.get("usage_by_model") for r in records):
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
    chart = draw_cost_chart(summaries, calibration["concat_pf_sweep"], out)
    if chart is not None:
        text += f"\n![accuracy against cost]({chart.name})\n"
    (out / TABLE_FILE).write_text(text + calibrated, encoding="utf-8")
    draw_charts(summaries, out)
    return summary
