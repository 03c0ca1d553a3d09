"""
Benchmark: how much of each strategy's prompts a prefix cache could reuse, for one question over k passages.

Hosted providers cache prompt prefixes (OpenAI reports the hits as `usage.prompt_tokens_details.cached_tokens`, which
our usage sums as `cached_tokens`), and the embedded model reuses the prefix it shares with the previous prompt, cut
back to a multiple of its 512-token batch (`backends.pinned.reuse_prefix`). Every registered strategy
(`haystack_fusion.strategies.STRATEGIES`) answers one question over k synthetic passages with
`haystack_fusion.testing.PromptAwareChatGenerator`, which replies to each prompt in its form, so that every stage runs:
concatenation says "unknown" (concat_pf and cascade fall back), post-fusion's vote ties (cascade verifies it with SuRe),
SuRe gets two candidates. Calls are made one at a time (`max_concurrency=1`), in the order the strategy sends them. No
model runs; the prompts are the real ones.

For each call after the first of the question, the shared-prefix share is the longest common prefix with any earlier
prompt of the question divided by the call's length; the table gives its mean over those calls, and the reusable
share: the sum of those prefixes over all the question's prompt characters (or tokens, counted with the packaged
model's tokenizer when the `local` extra is installed). The "embedded" column is what the embedded model's cache can
reuse: the prefix shared with the previous prompt only, in whole 512-token batches. A second table gives each round
(prompt kind) and where its varying part sits.

Run: `.venv/bin/python -m research.benchmarks.prompt_prefixes [--k 5]`.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack import Document, component

from haystack_fusion.strategies import STRATEGIES, build_pipeline, run_strategy
from haystack_fusion.testing import PromptAwareChatGenerator, PromptReplies, identify_prompt

QUERY = "Which city is the seat of the regional government?"
TOPICS = ["Paris", "Paris", "Lyon", "Lyon", None]
"""The answer each synthetic passage gives (None: an irrelevant passage), so post-fusion's vote ties 2-2."""
FILLER = (
    "The city grew around a river crossing and a market, and its old quarter keeps the narrow streets, covered "
    "passages and stone bridges of that time. Its museums, a university founded in the fifteenth century and a "
    "large railway station draw visitors from the whole region throughout the year."
)
EMBEDDED_BATCH = 512
"""The embedded model's prompt batch in tokens (`backends.local.DEFAULT_BATCH_TOKENS`): its reused prefix is cut back
to a multiple of it."""
PASSAGE_BLOCK = re.compile(r"<passage key=")

VARYING_PART: dict[Any, str] = {
    "Fig. 7, k passages": "all k passages, then the question, after Figure 7's instructions",
    "Fig. 7, one passage": "the passage, then the question after it; the instructions and examples before it are "
    "shared (after concatenation: up to its first passage's key)",
    "Fig. 8/9 chain of thought": "the passages and the question, after the demonstration",
    "distiller (PF+Concat round 2)": "its own instruction line differs from Figure 7's after 'Given the relevant "
    "background contexts'",
    "L6 candidates": "the passages and the question, after the instruction",
    "L7 conditional summary": "the last lines: the Prediction (the candidate); passages, instructions, question and "
    "choices shared. Nothing is shared with Listing 6, which opens with its instruction where Listing 7 opens with "
    "the passages",
    ("cascade", "L7 conditional summary"): "each candidate's own passages open the prompt (those that voted for it), "
    "so the summaries share almost nothing; the Prediction is still last",
    "L11 generic summary": "the passages open the prompt (after Listing 6 nothing is shared)",
    "L8 validity": "from the second line on: the Prediction (the candidate), then its summary; only 'Question: q' is "
    "shared",
    "L9 ranking": "the first summary from the third line on; the instruction line is shared",
    "L10 answer (Base, Sum-and-pred)": "Base: the passages open the prompt; Sum-and-pred: the generic summary opens it",
    "L12 MCQ": "the passages open the prompt, the choices come last (after Listing 6 nothing is shared)",
    "sum_all answer": "the summaries and the answer instruction, after the passage block shared with Listing 7",
    "CoN single call": "the question and passages, after the instructions and the demonstration",
    "CoN note per passage": "the passage, after the demonstrations and the question (all shared)",
    "CoN synthesis": "its own instructions (steps 4-5): the notes come after the question",
}
"""Where each prompt kind's varying part sits, read from its template (`haystack_fusion.prompts`); a (strategy, kind)
key overrides the kind's own."""


def passage_documents(k: int) -> list[Document]:
    documents = []
    for i in range(k):
        topic = TOPICS[i % len(TOPICS)]
        text = f"{topic} is the seat of the regional government. {FILLER}" if topic else f"Nothing here. {FILLER}"
        documents.append(Document(id=f"p{i}", content=text, meta={"title": f"{topic or 'Elsewhere'} ({i + 1})"}))
    return documents


KINDS: dict[str, str] = {
    "pruning": "Fig. 8/9 chain of thought",
    "summary": "Fig. 8/9 chain of thought",
    "distiller": "distiller (PF+Concat round 2)",
    "sure_candidates": "L6 candidates",
    "sure_few_shot_candidates": "L6 candidates",
    "sure_summary": "L7 conditional summary",
    "sure_few_shot_summary": "L7 conditional summary",
    "sure_generic_summary": "L11 generic summary",
    "sure_validity": "L8 validity",
    "sure_ranking": "L9 ranking",
    "sure_base": "L10 answer (Base, Sum-and-pred)",
    "sure_sum_and_pred": "L10 answer (Base, Sum-and-pred)",
    "sure_mcq": "L12 MCQ",
    "sure_sum_all": "sum_all answer",
    "con_single_call": "CoN single call",
    "con_document_note": "CoN note per passage",
    "con_synthesis": "CoN synthesis",
}
"""The row label of each registered template (`haystack_fusion.prompts.PROMPTS`); Figure 7 is split by passages."""


def prompt_kind(prompt: str) -> str:
    """The paper figure or listing a prompt renders (`haystack_fusion.testing.identify_prompt`)."""
    name = identify_prompt(prompt)
    if name == "figure7":
        live = prompt.rsplit("Context:", 1)[-1]
        return "Fig. 7, k passages" if len(PASSAGE_BLOCK.findall(live)) > 1 else "Fig. 7, one passage"
    return KINDS.get(name or "", "other")


def choose(prompt: str) -> str:
    """The answer a passage gives (None: "unknown"), so that every stage of every strategy runs."""
    live = prompt.rsplit("Question:", 1)[-1] if identify_prompt(prompt) == "con_document_note" else prompt
    live = live.rsplit("Context:", 1)[-1].rsplit("Question:", 1)[0] if "Context:" in live else live
    return next((city for city in ("Paris", "Lyon") if f"{city} is the seat" in live), "unknown")


REPLIES = PromptReplies(
    ["Paris", "Lyon"], concatenation_unknown=1.0, validity_true=1.0, prefer_first=1.0, choose=choose
)
"""Concatenation says "unknown" (concat_pf and cascade fall back), a one-passage Figure 7 prompt answers the city its
passage names (post-fusion's vote ties 2-2: cascade verifies it with SuRe), SuRe gets two candidates, every candidate
is valid."""


@component
class FixedRetriever:
    """Returns the k synthetic passages in order, whatever the query."""

    def __init__(self, documents: list[Document]) -> None:
        self.documents = documents

    @component.output_types(documents=list[Document])
    def run(self, query: str, top_k: int | None = None) -> dict[str, Any]:
        return {"documents": self.documents[: top_k or len(self.documents)]}


def common_prefix(a: Any, b: Any) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Measure:
    """Shared-prefix figures of one question's prompts in one unit (characters or tokens)."""

    total: int = 0
    reusable: int = 0
    embedded: int = 0
    shares: list[float] = field(default_factory=list)

    @property
    def mean_share(self) -> float | None:
        return statistics.fmean(self.shares) if self.shares else None


def measure(
    units: list[Any], kinds: list[str], batch: int | None
) -> tuple[Measure, dict[str, list[float]], dict[str, list[float]]]:
    """
    Shared prefixes of one question's prompts, in call order.

    :param units: Each prompt as a sequence (its characters, or its token ids).
    :param kinds: Each prompt's kind.
    :param batch: The embedded model's batch (tokens) for its column, or None to leave it at 0.
    :returns: The question's `Measure`; per kind, the shares of its calls after the question's first (prefix shared
        with any earlier prompt); per kind, the shares of its calls after the kind's first (prefix shared with an
        earlier prompt of the same kind: where the round's varying part starts).
    """
    result = Measure(total=sum(len(u) for u in units))
    per_kind: dict[str, list[float]] = {}
    within: dict[str, list[float]] = {}
    for j, prompt in enumerate(units):
        if j == 0 or not prompt:
            continue
        shared = max(common_prefix(earlier, prompt) for earlier in units[:j])
        result.reusable += shared
        result.shares.append(shared / len(prompt))
        per_kind.setdefault(kinds[j], []).append(shared / len(prompt))
        same = [earlier for earlier, kind in zip(units[:j], kinds[:j], strict=True) if kind == kinds[j]]
        if same:
            within.setdefault(kinds[j], []).append(max(common_prefix(e, prompt) for e in same) / len(prompt))
        if batch:
            # the embedded model keeps the previous prompt's cache only; at least one token is evaluated again
            previous = min(common_prefix(units[j - 1], prompt), len(prompt) - 1)
            result.embedded += previous // batch * batch
    return result, per_kind, within


def load_tokenizer() -> Callable[[str], list[int]] | None:
    """The packaged model's tokenizer (vocabulary only, no weights), or None without the `local` extra."""
    try:
        from llama_cpp import Llama

        from haystack_fusion.backends.local import packaged_model_path

        vocab = Llama(model_path=packaged_model_path(), vocab_only=True, verbose=False)
    except Exception as error:  # the `local` extra is missing, or the model cannot be read
        print(f"(no tokenizer: {type(error).__name__}: {error}; characters only)")
        return None
    return lambda text: vocab.tokenize(text.encode("utf-8"), add_bos=True)


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--k", type=int, default=5, help="synthetic passages per question (default 5)")
    args = parser.parse_args()
    tokenize = load_tokenizer()
    documents = passage_documents(args.k)
    rows, kind_rows = [], []
    for name in STRATEGIES:
        llm = PromptAwareChatGenerator(REPLIES)
        pipeline = build_pipeline(name, retriever=FixedRetriever(documents), chat_generator=llm, max_concurrency=1)
        run = run_strategy(pipeline, QUERY)
        prompts = llm.prompts
        kinds = [prompt_kind(prompt) for prompt in prompts]
        chars, char_kinds, char_within = measure(prompts, kinds, None)
        tokens = measure([tokenize(p) for p in prompts], kinds, EMBEDDED_BATCH)[0] if tokenize else None
        rounds = list(dict.fromkeys(kinds))
        rows.append(
            "| {name} | {calls} | {rounds} | {chars} | {tokens} | {mean} | {reuse_c} | {reuse_t} | {embedded} |".format(
                name=name,
                calls=len(prompts),
                rounds=run.usage.rounds if run.usage.rounds is not None else "-",
                chars=chars.total,
                tokens=tokens.total if tokens else "-",
                mean=percent(chars.mean_share),
                reuse_c=percent(chars.reusable / chars.total if chars.total else None),
                reuse_t=percent(tokens.reusable / tokens.total if tokens and tokens.total else None),
                embedded=percent(tokens.embedded / tokens.total if tokens and tokens.total else None),
            )
        )
        for kind in rounds:
            shares = char_kinds.get(kind, [])
            same = char_within.get(kind, [])
            calls = kinds.count(kind)
            mean_chars = statistics.fmean(len(p) for p, q in zip(prompts, kinds, strict=True) if q == kind)
            first = kind == kinds[0] and calls == 1
            where = (
                "the question's first call" if first else VARYING_PART.get((name, kind), VARYING_PART.get(kind, "?"))
            )
            any_share = percent(statistics.fmean(shares) if shares else None)
            round_share = percent(statistics.fmean(same) if same else None)
            kind_rows.append(
                f"| {name} | {kind} | {calls} | {mean_chars:.0f} | {any_share} | {round_share} | {where} |"
            )
    size = statistics.fmean(len(d.content or "") for d in documents)
    print(f"k = {args.k} synthetic passages ({size:.0f} characters each), one question, calls in order.\n")
    print(
        "| strategy | calls | rounds | prompt chars | prompt tokens | mean shared-prefix share (calls after the "
        "first) | reusable, chars | reusable, tokens | embedded cache (previous prompt, 512-token batches) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    print()
    print(
        "| strategy | round (prompt kind) | calls | mean chars | shared-prefix share (any earlier prompt) | "
        "shared-prefix share (earlier calls of the round) | where the varying part sits |"
    )
    print("|---|---|---:|---:|---:|---:|---|")
    print("\n".join(kind_rows))


if __name__ == "__main__":
    main()
