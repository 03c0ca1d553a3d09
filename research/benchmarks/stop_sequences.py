"""
Completion tokens saved by stopping short-answer replies at their answer line (issue 16, item 2).

Runs `haystack-fusion eval` twice on the same questions, with `--stop-sequences off` and `on` (answer checks on in
both), into `research/results/stop-sequences/{off,on}` (resumable records), then prints per strategy: completion tokens
per question off and on, the tokens saved with a 95% paired-bootstrap interval (`evaluation.stats`), how many
predictions changed, and EM / F1 on minus off with their paired intervals.

    .venv/bin/python -m research.benchmarks.stop_sequences                 # first 30 questions of the SQuAD 2.0 subset
    .venv/bin/python -m research.benchmarks.stop_sequences --limit 5       # a quick look
    .venv/bin/python -m research.benchmarks.stop_sequences --report-only   # the table from the committed records
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack_fusion.cli import main
from haystack_fusion.evaluation.stats import excludes_zero, paired_difference_ci

ROOT = Path(__file__).resolve().parents[2]
DATASET = "../shared/data/squad2-dev-subset/squad2_dev_subset.json"  # from the repository root, as the docs write it
OUT = Path("research/results/stop-sequences")
STRATEGIES = "concatenation,post_fusion,pf_concat,base"
"""The strategies whose prompts end at the answer line (Figure 7, the distiller, Listing 10)."""


def records(folder: Path) -> dict[tuple[str, str], dict]:
    path = folder / "results.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {(r["strategy"], r["question_id"]): r for r in rows if not r.get("error")}


def interval(difference: tuple[float, float, float] | None, unit: str = "") -> str:
    if difference is None:
        return "-"
    mark = " *" if excludes_zero(difference[1:]) else ""
    return f"{difference[0]:+.1f}{unit} [{difference[1]:+.1f}, {difference[2]:+.1f}]{mark}"


def table(limit: int) -> str:
    off, on = records(OUT / "off"), records(OUT / "on")
    lines = [
        f"Stop sequences off vs on, first {limit} questions (BM25 top-5, embedded model; * = interval excludes 0)",
        "",
        "| strategy | n | completion tokens / question, off | on | saved (paired 95% CI) | predictions changed "
        "| EM on - off (pp) | F1 on - off (pp) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for strategy in STRATEGIES.split(","):
        keys = sorted(key for key in off if key[0] == strategy and key in on)
        if not keys:
            continue
        tokens_off = [off[k]["score"]["completion_tokens"] for k in keys]
        tokens_on = [on[k]["score"]["completion_tokens"] for k in keys]
        # paired_difference_ci works in percentage points of [0, 1] values: pass tokens / 100 to read tokens
        saved = paired_difference_ci([t / 100 for t in tokens_off], [t / 100 for t in tokens_on])
        changed = sum(off[k]["prediction"] != on[k]["prediction"] for k in keys)
        em = paired_difference_ci([on[k]["score"]["em"] for k in keys], [off[k]["score"]["em"] for k in keys])
        f1 = paired_difference_ci([on[k]["score"]["f1"] for k in keys], [off[k]["score"]["f1"] for k in keys])
        lines.append(
            f"| {strategy} | {len(keys)} | {sum(tokens_off) / len(keys):.1f} | {sum(tokens_on) / len(keys):.1f} "
            f"| {interval(saved)} | {changed} | {interval(em)} | {interval(f1)} |"
        )
    return "\n".join(lines)


def run(limit: int) -> int:
    status = 0
    for mode in ("off", "on"):
        argv = [
            "eval",
            "--dataset",
            DATASET,
            "--top-k",
            "5",
            "--limit",
            str(limit),
            "--strategies",
            STRATEGIES,
            "--stop-sequences",
            mode,
            "--out",
            str(OUT / mode),
        ]
        print("$ haystack-fusion", " ".join(argv), flush=True)
        status = status or main(argv)
    return status


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=30, help="the first N questions (default 30)")
    parser.add_argument("--report-only", action="store_true", help="only print the table from the records")
    args = parser.parse_args()
    os.chdir(ROOT)
    status = 0 if args.report_only else run(args.limit)
    print(table(args.limit))
    sys.exit(status)
