"""
Benchmark: the embedded model with and without llama.cpp's extra CPU buffer types (`use_extra_bufts`).

With extra buffer types, llama.cpp repacks the Q4_K weights at load time for its repacked AVX2 / AVX-512 kernels,
and, in a build that has them, its AMX kernels (which crash on this model: `use_extra_buffer_types` in
`haystack_fusion/backends/local.py` turns them off on such a build). For each setting and thread count, in a fresh
process (so a crash is reported, not fatal), it prints:

- prefill tokens/s: one ~1,800-token concatenation prompt (Figure 7, BM25 top-10 of the SQuAD 2.0 subset) evaluated
  from scratch, 1 completion token, best of `--repeats`;
- decode tokens/s: the same prompt with 64 forced completion tokens, minus the prefill, best of `--repeats`;
- whether its 64-token greedy reply equals that of the first configuration.

Run: `HAYSTACK_FUSION_SQUAD=PATH .venv/bin/python -m research.benchmarks.extra_buffer_types [--threads 1,2]
[--repeats 3]`. The configurations run one after another, so their ratios are measured under the same machine load.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")


def measure(use_extra_bufts: bool, threads: int, repeats: int) -> dict:
    """Prefill and decode tokens/s and the greedy reply for one setting, in this process."""
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
    from haystack.document_stores.in_memory import InMemoryDocumentStore

    from haystack_fusion.backends.local import LocalChatGenerator, llama_cpp_runtime
    from haystack_fusion.corpus import default_squad_path
    from haystack_fusion.evaluation.datasets import load_dataset
    from haystack_fusion.prompts import PROMPTS, format_passages, render

    dataset = load_dataset(default_squad_path())
    store = InMemoryDocumentStore()
    store.write_documents(dataset.documents)
    question = dataset.questions[0].question
    passages = InMemoryBM25Retriever(document_store=store, top_k=10).run(query=question)["documents"]
    prompt = render(PROMPTS["figure7"], passages=format_passages(passages), query=question)

    llm = LocalChatGenerator(
        prefix_cache=False,
        reply_cache=False,
        model_kwargs={"use_extra_bufts": use_extra_bufts, "n_threads": threads, "n_threads_batch": threads},
    )
    llm.warm_up()
    llm.run(prompt, generation_kwargs={"max_tokens": 1})  # load pages, warm caches
    prefill: list[float] = []
    decode: list[float] = []
    text = ""
    for _ in range(repeats):
        timings = []
        for max_tokens in (1, 65):
            start = time.perf_counter()
            reply = llm.run(prompt, generation_kwargs={"max_tokens": max_tokens, "stop": []})["replies"][0]
            timings.append((time.perf_counter() - start, reply.meta["usage"]))
            text = reply.text or ""
        (prefill_s, usage), (full_s, full_usage) = timings
        prefill.append(usage["prompt_tokens"] / prefill_s)
        decode.append((full_usage["completion_tokens"] - usage["completion_tokens"]) / max(full_s - prefill_s, 1e-9))
    return {
        "system_info": llama_cpp_runtime()["system_info"],
        "prompt_tokens": usage["prompt_tokens"],
        "prefill": max(prefill),
        "decode": max(decode),
        "reply": text,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--threads", default="1,2", help="thread counts (n_threads and n_threads_batch)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        use, threads = args.child.split(",")
        print(json.dumps(measure(use == "on", int(threads), args.repeats)))
        return

    first_reply: str | None = None
    system_info = ""
    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        for use in ("on", "off"):
            child = subprocess.run(
                [sys.executable, __file__, "--child", f"{use},{threads}", "--repeats", str(args.repeats)],
                capture_output=True,
                text=True,
            )
            label = f"extra buffer types {use:>3}, {threads} thread{'s' if threads > 1 else ''}"
            if child.returncode != 0:
                cause = signal.Signals(-child.returncode).name if child.returncode < 0 else f"exit {child.returncode}"
                rows.append(f"| {label} | crashed ({cause}) | | |")
                continue
            result = json.loads(child.stdout.strip().splitlines()[-1])
            system_info = result["system_info"]
            first_reply = result["reply"] if first_reply is None else first_reply
            same = "same" if result["reply"] == first_reply else "DIFFERS"
            rows.append(f"| {label} | {result['prefill']:.0f} | {result['decode']:.1f} | {same} |")
    print(f"llama.cpp: {system_info}")
    print("| setting | prefill tokens/s | decode tokens/s | 64-token greedy reply vs the first row |")
    print("|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
