"""
Benchmark: SuRe on the embedded base model: grammar-constrained decoding, probability scoring, summary demonstration.

Issue 12's three questions about SuRe's degenerate rounds on a 270M base model, answered on the same questions in
one run (CandidateSummarizer few-shot with K = 2, SummaryVerifier):

1. **Grammar-constrained decoding.** SuRe's candidate list (Listing 13: "(a) xx, (b) yy"), validity answers
   (Listing 8: "True" / "False") and pair-wise ranking answers (Listing 9: "Passage 1" / "Passage 2") have a fixed
   form. "free" decodes as usual; "grammar" adds a GBNF grammar on those three prompt kinds
   (`LocalChatGenerator(generation_kwargs={"grammar": ...})`); the summaries stay free text.
2. **Probability scoring.** "probability" verifies the free run's candidates and summaries with
   `SummaryVerifier(scoring="probability")` (Eq. 4-5 made continuous) instead of the text parse.
3. **Summaries that are summaries.** The share of conditional summaries that are only a candidate's label
   (`sure.summary_is_label`), with Listing 7 as the paper gives it ("before") and with the base-model
   demonstration (`prompts.sure.FEW_SHOT_SUMMARY`, "after"), for the same candidates.

For each mode it prints: questions with K distinct candidates and words per candidate; validity decisions read as
True (>= 0.5) and questions whose validity is not all True; pair-wise replies that name a passage; questions won by
candidate (a); EM (SQuAD 2.0 rule: an unanswerable question is right when the answer is "unknown"), F1 on the
answerable questions; and completion tokens per question.

Questions: a stratified sample (seed 0) of the development split, i.e. the SQuAD 2.0 subset without the reported
`--sample 200 --seed 0` questions, so nothing here is tuned on reported questions. BM25 top-`--top-k`, in memory.
Run: `.venv/bin/python -m research.benchmarks.sure_base_model [--questions 20] [--top-k 5]`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
from typing import Any

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack import component
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.dataclasses import ChatMessage
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion import CandidateSummarizer, SummaryVerifier
from haystack_fusion.backends import LocalChatGenerator
from haystack_fusion.corpus import default_squad_path
from haystack_fusion.evaluation.datasets import load_dataset
from haystack_fusion.evaluation.metrics import exact_match, f1, is_unknown
from haystack_fusion.settings import SQUAD_VARIABLE
from haystack_fusion.sure import parse_preference, summary_is_label
from haystack_fusion.testing import identify_prompt

SUBSET = "../shared/data/squad2-dev-subset/squad2_dev_subset.json"
"""The file `$HAYSTACK_FUSION_SQUAD` names for this benchmark: the SQuAD 2.0 dev subset its numbers are made on."""
GRAMMARS = {
    # Listing 13 ends "Provide two correct candidates for the answer:"; each candidate at most 3 words.
    "candidates": r"""root ::= " (a) " item ", (b) " item
item ::= word (" " word)? (" " word)?
word ::= [^ ,()\n]+""",
    # Listing 8 ends "Choices: [True, False]. Answer:".
    "validity": r"""root ::= " " ("True" | "False")""",
    # Listing 9 ends "Choices: [Passage 1, Passage 2].\n\nAnswer:".
    "ranking": r"""root ::= " Passage " ("1" | "2")""",
}


KINDS = {
    "sure_candidates": "candidates",
    "sure_few_shot_candidates": "candidates",
    "sure_validity": "validity",
    "sure_ranking": "ranking",
}
"""The structured SuRe prompts (`haystack_fusion.prompts.PROMPTS` names) and the grammar each gets."""


def prompt_kind(prompt: str) -> str | None:
    """Which structured SuRe prompt this is (`haystack_fusion.testing.identify_prompt`); None for free text."""
    return KINDS.get(identify_prompt(prompt) or "")


@component
class GrammarLocalChatGenerator(LocalChatGenerator):
    """The embedded generator, with `GRAMMARS[kind]` on SuRe's structured prompts; replies logged by kind."""

    def __init__(self, constrained: bool, **kwargs: Any) -> None:
        LocalChatGenerator.__init__(self, **kwargs)
        self.constrained = constrained
        self.log: list[tuple[str | None, str]] = []

    @component.output_types(replies=list[ChatMessage])
    def run(
        self, messages: list[ChatMessage] | str, generation_kwargs: dict[str, Any] | None = None, **kwargs: Any
    ) -> dict[str, list[ChatMessage]]:
        text = messages if isinstance(messages, str) else messages[-1].text or ""
        kind = prompt_kind(text)
        if self.constrained and kind is not None:
            generation_kwargs = {**(generation_kwargs or {}), "grammar": GRAMMARS[kind]}
        result = LocalChatGenerator.run(self, messages, generation_kwargs=generation_kwargs, **kwargs)
        self.log.append((kind, result["replies"][0].text if result["replies"] else ""))
        return result


def mode_row(question: Any, summarized: dict[str, Any], verified: dict[str, Any], log: list) -> dict[str, Any]:
    """One question's figures for one mode."""
    answers = verified["answers"]
    prediction = answers[0].data if answers else "unknown"
    golds = list(question.answers)
    correct = is_unknown(prediction) if question.is_impossible else bool(exact_match(prediction, golds))
    return {
        "candidates": summarized["candidates"],
        "validity": [a.meta.get("validity") for a in answers],
        "ranking_named": [parse_preference(reply) is not None for kind, reply in log if kind == "ranking"],
        "a_wins": bool(answers) and answers[0].meta.get("candidate_index") == 0,
        "em": float(correct),
        "f1": 0.0 if question.is_impossible else f1(prediction, golds),
        "completion_tokens": sum_completion(
            summarized["meta"]["usage"], answers[0].meta.get("usage") if answers else None
        ),
        "answerable": not question.is_impossible,
    }


def run(dataset: Any, top_k: int) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[bool]]]:
    """Per-question rows of the three modes, and label-only flags of the summaries before / after."""
    store = InMemoryDocumentStore()
    store.write_documents(dataset.documents)
    retriever = InMemoryBM25Retriever(document_store=store, top_k=top_k)
    free, constrained = GrammarLocalChatGenerator(False), GrammarLocalChatGenerator(True)
    summarizer = {
        llm: CandidateSummarizer(chat_generator=llm, few_shot=True, max_concurrency=1) for llm in (free, constrained)
    }
    zero_shot_summaries = CandidateSummarizer(chat_generator=free, few_shot=False, max_concurrency=1)
    verifier = {llm: SummaryVerifier(chat_generator=llm, max_concurrency=1) for llm in (free, constrained)}
    probability = SummaryVerifier(chat_generator=free, max_concurrency=1, scoring="probability")
    rows: dict[str, list[dict[str, Any]]] = {"free": [], "grammar": [], "probability": []}
    labels: dict[str, list[bool]] = {"before": [], "after": []}
    for question in dataset.questions:
        query = question.question
        documents = retriever.run(query=query)["documents"]
        for name, llm in (("free", free), ("grammar", constrained)):
            llm.log.clear()
            summarized = summarizer[llm].run(query=query, documents=documents)
            verified = verifier[llm].run(
                query=query, candidates=summarized["candidates"], summaries=summarized["summaries"]
            )
            rows[name].append(mode_row(question, summarized, verified, llm.log))
            if name == "free":
                free_run = summarized
        free.log.clear()
        verified = probability.run(query=query, candidates=free_run["candidates"], summaries=free_run["summaries"])
        rows["probability"].append(mode_row(question, free_run, verified, free.log))
        candidates = free_run["candidates"]
        before = zero_shot_summaries.run(query=query, documents=documents, candidates=candidates)["summaries"]
        labels["before"] += [summary_is_label(summary, candidates) for summary in before]
        labels["after"] += [summary_is_label(summary, candidates) for summary in free_run["summaries"]]
    return rows, labels


def sum_completion(*usages: dict[str, Any] | None) -> int:
    return sum(int((usage or {}).get("completion_tokens") or 0) for usage in usages)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    well_formed = [len(r["candidates"]) == 2 and len(set(r["candidates"])) == 2 for r in rows]
    words = [len(c.split()) for r in rows for c in r["candidates"]]
    validity = [v for r in rows for v in r["validity"] if v is not None]
    mixed = [any(v is not None and v < 0.5 for v in r["validity"]) for r in rows if r["validity"]]
    named = [n for r in rows for n in r["ranking_named"]]
    answerable = [r for r in rows if r["answerable"]]
    return {
        "K distinct candidates": f"{sum(well_formed)}/{len(rows)}",
        "words/candidate": round(statistics.mean(words), 2) if words else None,
        "validity True": f"{sum(v >= 0.5 for v in validity)}/{len(validity)}",
        "not all True": f"{sum(mixed)}/{len(mixed)}",
        "ranking names a passage": f"{sum(named)}/{len(named)}",
        "(a) wins": f"{sum(r['a_wins'] for r in rows)}/{len(rows)}",
        "EM": round(100 * statistics.mean(r["em"] for r in rows), 1),
        "F1 answerable": round(100 * statistics.mean(r["f1"] for r in answerable), 1) if answerable else None,
        "completion tokens/q": round(statistics.mean(r["completion_tokens"] for r in rows), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--top-k", type=int, default=5)
    args = parser.parse_args()
    if not os.environ.get(SQUAD_VARIABLE):
        sys.exit(f"set ${SQUAD_VARIABLE} to the SQuAD 2.0 dev subset: {SUBSET}")
    dataset = load_dataset(default_squad_path())
    reported = {q.id for q in dataset.sample(200, seed=0).questions}
    dataset = dataclasses.replace(dataset, questions=[q for q in dataset.questions if q.id not in reported])
    dataset = dataset.sample(args.questions, seed=0)
    print(f"{len(dataset.questions)} development questions ({dataset.answerable} answerable), BM25 top-{args.top_k}")
    rows, labels = run(dataset, args.top_k)
    for mode, mode_rows in rows.items():
        print(f"{mode:>11}: " + "; ".join(f"{name} {value}" for name, value in summarize(mode_rows).items()))
    for when, flags in labels.items():
        what = "Listing 7 as in the paper" if when == "before" else "Listing 7 with the demonstration"
        print(f"label-only summaries {when} ({what}): {sum(flags)}/{len(flags)}")


if __name__ == "__main__":
    main()
