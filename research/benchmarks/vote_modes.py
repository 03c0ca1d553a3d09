"""
Benchmark: exact against overlap voting on the same post-fusion replies (issue 16, item 3).

For each question, post-fusion's k = 5 LLM calls (paper 000, Figure 7 prompt, one passage each) are made once, with
the embedded model and the evaluation runner's retrieval (`EvalRetriever` over Haystack's in-memory BM25 store of the
SQuAD 2.0 subset, setting "retrieved", top-5). Two `PostFusionVoter`s then vote on the same replies:
`vote="exact"` (paper 000, Eq. 2; the default) and `vote="overlap"` (`answers.overlap_vote`). Both share one
`LocalChatGenerator`, whose reply cache (greedy calls) answers the second voter's calls with the first's replies; the
script checks that both saw the same per-passage answers. Both keep the default `answer_checks=True`.

Per mode, over the answerable questions: EM and F1 of the voted answer (`evaluation.metrics`), %NM (the pool holds a
gold answer, read with the mode's own matching, `metrics.gold_in_pool(vote=...)`, and the majority answer does not
match, read the same way), and over all questions: the share of 1-vote ties (the winner has exactly one vote and
another answer has one too: every voting passage said something different). Rates come with 95% percentile-bootstrap
CIs and the overlap-minus-exact differences with paired-bootstrap CIs (`evaluation.stats`: 1,000 resamples of
questions). With `--sweep`, the report also re-votes the stored per-passage answers at other overlap thresholds
(pure functions, no LLM call).

Sets (question order of the dataset file): `first120`, the file's first 120 questions (answerable and not);
`long`, the answerable questions with a gold answer of at least 4 tokens after SQuAD normalization
(`answers.normalize_answer`: the tokens EM and F1 compare, articles and punctuation removed).

Results go to `--out/<set>.json` after every question (records: question id, passage ids, the per-passage answers,
both predictions, votes, clusters, scores; dataset text cut out as committed records are,
`research.redaction.DatasetText`); a re-run resumes from it, and `--report-only` prints the table from it.

Run: `nice -n 10 .venv/bin/python -m research.benchmarks.vote_modes --set first120 [--limit 5]`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack_fusion.answers import (
    DEFAULT_OVERLAP_THRESHOLD,
    UnknownDetector,
    normalize_answer,
    vote_answers,
)
from haystack_fusion.corpus import Question
from haystack_fusion.evaluation.datasets import EvalDataset, load_dataset
from haystack_fusion.evaluation.metrics import exact_match, f1, gold_in_pool
from haystack_fusion.evaluation.stats import bootstrap_settings, excludes_zero, paired_difference_ci, rate_ci
from research.redaction import DatasetText

DEFAULT_DATASET = "../shared/data/squad2-dev-subset/squad2_dev_subset.json"
TOP_K = 5
MODES = ("exact", "overlap")
SETS = ("first120", "long")
LONG_TOKENS = 4
"""`long` set: answerable questions with a gold answer of at least this many normalized tokens."""
SWEEP = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0)
"""Overlap thresholds `--sweep` re-votes the stored answers at."""


def choose(dataset: EvalDataset, name: str) -> list[Question]:
    """
    The questions of a set, in the dataset's order.

    :param dataset: The SQuAD 2.0 subset.
    :param name: `first120` or `long` (module docstring).
    :returns: The questions.
    :raises ValueError: For another name.
    """
    if name == "first120":
        return list(dataset.questions[:120])
    if name == "long":
        return [
            q
            for q in dataset.questions
            if not q.is_impossible and any(len(normalize_answer(a).split()) >= LONG_TOKENS for a in q.answers)
        ]
    raise ValueError(f"unknown set {name!r}; known: {', '.join(SETS)}")


def one_vote_tie(votes: Sequence[int]) -> bool:
    """Whether the winner has exactly one vote and ties another answer (`votes`: counts, most first)."""
    return len(votes) > 1 and votes[0] == 1 and votes[1] == 1


def scores(prediction: str, candidates: Sequence[str], votes: Sequence[int], golds: Sequence[str], mode: str,
           threshold: float) -> dict[str, Any]:  # fmt: skip
    """
    One question's scores under one mode.

    :returns: `em`, `f1` (of the prediction), `pool_has_gold` and `majority_correct` (read with the mode's matching;
        None for an unanswerable question), `nm` (pool has gold and majority not correct; None when unanswerable),
        `one_vote_tie`.
    """
    answerable = bool(golds)
    pool = gold_in_pool(candidates, golds, vote=mode, overlap_threshold=threshold) if answerable else None
    majority = gold_in_pool(candidates[:1], golds, vote=mode, overlap_threshold=threshold) if answerable else None
    return {
        "em": exact_match(prediction, golds),
        "f1": f1(prediction, golds),
        "pool_has_gold": pool,
        "majority_correct": majority,
        "nm": bool(pool and not majority) if answerable else None,
        "one_vote_tie": one_vote_tie(votes),
    }


def load(path: Path) -> dict[str, Any]:
    """The results file, or an empty one."""
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]
    return {"settings": {}, "records": []}


def save(path: Path, data: dict[str, Any]) -> None:
    """Write the results file atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def ask(questions: list[Question], dataset: EvalDataset, path: Path, threshold: float, source: str) -> None:
    """Answer the questions not yet in `path` with both voters, appending a record after each."""
    from haystack.document_stores.in_memory import InMemoryDocumentStore

    from haystack_fusion import PostFusionVoter
    from haystack_fusion.backends import chat_generator, retriever, write_documents
    from haystack_fusion.backends.config import BackendConfig
    from haystack_fusion.evaluation.passages import EvalRetriever, PassageSetting

    data = load(path)
    settings = {
        "top_k": TOP_K,
        "retrieval": "memory bm25, setting retrieved",
        "overlap_threshold": threshold,
        "answer_checks": True,
        "dataset": Path(source).name,
    }
    backends = BackendConfig.from_env(llm="local")
    generator = chat_generator(backends)
    settings["llm"] = generator.to_dict()
    if data["records"] and data["settings"] != settings:
        raise SystemExit(f"{path} was made with other settings: {data['settings']} (now {settings})")
    data["settings"] = settings
    done = {record["id"] for record in data["records"]}
    todo = [q for q in questions if q.id not in done]
    if not todo:
        return
    store = InMemoryDocumentStore()
    write_documents(backends, store, dataset.documents)
    passages = EvalRetriever(
        retriever(backends, store), setting=PassageSetting(), corpus=dataset.documents, top_k=TOP_K
    )
    voters = {
        "exact": PostFusionVoter(chat_generator=generator),
        "overlap": PostFusionVoter(chat_generator=generator, vote="overlap", overlap_threshold=threshold),
    }
    voters["exact"].warm_up()
    gold = {d.id: d for d in dataset.documents}
    text = DatasetText.of(dataset)
    redacted = [0]

    def clean(answer: str | None) -> str | None:
        if answer is None:
            return None
        kept, cut = text.redact(answer)
        redacted[0] += cut
        return kept

    for number, question in enumerate(todo, 1):
        start = time.perf_counter()
        documents = passages.run(
            query=question.question,
            question_id=question.id,
            answers=list(question.answers),
            gold=gold.get(question.gold_document_id or ""),
        )["documents"]
        results = {mode: voter.run(query=question.question, documents=documents) for mode, voter in voters.items()}
        winners = {mode: result.get("answers", result.get("unknown"))[0] for mode, result in results.items()}
        entries = {mode: winner.meta["passage_answers"] for mode, winner in winners.items()}
        if entries["exact"] != entries["overlap"]:
            raise SystemExit(f"question {question.id}: the two voters saw different replies (reply cache missed)")
        golds = list(question.answers)
        record: dict[str, Any] = {
            "id": question.id,
            "answerable": not question.is_impossible,
            "passages": [d.id for d in documents],
            "answers": [[clean(a) for a in entry["answers"]] for entry in entries["exact"]],
            "invalid": [entry.get("invalid") for entry in entries["exact"]],
            "usage": winners["exact"].meta["usage"],
            "seconds": round(time.perf_counter() - start, 3),
        }
        for mode in MODES:
            meta = winners[mode].meta
            candidates = results[mode].get("candidates") or []
            record[mode] = {
                "prediction": clean(winners[mode].data or ""),
                "votes": [[clean(key), count] for key, count in meta["votes"].items()],
                **(
                    {"clusters": [[clean(m) for m in ms] for ms in meta["clusters"].values()]}
                    if "clusters" in meta
                    else {}
                ),
                "scores": scores(
                    winners[mode].data or "", candidates, list(meta["votes"].values()), golds, mode, threshold
                ),
            }
        data["records"].append(record)
        save(path, data)
        print(
            f"[{number}/{len(todo)}] {question.id}: exact {record['exact']['scores']['em']:.0f} / overlap "
            f"{record['overlap']['scores']['em']:.0f}, {record['seconds']:.0f} s",
            flush=True,
        )
    if redacted[0]:
        print(f"{redacted[0]} answers had dataset text cut out")


def _rate(values: Sequence[float | bool]) -> str:
    if not values:
        return "n/a"
    ci = rate_ci(values)
    rate = 100.0 * sum(values) / len(values)
    return f"{rate:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else f"{rate:.1f}"


def _difference(a: Sequence[float | bool], b: Sequence[float | bool]) -> str:
    result = paired_difference_ci(a, b)
    if result is None:
        return "n/a"
    diff, low, high = result
    mark = "" if excludes_zero((low, high)) else " (CI holds 0)"
    return f"{diff:+.1f} [{low:+.1f}, {high:+.1f}]{mark}"


def table(records: list[dict[str, Any]]) -> str:
    """The markdown table: per mode, and overlap minus exact (percentage points), with 95% CIs."""
    answerable = [r for r in records if r["answerable"]]

    def column(metric: str, mode: str, rows: list[dict[str, Any]]) -> list[Any]:
        return [r[mode]["scores"][metric] for r in rows]

    lines = [
        f"questions: {len(records)} ({len(answerable)} answerable); rates in %, [95% bootstrap CI]",
        "",
        "| metric | n | exact | overlap | overlap - exact, pp [95% CI, paired] |",
        "|---|---:|---|---|---|",
    ]
    for metric, label, rows in (
        ("em", "EM", answerable),
        ("f1", "F1", answerable),
        ("one_vote_tie", "1-vote ties (all questions)", records),
        ("nm", "NM share of answerable", answerable),
    ):
        exact, overlap = column(metric, "exact", rows), column(metric, "overlap", rows)
        lines.append(f"| {label} | {len(rows)} | {_rate(exact)} | {_rate(overlap)} | {_difference(overlap, exact)} |")
    cells = []
    for mode in MODES:
        pool = [r for r in answerable if r[mode]["scores"]["pool_has_gold"]]
        cells.append(f"{_rate([r[mode]['scores']['nm'] for r in pool])} (n={len(pool)})")
    lines.append(f"| %NM (of pools with gold, each mode's matching) | | {cells[0]} | {cells[1]} | not paired |")
    changed = sum(r["exact"]["prediction"] != r["overlap"]["prediction"] for r in records)
    lines += ["", f"answers that differ between the modes: {changed} of {len(records)} questions"]
    return "\n".join(lines)


REDACTED = re.compile(r"\[\d+ words of the dataset\]")
"""What `research.redaction.DatasetText.redact` puts in place of dataset text."""


def sweep(records: list[dict[str, Any]], dataset: EvalDataset) -> str:
    """
    Re-vote the stored per-passage answers at the `SWEEP` thresholds: EM, F1, 1-vote ties, %NM (no LLM call).

    "%NM read exactly" reads the pool and the majority with exact matching whatever the vote, so the modes are
    compared on one yardstick (with overlap voting the pool holds one representative per cluster). Questions with an
    answer whose dataset text was cut out are left out: the stored text is not what was voted on
    (and "[N words of the dataset]" placeholders would agree with each other).
    """
    golds = {q.id: list(q.answers) for q in dataset.questions}
    kept = [r for r in records if not any(REDACTED.search(a or "") for entry in r["answers"] for a in entry)]
    left_out = len(records) - len(kept)
    records = kept
    detector = UnknownDetector()
    lines = [
        "| vote | EM | F1 | 1-vote ties | %NM (n pools with gold) | %NM read exactly (n) | answers changed vs exact |",
        "|---|---|---|---|---|---|---:|",
    ]
    settings: list[tuple[str, float]] = [("exact", DEFAULT_OVERLAP_THRESHOLD)] + [("overlap", t) for t in SWEEP]
    baseline: dict[str, str] = {}
    for mode, threshold in settings:
        em, f1s, ties, nm, nm_exact, changed = [], [], [], [], [], 0
        for record in records:
            answers = [
                answer if reason is None else None
                for entry, reasons in zip(record["answers"], record["invalid"], strict=True)
                for answer, reason in zip(entry, reasons or [None] * len(entry), strict=True)
            ]
            ranks = [rank for rank, entry in enumerate(record["answers"]) for _ in entry]
            result = vote_answers(answers, ranks, detector, vote=mode, threshold=threshold)
            if mode == "exact":
                baseline[record["id"]] = result.answer
            changed += result.answer != baseline[record["id"]]
            votes = list(result.votes.values())
            score = scores(result.answer, result.candidates, votes, golds[record["id"]], mode, threshold)
            ties.append(score["one_vote_tie"])
            if record["answerable"]:
                em.append(score["em"])
                f1s.append(score["f1"])
                if score["pool_has_gold"]:
                    nm.append(score["nm"])
                read_exactly = (
                    score
                    if mode == "exact"
                    else scores(result.answer, result.candidates, votes, golds[record["id"]], "exact", threshold)
                )
                if read_exactly["pool_has_gold"]:
                    nm_exact.append(read_exactly["nm"])
        label = "exact" if mode == "exact" else f"overlap {threshold:g}"
        nm_cells = f"{_rate(nm)} (n={len(nm)}) | {_rate(nm_exact)} (n={len(nm_exact)})"
        lines.append(f"| {label} | {_rate(em)} | {_rate(f1s)} | {_rate(ties)} | {nm_cells} | {changed} |")
    answerable = sum(r["answerable"] for r in records)
    lines.insert(0, f"{len(records)} questions ({answerable} answerable; {left_out} left out: dataset text cut out)\n")
    return "\n".join(lines)


def main() -> None:
    """Ask (or resume), then print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dataset", default=DEFAULT_DATASET)
    parser.add_argument("--set", dest="question_set", choices=SETS, default="first120")
    parser.add_argument("--limit", type=int, default=None, help="only the set's first N questions")
    parser.add_argument("--threshold", type=float, default=DEFAULT_OVERLAP_THRESHOLD, help="overlap threshold")
    parser.add_argument("--out", default="research/results/vote-modes")
    parser.add_argument("--report-only", action="store_true", help="ask nothing: print the table from the file")
    parser.add_argument("--sweep", action="store_true", help="also re-vote the stored answers at other thresholds")
    args = parser.parse_args()

    dataset = load_dataset(args.dataset)
    questions = choose(dataset, args.question_set)[: args.limit]
    path = Path(args.out) / f"{args.question_set}.json"
    if not args.report_only:
        ask(questions, dataset, path, args.threshold, args.dataset)
    wanted = {q.id for q in questions}
    records = [r for r in load(path)["records"] if r["id"] in wanted]
    if not records:
        raise SystemExit(f"no records in {path}")
    print(f"\nset {args.question_set}: {len(records)} of {len(questions)} questions asked; BM25 top-{TOP_K}; "
          f"overlap threshold {args.threshold:g}; bootstrap {bootstrap_settings()}\n")  # fmt: skip
    print(table(records))
    if args.sweep:
        print(f"\nthresholds, re-voted from the stored answers:\n\n{sweep(records, dataset)}")


if __name__ == "__main__":
    main()
