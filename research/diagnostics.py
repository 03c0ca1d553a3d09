"""
Diagnostics of evaluation runs for the bench, beside the report that `haystack-fusion report` writes: whether the
replay of `concat_pf` reproduces the run's own `concat_pf` records, how much SuRe's verification decided (Kim et al.,
Eq. 4-6), and which stage of a fallback strategy answered and why questions left a stage.

    .venv/bin/python -m research.diagnostics research/results/squad2-sample200 research/results/sure
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from haystack_fusion.evaluation.calibration import replay
from haystack_fusion.evaluation.records import RESULTS_FILE, QuestionRecord, read_records
from haystack_fusion.evaluation.tables import markdown
from haystack_fusion.evaluation.view import ReportView


def _by_run(records: Iterable[QuestionRecord]) -> dict[tuple[str, int, str], list[QuestionRecord]]:
    """The records per run (strategy, k, setting), in the order the records first name them."""
    groups: dict[tuple[str, int, str], list[QuestionRecord]] = {}
    for record in records:
        groups.setdefault((record.strategy, record.top_k, record.setting), []).append(record)
    return groups


def consistency(records: Sequence[QuestionRecord]) -> tuple[int, int]:
    """How many `concat_pf` records the text-only replay reproduces: (same prediction outcome, compared), a check that
    the replay is exact on this run."""
    view = ReportView.of(records)
    replayed = replay(view, None)
    pairs = [
        (outcome, record.score)
        for record in view.records
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
    for (strategy, top_k, setting), group in _by_run(records).items():
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
    for (strategy, top_k, setting), group in _by_run(records).items():
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


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def diagnostics(records: Sequence[QuestionRecord]) -> str:
    """The three diagnostics as markdown sections, each only when its records are there."""
    parts = []
    same, compared = consistency(records)
    if compared:
        parts.append(f"The text-only replay reproduces {same} of {compared} concat_pf records.")
    if verification := verification_stats(records):
        table = markdown(
            ["strategy", "top-k", "verified", "validity not all True %", "candidate (a) wins %",
             "label-only summaries %"],
            ([r["strategy"], r["top_k"], r["verified"], _pct(r["not_all_valid"]), _pct(r["first_wins"]),
              _pct(r["label_summaries"])] for r in verification),
        )  # fmt: skip
        parts.append(f"## SuRe's verification\n\n{table}")
    if stages := stage_stats(records):
        table = markdown(
            ["strategy", "top-k", "questions", "answered at", "left a stage because"],
            ([r["strategy"], r["top_k"], r["n"],
              ", ".join(f"{stage} {share:.1f}%" for stage, share in r["answered_at"].items()),
              "; ".join(f"{stage}: " + ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items()))
                        for stage, kinds in r["reasons"].items()) or "–"] for r in stages),
        )  # fmt: skip
        parts.append(
            "## Which stage answered\n\nThe fallback strategies' stage traces: the share of questions answered at "
            f"each stage, and why questions left a stage (number of questions).\n\n{table}"
        )
    return "\n\n".join(parts) + ("\n" if parts else "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    parser.add_argument("runs", nargs="+", type=Path, help="eval --out folders (their results.jsonl)")
    folders = parser.parse_args(argv).runs
    print(diagnostics([record for folder in folders for record in read_records(folder / RESULTS_FILE)]), end="")


if __name__ == "__main__":
    main()
