"""
Issue 16's before / after table: the answers that are not answers, per strategy, on the questions that both the
"before" runs (answer checks off) and the "after" run (checks on) answered, from their committed records.

The before records are `squad2-first120-before`, the after records `squad2-first120`. Both were made with stop sequences
off and by the same llama.cpp build on the same machine, so before and after differ only by the answer checks
(`research/benchmarks/answer_checks_runs.py` makes them); "other changes" counts the answers that differ although the
after answer is not invalid (a vote or a fallback that a rejected answer changed, or replies that are not the same). The
counts are the report's (`report.answer_outcomes`: `metrics.with_answer_outcome` flags), except "cut": the report's
truncation flag, or, for a record made before truncation was counted (usage `truncated`, `evidence.finish_reason`), a
question answered in one call whose completion reached the cap (128 tokens on the embedded model). EM and F1 are over
the answerable questions, after minus before with its paired 95% bootstrap interval (`stats.paired_difference_ci`).

    .venv/bin/python -m research.benchmarks.answer_checks_compare
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from pathlib import Path

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack_fusion.evaluation.records import QuestionRecord, read_records
from haystack_fusion.evaluation.report import answer_outcomes, outcome_records
from haystack_fusion.evaluation.stats import paired_difference_ci
from haystack_fusion.validation import is_passage_markup

ROOT = Path(__file__).resolve().parents[2]
BEFORE = ("research/results/squad2-first120-before",)
AFTER = "research/results/squad2-first120"
CAP = 128
"""The embedded model's `max_tokens` in these runs."""


def load(folders: tuple[str, ...] | list[str]) -> dict[tuple[str, str], QuestionRecord]:
    """The clean records of the folders by (strategy, question id), with the report's outcome flags."""
    records = [record for folder in folders for record in read_records(ROOT / folder / "results.jsonl")]
    return {(r.strategy, r.question_id): r for r in outcome_records(records) if not r.failed}


def cut(record: QuestionRecord) -> bool:
    """The report's truncation flag, or a one-call answer whose completion reached the cap."""
    return record.score.truncated or (record.score.calls == 1 and record.score.completion_tokens >= CAP)


def _ci(value: tuple[float, float, float] | None) -> str:
    return "-" if value is None else f"{value[0]:+.1f} [{value[1]:+.1f}, {value[2]:+.1f}]"


def compare(before: dict[tuple[str, str], QuestionRecord], after: dict[tuple[str, str], QuestionRecord]) -> str:
    """The markdown tables of the common questions (those every strategy of the after run answered in both)."""
    strategies = list(dict.fromkeys(strategy for strategy, _ in after))
    questions = set.intersection(
        *({q for s, q in after if s == strategy} & {q for s, q in before if s == strategy} for strategy in strategies)
    )
    lines = [
        f"{len(questions)} questions answered by all {len(strategies)} strategies before and after "
        f"({sum(before[(strategies[0], q)].answerable for q in questions)} answerable).",
        "",
        "| strategy | answered | unknown | empty | invalid | cut | demo copies | demo rejected | passage tags "
        "| other changes | EM after - before | F1 after - before |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    reasons: dict[str, Counter[str]] = {}
    by_prompt: dict[str, list[Counter[str]]] = {}  # prompt -> [copies before, copies after] per strategy
    for strategy in strategies:
        pair = [[run[(strategy, q)] for q in sorted(questions)] for run in (before, after)]
        outcome = [answer_outcomes(records)[(strategy, records[0].top_k, records[0].setting)] for records in pair]
        reasons[strategy] = Counter(outcome[1]["invalid_reasons"])
        for name in outcome[0]["demo_copy_prompts"]:
            counts = by_prompt.setdefault(name, [Counter(), Counter()])
            for side in (0, 1):
                counts[side][strategy] = outcome[side]["demo_copy_prompts"][name]

        def cell(key: str, outcome: list[dict] = outcome) -> str:
            return f"{outcome[0][key]} -> {outcome[1][key]}"

        cuts = " -> ".join(str(sum(cut(r) for r in records)) for records in pair)
        tags = " -> ".join(str(sum(is_passage_markup(r.prediction) for r in records)) for records in pair)
        other = sum(old.prediction != new.prediction and not new.score.invalid for old, new in zip(*pair, strict=True))
        answerable = [i for i, r in enumerate(pair[0]) if r.answerable]
        em, f1 = (
            paired_difference_ci(
                [getattr(pair[1][i].score, key) for i in answerable],
                [getattr(pair[0][i].score, key) for i in answerable],
            )
            for key in ("em", "f1")
        )
        lines.append(
            f"| {strategy} | {cell('answered_count')} | {cell('unknown_count')} | {cell('empty_count')} "
            f"| {cell('invalid_count')} | {cuts} | {cell('demo_copy_count')} | {cell('demo_rejected_count')} "
            f"| {tags} | {other} | {_ci(em)} | {_ci(f1)} |"
        )
    lines += [
        "",
        "Final answers equal to a demonstration answer of each few-shot prompt, before -> after, per strategy that "
        f"uses the prompt (of {len(questions)} questions each):",
        "",
    ]
    for name, (old, new) in by_prompt.items():
        cells = ", ".join(f"{strategy} {old[strategy]} -> {new[strategy]}" for strategy in old)
        lines.append(f"- {name}: {cells}")
    lines += ["", "Why the after run rejected answers (validator reason -> answers):"]
    lines += [f"- {strategy}: {dict(count)}" for strategy, count in reasons.items() if count]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", nargs="+", default=list(BEFORE), help="the before run folders")
    parser.add_argument("--after", default=AFTER, help="the after run folder")
    args = parser.parse_args()
    print(compare(load(args.before), load([args.after])))
