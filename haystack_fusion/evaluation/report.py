"""
The evaluation report: summary JSON, a markdown table laid out like Liu et al.'s Table 1, and PNG charts.

Rates carry 95% bootstrap intervals; strategies are compared with a baseline by paired bootstrap intervals of their EM
and F1 difference (Kim et al., Appendix H; `stats`). Charts need matplotlib (`eval` extra).
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

from haystack_fusion.evaluation.calibration import calibration_report
from haystack_fusion.evaluation.metrics import QuestionScore, outcome_counts, summarize, with_answer_outcome
from haystack_fusion.evaluation.runner import QuestionRecord
from haystack_fusion.evaluation.stats import (
    BOOTSTRAP_RESAMPLES,
    DEFAULT_SEED,
    bootstrap_settings,
    excludes_zero,
    paired_difference_ci,
    rate_ci,
)
from haystack_fusion.prompts import PROMPTS
from haystack_fusion.strategies import STRATEGIES
from haystack_fusion.validation import DEMONSTRATION, copies_demonstration

SUMMARY_FILE = "summary.json"
TABLE_FILE = "results.md"
TOKENS_CHART = "em_vs_tokens.png"
TOPK_CHART = "em_vs_top_k.png"
NOISE_CHART = "em_vs_noise_ratio.png"
DEFAULT_BASELINE = "concatenation"
# The rates of `metrics.summarize` that carry a bootstrap confidence interval (`<key>_ci`).
RATE_KEYS = ("em", "f1", "accuracy", "unknown_rate", "reject_rate", "recall_at_k")

_RunKey = tuple[str, int, str]


def _group(records: Sequence[QuestionRecord]) -> dict[_RunKey, list[QuestionRecord]]:
    """The records per (strategy, k, setting), in the order the records first name them."""
    groups: dict[_RunKey, list[QuestionRecord]] = {}
    for record in records:
        groups.setdefault((record.strategy, record.top_k, record.setting), []).append(record)
    return groups


def _rate_values(scores: Sequence[QuestionScore]) -> dict[str, list[float] | list[bool]]:
    """Per rate of `RATE_KEYS`, the per-question values it is the mean of, over the same questions as `summarize`."""
    answerable = [score for score in scores if score.answerable]
    return {
        "em": [score.em for score in answerable],
        "f1": [score.f1 for score in answerable],
        "accuracy": [score.accuracy for score in answerable],
        "unknown_rate": [score.unknown for score in answerable],
        "reject_rate": [score.unknown for score in scores if not score.answerable],
        "recall_at_k": [score.retrieval_hit for score in answerable if score.retrieval_hit is not None],
    }


def _interval(interval: Sequence[float] | None) -> list[float] | None:
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
    prompts = spec.prompts if spec is not None else ()
    return {name: PROMPTS[name].demonstrations for name in prompts if PROMPTS[name].demonstrations}


def _rejected_as_demonstration(evidence: Mapping[str, Any]) -> bool:
    """Whether the answer checks rejected a demonstration copy: the final answer, or a fallback stage's answer."""
    if evidence.get("invalid_reason") == DEMONSTRATION:
        return True
    return any(DEMONSTRATION in str(stage.get("reason") or "") for stage in evidence.get("stages") or [])


def demonstration_copies(
    records: Sequence[QuestionRecord], *, seed: int = DEFAULT_SEED
) -> dict[_RunKey, dict[str, Any]]:
    """
    How often a run's final answer is one of its prompts' few-shot demonstration answers, and how often the answer
    checks caught one.

    :returns: Per (strategy, k, setting): `demo_copy_count`, `demo_copy_rate` (x100 over all questions; None without
        demonstrations) and its `demo_copy_rate_ci`, `demo_copy_prompts` (prompt name -> copies) and
        `demo_rejected_count` (final or fallback-stage answers rejected as a demonstration answer).
    """
    copies: dict[_RunKey, dict[str, Any]] = {}
    for (strategy, top_k, setting), group in _group(records).items():
        demos = demonstration_answers(strategy)
        every = tuple(answer for answers in demos.values() for answer in answers)
        flags = [copies_demonstration(record.prediction, every, ()) for record in group]
        by_prompt = {
            name: sum(copies_demonstration(record.prediction, answers, ()) for record in group)
            for name, answers in demos.items()
        }
        copies[(strategy, top_k, setting)] = {
            "demo_copy_count": sum(flags),
            "demo_copy_rate": 100.0 * sum(flags) / len(flags) if demos else None,
            "demo_copy_rate_ci": _interval(rate_ci(flags, seed=seed)) if demos else None,
            "demo_copy_prompts": by_prompt,
            "demo_rejected_count": sum(_rejected_as_demonstration(record.evidence) for record in group),
        }
    return copies


def answer_outcomes(records: Sequence[QuestionRecord], *, seed: int = DEFAULT_SEED) -> dict[_RunKey, dict[str, Any]]:
    """
    The answers that are not answers, per (strategy, k, setting): the keys of `metrics.outcome_counts`,
    `invalid_reasons` (reason -> count) and the keys of `demonstration_copies`.
    """
    copies = demonstration_copies(records, seed=seed)
    outcomes: dict[_RunKey, dict[str, Any]] = {}
    for key, group in _group(outcome_records(records)).items():
        reasons = Counter(str(r.evidence.get("invalid_reason")) for r in group if r.score.invalid)
        outcomes[key] = {
            **outcome_counts([record.score for record in group]),
            "invalid_reasons": dict(sorted(reasons.items())),
            **copies[key],
        }
    return outcomes


def summarize_runs(records: Sequence[QuestionRecord], *, seed: int = DEFAULT_SEED) -> list[dict[str, Any]]:
    """
    One summary per (strategy, k, setting), in the order the records first name them: `strategy`, `top_k`,
    `setting`, the keys of `metrics.summarize`, and `<key>_ci` after each rate of `RATE_KEYS`: its 95% bootstrap
    interval in percent over the same questions (`stats.rate_ci`), None over fewer than two.
    """
    summaries = []
    for (strategy, top_k, setting), group in _group(records).items():
        scores = [record.score for record in group]
        values = _rate_values(scores)
        summary: dict[str, Any] = {"strategy": strategy, "top_k": top_k, "setting": setting}
        for key, value in summarize(scores).items():
            summary[key] = value
            if key in RATE_KEYS:
                summary[f"{key}_ci"] = _interval(rate_ci(values[key], seed=seed))
        summaries.append(summary)
    return summaries


def resolve_baseline(records: Sequence[QuestionRecord], baseline: str | None = None) -> str | None:
    """
    The strategy the others are compared with: `baseline`, else `concatenation` when it ran, else None.

    :raises ValueError: If `baseline` names a strategy that has no records.
    """
    present = list(dict.fromkeys(record.strategy for record in records))
    if baseline is None:
        return DEFAULT_BASELINE if DEFAULT_BASELINE in present else None
    if baseline not in present:
        raise ValueError(f"baseline {baseline!r} did not run; the strategies in the records are: {', '.join(present)}")
    return baseline


def baseline_differences(
    records: Sequence[QuestionRecord], baseline: str, *, seed: int = DEFAULT_SEED
) -> dict[tuple[str, int, str], dict[str, Any]]:
    """
    The EM and F1 difference of every other run against the baseline's at the same k and setting, over the answerable
    questions both answered, in percentage points with 95% paired bootstrap intervals (`stats.paired_difference_ci`).

    :returns: Per (strategy, k, setting): `paired_questions`, `em_diff`, `em_diff_ci`, `f1_diff`, `f1_diff_ci`,
        `em_diff_significant`, `f1_diff_significant` (the interval excludes 0) and `diff_significant` (either). A
        difference is None without a pair; an interval is None with fewer than two.
    """
    groups = _group(records)
    differences = {}
    for (strategy, top_k, setting), group in groups.items():
        if strategy == baseline:
            continue
        theirs = {r.question_id: r.score for r in groups.get((baseline, top_k, setting), []) if r.score.answerable}
        mine = {r.question_id: r.score for r in group if r.score.answerable and r.question_id in theirs}
        entry: dict[str, Any] = {"paired_questions": len(mine)}
        for metric in ("em", "f1"):
            ours = [getattr(score, metric) for score in mine.values()]
            base = [getattr(theirs[question_id], metric) for question_id in mine]
            result = paired_difference_ci(ours, base, seed=seed)
            if result is not None:
                difference: float | None = result[0]
                interval: list[float] | None = [result[1], result[2]]
            else:  # fewer than two pairs: the difference without an interval
                difference = 100.0 * (ours[0] - base[0]) if ours else None
                interval = None
            entry[f"{metric}_diff"] = difference
            entry[f"{metric}_diff_ci"] = interval
        for metric in ("em", "f1"):
            entry[f"{metric}_diff_significant"] = excludes_zero(entry[f"{metric}_diff_ci"])
        entry["diff_significant"] = entry["em_diff_significant"] or entry["f1_diff_significant"]
        differences[(strategy, top_k, setting)] = entry
    return differences


def noise_ratio(setting: str) -> float | None:
    """The noise ratio of a setting label ("retrieved, noise ratio 0.4" -> 0.4), None without one."""
    match = re.search(r"noise ratio ([0-9.]+)", setting)
    return float(match.group(1)) if match else None


def _cell(value: Any, percent: bool = False, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}%" if percent else f"{value:.{digits}f}"


def _rate(s: dict[str, Any], key: str, percent: bool = False) -> str:
    """A rate's cell with its confidence interval when the summary has one: `32.5 [28.1, 37.0]`."""
    interval = s.get(f"{key}_ci")
    cell = _cell(s[key], percent)
    return f"{cell} [{interval[0]:.1f}, {interval[1]:.1f}]" if s[key] is not None and interval else cell


def _table(runs: Sequence[dict[str, Any]], columns: dict[str, Callable[[dict[str, Any]], Any]], setting: bool) -> str:
    """A markdown table of one row per run: strategy, (setting,) top-k, then `columns` (header -> cell of a run)."""
    names = ["strategy", *(["setting"] if setting else []), "top-k", *columns]
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for s in runs:
        cells = [s["strategy"], *([s["setting"]] if setting else []), s["top_k"]]
        cells += [cell(s) for cell in columns.values()]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def _signed(value: float) -> str:
    """Percentage points with their sign, one decimal; a rounded zero is +0.0, never -0.0."""
    text = f"{value:+.1f}"
    return "+0.0" if text == "-0.0" else text


def _difference(s: dict[str, Any], metric: str) -> str:
    """A difference's cell, `+4.2 [0.8, 7.5]*`, the star when the interval excludes 0."""
    difference, interval = s.get(f"{metric}_diff"), s.get(f"{metric}_diff_ci")
    if difference is None:
        return "-"
    if interval is None:
        return _signed(difference)
    star = "*" if excludes_zero(interval) else ""
    return f"{_signed(difference)} [{_signed(interval[0])}, {_signed(interval[1])}]{star}"


def _difference_table(summaries: Sequence[dict[str, Any]], baseline: str, *, with_setting: bool) -> str:
    """The paired EM and F1 differences of the runs that have them, against `baseline`."""
    compared = [s for s in summaries if s["strategy"] != baseline and "em_diff" in s]
    if not compared:
        return ""
    columns = {
        "ΔEM": lambda s: _difference(s, "em"),
        "ΔF1": lambda s: _difference(s, "f1"),
        "n": lambda s: s.get("paired_questions", 0),
    }
    table = _table(compared, columns, with_setting)
    note = (
        f"ΔEM and ΔF1: percentage points, strategy minus {baseline} at the same top-k and setting, over the n "
        "answerable questions both answered; brackets: paired 95% bootstrap confidence interval (the same resampled "
        "questions for both strategies). * marks a difference whose interval excludes 0."
    )
    return f"\n\nPaired difference vs {baseline} (answerable questions)\n\n{table}\n\n{note}"


def markdown_table(
    summaries: Sequence[dict[str, Any]],
    *,
    title: str = "",
    baseline: str | None = None,
    bootstrap: dict[str, Any] | None = None,
) -> str:
    """
    The results as a markdown table laid out like Liu et al.'s Table 1 (EM, F1, %Unk, %NM), plus accuracy, reject
    rate, recall@k, calls, tokens and latency, with a setting column when there are several (e.g. noise ratios, Yu
    et al. Table 3), rates with their intervals, and with a baseline a second table of paired differences.
    """
    several = len({s["setting"] for s in summaries}) > 1
    columns: dict[str, Callable[[dict[str, Any]], Any]] = {
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
    first = summaries[0] if summaries else {}
    notes = (
        f"\n\n{first.get('answerable', 0)} answerable and {first.get('unanswerable', 0)} unanswerable questions; "
        "EM, F1, accuracy, %Unk, %NM and recall@k over answerable questions, reject rate over unanswerable ones "
        "(an unknown answer is correct there). %NM: share of the questions whose post-fusion pool holds a gold "
        "answer where the majority picked another."
    )
    if any(f"{key}_ci" in s for s in summaries for key in RATE_KEYS):
        settings = bootstrap or {}
        notes += (
            f"\n\nBrackets: {100 * settings.get('confidence', 0.95):g}% bootstrap confidence intervals over the same "
            f"questions as the rate, {settings.get('resamples', BOOTSTRAP_RESAMPLES)} resamples of the questions"
            + (f", {settings['method']} method" if "method" in settings else "")
            + (f", seed {settings['seed']}" if "seed" in settings else "")
            + " (Kim et al., Appendix H); none with fewer than two questions."
        )
    differences = _difference_table(summaries, baseline, with_setting=several) if baseline else ""
    return (f"{title}\n\n" if title else "") + _table(summaries, columns, several) + notes + differences + "\n"


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
    Draw EM vs tokens per question (smallest k, first setting; Liu et al. Figure 3), EM vs top-k when k was swept
    (Figure 4), and EM vs noise ratio with several ratios (Yu et al. Table 3); returns the paths written.

    :raises ImportError: Without matplotlib (the `eval` extra).
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
    axes.set_title(f"EM vs tokens, top-{smallest} (cf. Liu et al. Figure 3)")
    figure.tight_layout()
    figure.savefig(out / TOKENS_CHART, dpi=120)
    plt.close(figure)
    written.append(out / TOKENS_CHART)
    if len({s["top_k"] for s in summaries}) > 1:
        by_k = [(s["strategy"], s["top_k"], s["em"]) for s in summaries if s["em"] is not None]
        written.append(
            _em_lines(by_k, out / TOPK_CHART, xlabel="top-k passages", title="EM vs top-k (cf. Liu et al. Figure 4)")
        )
    noisy = [(s["strategy"], noise_ratio(s["setting"]), s["em"]) for s in summaries if s["em"] is not None]
    noisy = [(strategy, ratio, em) for strategy, ratio, em in noisy if ratio is not None]
    if len({ratio for _, ratio, _ in noisy}) > 1:
        written.append(
            _em_lines(
                noisy,
                out / NOISE_CHART,
                xlabel="noise ratio (share of irrelevant passages in the top-k)",
                title="EM vs noise ratio (cf. Yu et al. Table 3)",
            )
        )
    return written


def add_sas(
    summaries: Sequence[dict[str, Any]],
    records: Sequence[QuestionRecord],
    sas: Mapping[tuple[str, int, str, str], float | None],
    *,
    seed: int = DEFAULT_SEED,
) -> None:
    """
    Add `sas` (mean SAS x100 over the answerable questions with a score; `sas` maps record keys to
    `haystack_eval.records_sas` values in [-1, 1]) and its bootstrap interval `sas_ci` to each summary, in place.
    """
    for s in summaries:
        values = [
            float(value)
            for (strategy, top_k, setting), group in _group(records).items()
            if (strategy, top_k, setting) == (s["strategy"], s["top_k"], s["setting"])
            for record in group
            if record.answerable and (value := sas.get(record.key())) is not None
        ]
        s["sas"] = 100 * sum(values) / len(values) if values else None
        s["sas_ci"] = _interval(rate_ci(values, seed=seed))


def _outcome_table(summaries: Sequence[dict[str, Any]], *, with_setting: bool) -> str:
    """The "Answer outcomes" table: the counts of `answer_outcomes` per run, when the summaries have them."""
    runs = [s for s in summaries if "answered_count" in s]
    if not runs:
        return ""
    columns: dict[str, Callable[[dict[str, Any]], Any]] = {
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
    }
    columns["demo copy rate"] = lambda s: _rate(s, "demo_copy_rate", True)
    columns["demo rejected"] = lambda s: s["demo_rejected_count"]
    note = (
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
    return f"\n\nAnswer outcomes\n\n{_table(runs, columns, with_setting)}\n\n{note}"


def _sas_table(summaries: Sequence[dict[str, Any]], *, with_setting: bool) -> str:
    """The SAS of each run with its interval, when `add_sas` gave one."""
    if not any(s.get("sas") is not None for s in summaries):
        return ""
    table = _table(summaries, {"SAS": lambda s: _rate(s, "sas")}, with_setting)
    note = (
        "SAS: semantic answer similarity x100, the cosine similarity of the prediction's and the best gold answer's "
        "all-MiniLM-L6-v2 embeddings (Haystack's SASEvaluator), mean over the answerable questions; brackets as "
        "above. It credits long answers that EM misses, but a long right answer can score below a short wrong one: "
        "read it with accuracy (docs/evaluation-haystack.md)."
    )
    return f"\n\nSemantic answer similarity (answerable questions)\n\n{table}\n\n{note}\n"


def write_report(
    records: Sequence[QuestionRecord],
    out: str | Path,
    *,
    title: str = "",
    baseline: str | None = None,
    seed: int = DEFAULT_SEED,
    sas: Mapping[tuple[str, int, str, str], float | None] | None = None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """
    Write `summary.json` (`title`, `baseline`, `bootstrap`, `runs`, `calibration`, `notes`), `results.md` and the
    charts into `out`.


    :param baseline: The strategy the others are compared with; None for `concatenation` when it ran.
    :param seed: The bootstrap's seed, reported in both files.
    :param sas: SAS per record key (`haystack_eval.records_sas`).
    :returns: The summary written.
    :raises ValueError: If there are no records, or `baseline` names a strategy that has no records.
    """
    if not records:
        raise ValueError("no answered questions to report")
    resolved = resolve_baseline(records, baseline)
    out = Path(out)
    records = outcome_records(records)
    summaries = summarize_runs(records, seed=seed)
    outcomes = answer_outcomes(records, seed=seed)
    for s in summaries:
        s.update(outcomes[(s["strategy"], s["top_k"], s["setting"])])
    if resolved is not None:
        differences = baseline_differences(records, resolved, seed=seed)
        for s in summaries:
            s.update(differences.get((s["strategy"], s["top_k"], s["setting"]), {}))
    if sas is not None:
        add_sas(summaries, records, sas, seed=seed)
    bootstrap = bootstrap_settings(seed)
    calibrated, calibration = calibration_report(records, out, seed=seed)
    summary = {
        "title": title,
        "baseline": resolved,
        "bootstrap": bootstrap,
        "runs": summaries,
        "calibration": calibration,
        "notes": list(notes),
    }
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2), encoding="utf-8")
    several = len({s["setting"] for s in summaries}) > 1
    table = markdown_table(summaries, title=title, baseline=resolved, bootstrap=bootstrap)
    heading = f"{title}\n\n" if title else ""
    table = heading + "".join(f"Note: {note}\n\n" for note in notes) + table[len(heading) :]
    table = table[:-1] + _outcome_table(summaries, with_setting=several) + "\n"
    table += _sas_table(summaries, with_setting=several) + calibrated
    (out / TABLE_FILE).write_text(table, encoding="utf-8")
    draw_charts(summaries, out)
    return summary
