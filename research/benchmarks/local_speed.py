"""
Benchmark: the embedded model's speed before and after the prefix cache, with identical greedy predictions.

"before" is the runtime as it was (every prompt evaluated from scratch, `n_batch=512`, no reply cache); "after" is
`LocalChatGenerator`'s default at the `--batch` sizes given: the reply cache (a repeated greedy prompt, e.g.
concat_pf's first call after concatenation's, is answered from memory) and the prefix cache
(`backends.pinned.reuse_prefix`: the KV cache of the prefix shared with the previous prompt is reused, cut back to a
batch boundary). For each configuration it prints:

- prefill tokens/s: one ~1,000-token concatenation prompt evaluated from scratch (1 completion token);
- decode tokens/s: the same prompt with 64 forced completion tokens, minus the prefill;
- questions/min of a fixed eval: `--questions` questions of the SQuAD 2.0 subset (stratified sample, seed 0), BM25
  top-`--top-k`, each of `--strategies` (each question counts once per strategy), answered question by question as
  `haystack-fusion eval` does;
- and whether every prediction equals the "before" run's.

Run: `.venv/bin/python -m research.benchmarks.local_speed [--questions 30]
[--strategies concatenation,post_fusion,concat_pf,pf_concat] [--top-k 3] [--batch 512]`. Each configuration gets its
own freshly loaded model; configurations run one after another in the same process, so the ratios are measured
under the same machine load.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.dataclasses import ChatMessage
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.backends.local import _LOADED, LocalChatGenerator
from haystack_fusion.corpus import default_squad_path
from haystack_fusion.evaluation.datasets import load_dataset
from haystack_fusion.evaluation.runner import EvalConfig, Evaluator
from haystack_fusion.prompts import PROMPTS, format_passages, render
from haystack_fusion.settings import SQUAD_VARIABLE

SUBSET = "../shared/data/squad2-dev-subset/squad2_dev_subset.json"
"""The file `$HAYSTACK_FUSION_SQUAD` names for this benchmark: the SQuAD 2.0 dev subset its numbers are made on."""


def generator(batch: int, cached: bool, **kwargs: Any) -> LocalChatGenerator:
    return LocalChatGenerator(n_batch=batch, prefix_cache=cached, reply_cache=cached, **kwargs)


def token_rates(batch: int, prefix_cache: bool, prompt: list[ChatMessage]) -> tuple[float, float, int]:
    """(prefill tokens/s, decode tokens/s, prompt tokens) of one prompt evaluated from scratch."""
    llm = generator(batch, prefix_cache)
    llm.warm_up()
    llm.run(prompt, generation_kwargs={"max_tokens": 1})  # load pages, warm caches
    timings = []
    for max_tokens in (1, 65):
        assert llm._shared is not None
        llm._shared.llama.reset()
        llm._shared.replies.clear()
        start = time.perf_counter()
        reply = llm.run(prompt, generation_kwargs={"max_tokens": max_tokens, "stop": []})["replies"][0]
        timings.append((time.perf_counter() - start, reply.meta["usage"]))
    (prefill_s, usage), (full_s, full_usage) = timings
    decoded = full_usage["completion_tokens"] - usage["completion_tokens"]
    return usage["prompt_tokens"] / prefill_s, decoded / max(full_s - prefill_s, 1e-9), usage["prompt_tokens"]


def eval_run(
    batch: int, prefix_cache: bool, dataset: Any, strategies: list[str], top_k: int
) -> tuple[float, dict[Any, str]]:
    """(questions/min, predictions by (strategy, question id)) of the fixed eval."""
    store = InMemoryDocumentStore()
    store.write_documents(dataset.documents)
    with tempfile.TemporaryDirectory() as out:
        evaluator = Evaluator(
            dataset,
            EvalConfig(strategies=strategies, top_ks=[top_k], strategy_options={"few_shot": True}),
            out,
            retriever_factory=lambda: InMemoryBM25Retriever(document_store=store),
            generator_factory=lambda: generator(batch, prefix_cache),
        )
        start = time.perf_counter()
        records = evaluator.run()
        seconds = time.perf_counter() - start
    return 60 * len(records) / seconds, {(r.strategy, r.question_id): r.prediction for r in records}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--questions", type=int, default=30)
    parser.add_argument("--strategies", default="concatenation,post_fusion,concat_pf,pf_concat")
    parser.add_argument("--top-k", type=int, default=3)
    parser.add_argument("--batch", default="512", help="n_batch values of the prefix-cached runs")
    args = parser.parse_args()
    if not os.environ.get(SQUAD_VARIABLE):
        sys.exit(f"set ${SQUAD_VARIABLE} to the SQuAD 2.0 dev subset: {SUBSET}")
    dataset = load_dataset(default_squad_path()).sample(args.questions, seed=0)
    strategies = args.strategies.split(",")
    question = dataset.questions[0].question
    store = InMemoryDocumentStore()
    store.write_documents(dataset.documents)
    passages = InMemoryBM25Retriever(document_store=store, top_k=10).run(query=question)["documents"]
    prompt = render(PROMPTS["figure7"], passages=format_passages(passages), query=question)

    configs = [("before: from scratch, n_batch=512", 512, False)] + [
        (f"after: prefix cache, n_batch={batch}", int(batch), True) for batch in args.batch.split(",")
    ]
    baseline: dict[Any, str] | None = None
    baseline_rate = 0.0
    print(
        f"{len(dataset.questions)} questions x {len(strategies)} strategies ({', '.join(strategies)}), "
        f"BM25 top-{args.top_k}"
    )
    for label, batch, cached in configs:
        _LOADED.clear()  # a fresh model per configuration
        prefill, decode, prompt_tokens = token_rates(batch, cached, prompt)
        rate, predictions = eval_run(batch, cached, dataset, strategies, args.top_k)
        if baseline is None:
            baseline, baseline_rate = predictions, rate
        differ = [key for key in baseline if baseline[key] != predictions.get(key)]
        print(
            f"{label}: prefill {prefill:.0f} tokens/s ({prompt_tokens}-token prompt), decode {decode:.1f} tokens/s, "
            f"{rate:.2f} questions/min (x{rate / baseline_rate:.2f}), "
            + ("predictions identical" if not differ else f"{len(differ)} predictions DIFFER: {differ[:5]}")
        )


if __name__ == "__main__":
    main()
