"""
Issue 16's before/after runs on the first 120 SQuAD 2.0 questions, as `haystack-fusion eval` commands run in ONE
process, so the embedded model's reply cache (`backends.local`, process-wide, greedy replies by prompt) answers the
"after" run's calls that the "before" runs already made: only the calls that the answer checks change (a fallback
that now runs, a distiller round over other candidates) reach the model again.

Each step is exactly the `eval` command printed before it; run separately on the same machine and llama.cpp build, they
give the same records (the cache changes no reply). Every step resumes its `--out` folder, so the script can be stopped
and started again.

    .venv/bin/python -m research.benchmarks.answer_checks_runs            # all steps
    # first check that the off mode reproduces the paper-000 records on 5 questions (on a build that gives their
    # replies), then all steps
    .venv/bin/python -m research.benchmarks.answer_checks_runs --check 5
    # all steps on the first 30 questions, then on 60, ...: stopped at any point, before and after cover the same
    # questions
    .venv/bin/python -m research.benchmarks.answer_checks_runs --limits 30,60,90,120
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack_fusion.cli import main
from haystack_fusion.evaluation.datasets import load_dataset
from haystack_fusion.evaluation.records import read_records

ROOT = Path(__file__).resolve().parents[2]
DATASET = "../shared/data/squad2-dev-subset/squad2_dev_subset.json"  # from the repository root, as the docs write it
PAPER000 = "concatenation,post_fusion,pruning,summary_cot,concat_pf,pf_concat"
COMMON = ["eval", "--dataset", DATASET, "--top-k", "5", "--stop-sequences", "off", "--limit", "120"]
"""Every step keeps the replies of the code that made the before runs (no stop sequences): only the answer checks
differ between before and after. Stop sequences are measured apart (`research/benchmarks/stop_sequences.py`)."""

STRATEGIES = f"{PAPER000},base,sure"
STEPS: list[list[str]] = [
    # before: the eight strategies with the answer checks off
    [*COMMON, "--strategies", STRATEGIES, "--answer-checks", "off", "--out", "research/results/squad2-first120-before"],
    # after: the same eight strategies with the answer checks (the default)
    [*COMMON, "--strategies", STRATEGIES, "--out", "research/results/squad2-first120"],
]
"""Before and after are made by the same llama.cpp build on the same machine, one step after the other: greedy
replies are reproducible there, not across builds or CPUs (issue 11's paper-000 records of questions 72-120, made in
an earlier session, differ from session 12's replies on 15 of 49 concatenation answers with identical prompts;
see research/notes/evaluation.md). The before folder's first 71 questions of the six paper-000 strategies are issue
11's paper-000 records, which the after run reproduced reply for reply."""


def check(n: int) -> int:
    """Answer the first n questions with the checks off into a scratch folder and compare with the committed
    paper-000 records: the off mode must give the predictions of the code that made them."""
    out = Path("/tmp/answer-checks-off-check")  # scratch: its calls also fill the reply cache for the steps
    argv = [*COMMON[:-1], str(n), "--strategies", PAPER000, "--answer-checks", "off", "--out", str(out)]
    print("$ haystack-fusion", " ".join(argv), flush=True)
    main(argv)

    def predictions(path: Path) -> dict[tuple[str, str], str]:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return {(r["strategy"], r["question_id"]): r["prediction"] for r in rows}

    new = predictions(out / "results.jsonl")
    old = predictions(ROOT / "research/results/squad2-paper000/results.jsonl")
    differ = [key for key in new if old.get(key) != new[key]]
    print(f"{len(new)} predictions, {len(differ)} differ from the committed records: {differ[:5]}", flush=True)
    return 1 if differ else 0


def with_limit(argv: list[str], limit: int) -> list[str]:
    """`argv` with its `--limit` value replaced: the same step on the first `limit` questions (it resumes its folder,
    so a larger limit only answers the questions after the ones already recorded)."""
    at = argv.index("--limit") + 1
    return [*argv[:at], str(limit), *argv[at + 1 :]]


def complete(argv: list[str]) -> bool:
    """Whether a step's folder already holds a clean record of every strategy on each of its first `--limit`
    questions. Such a step is skipped: run again with a smaller limit than its records cover, `eval` would rewrite
    its report and `run.json` for those questions only."""
    results = ROOT / argv[argv.index("--out") + 1] / "results.jsonl"
    if not results.exists():
        return False
    questions = [q.id for q in load_dataset(DATASET).questions[: int(argv[argv.index("--limit") + 1])]]
    done = {(r.strategy, r.question_id) for r in read_records(results)}
    return all((s, q) in done for s in argv[argv.index("--strategies") + 1].split(",") for q in questions)


def run(limits: list[int]) -> int:
    os.chdir(ROOT)
    failed = 0
    for argv in (with_limit(step, limit) for limit in limits for step in STEPS):
        if complete(argv):
            print(f"complete, skipped: haystack-fusion {' '.join(argv)}", flush=True)
            continue
        print("$ haystack-fusion", " ".join(argv), flush=True)
        try:
            status = main(argv)
        except Exception as error:  # a step's report failing must not keep the next steps from their cached calls
            print(f"step failed: {type(error).__name__}: {error}", flush=True)
            status = 1
        failed = failed or int(status)
    return failed


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", type=int, default=0, help="first check the off mode on the first N questions")
    parser.add_argument(
        "--limits",
        default="120",
        help="comma-separated question counts: every step runs on the first N questions, for each N in turn "
        "(default: 120)",
    )
    args = parser.parse_args()
    os.chdir(ROOT)
    sys.exit((args.check and check(args.check)) or run([int(n) for n in args.limits.split(",")]))
