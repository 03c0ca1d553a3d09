"""
How many final answers of a committed run the answer checks (issue 16) would reject, replayed from its records.

Each record's prediction is checked with `answers.check_answer`, with its question, the demonstration answers of
the strategy's prompts and the text of the record's passages (read from the dataset, as `haystack-fusion report`
does).
For a strategy whose answer is one reply read by the answer builder (concatenation, pruning, summary_cot, base,
chain_of_note), this is exactly what the checks change: the same reply, now an invalid answer. For the others
(post-fusion's vote, the fallbacks, SuRe's candidates) the checks act earlier, on each per-passage answer or
candidate, and a new run gives the real outcome; the replay counts the final answers that were not answers.

    .venv/bin/python -m research.benchmarks.replay_answer_checks \
        research/results/squad2-paper000 research/results/squad2-sample200
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from pathlib import Path

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack_fusion.answers import REASONS, check_answer
from haystack_fusion.evaluation.datasets import load_dataset
from haystack_fusion.evaluation.records import RUN_FILE, read_records
from haystack_fusion.prompts import PROMPTS
from haystack_fusion.strategies import get_strategy


def replay(run: Path, limit: int | None = None) -> str:
    """The table of one run: per strategy, records and the answers each rule would reject (first `limit` questions)."""
    manifest = json.loads((run / RUN_FILE).read_text(encoding="utf-8"))
    dataset = load_dataset(manifest["dataset"])
    first = {question.id for question in dataset.questions[:limit]} if limit else None
    texts = {document.id: document.content or "" for document in dataset.documents}
    asked = {question.id: question.question for question in dataset.questions}
    counts: dict[str, Counter[str]] = {}
    examples: dict[str, str] = {}
    for record in read_records(run / "results.jsonl"):
        if record.failed or (first is not None and record.question_id not in first):
            continue
        prompts = get_strategy(record.strategy).prompts
        demonstrations = sorted({answer for name in prompts for answer in PROMPTS[name].demonstrations})
        passages = [texts[passage] for passage in record.passages]
        reason = check_answer(
            record.prediction,
            question=asked.get(record.question_id),
            demonstrations=demonstrations,
            passages=passages,
        )
        counts.setdefault(record.strategy, Counter())["records"] += 1
        if reason is not None:
            counts[record.strategy][reason] += 1
            examples.setdefault(f"{record.strategy}/{reason}", record.prediction)
    scope = f"first {limit} questions" if limit else "all records"
    lines = [
        f"{run} ({scope})",
        "",
        "| strategy | records | " + " | ".join(REASONS) + " | rejected |",
        "|---|---|" + "---|" * (len(REASONS) + 1),
    ]
    for strategy, count in counts.items():
        rejected = sum(count[reason] for reason in REASONS)
        cells = " | ".join(str(count[reason]) for reason in REASONS)
        lines.append(
            f"| {strategy} | {count['records']} | {cells} | {rejected} ({100 * rejected / count['records']:.1f}%) |"
        )
    lines += ["", "One rejected answer per strategy and reason:"]
    lines += [f"- {key}: {value[:60]!r}" for key, value in examples.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (research/results/<run>)")
    parser.add_argument("--limit", type=int, help="only the first N questions of the dataset file")
    args = parser.parse_args()
    for folder in args.runs:
        print(replay(folder, args.limit), end="\n\n")
