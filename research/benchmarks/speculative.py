"""
Benchmark: `concat_pf` sequential vs speculative (`speculative=True`: post-fusion's k calls start beside
concatenation's and are cancelled when its answer holds), against the latency-injecting test server
(`tests.support.openai_server`, in a thread of this process) with Haystack's `OpenAIChatGenerator`, through
`Pipeline.run`.

For k = `--ks` synthetic passages and first answers that are unsure (concatenation says "unknown": post-fusion
runs) or sure (its answer holds), it prints the wall time of one question (median of `--repeats` after one untimed
warm-up) as a ratio to one call's wall time, and per question the LLM calls sent, the speculative and cancelled
ones and the tokens counted (the server counts words as tokens; a cancelled call's prompt tokens are estimated,
`components.speculation.CHARS_PER_TOKEN`).

Run: `.venv/bin/python -m research.benchmarks.speculative [--latency 0.2] [--ks 5,10,20] [--repeats 3]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack import Document
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.dataclasses import ChatMessage
from haystack.utils import Secret

from haystack_fusion.strategies import StrategyRun, build_pipeline
from haystack_fusion.strategies.run import strategy_run
from haystack_fusion.testing import PromptReplies
from tests.support.openai_server import OpenAIServer


def ask(pipe: object, question: str, k: int) -> tuple[float, StrategyRun]:
    documents = [Document(content=f"Passage {i}: the capital city is discussed here.") for i in range(k)]
    start = time.perf_counter()
    outputs = pipe.run({"query": question, "documents": documents}, include_outputs_from=set(pipe.graph))  # type: ignore[attr-defined]
    seconds = time.perf_counter() - start
    return seconds, strategy_run(pipe, question, outputs)  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--ks", default="5,10,20")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"latency {args.latency} s per call, Pipeline.run, median of {args.repeats}")
    print("| first answer | k | sequential x | speculative x | calls seq / spec | speculative / cancelled calls | "
          "tokens seq / spec |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for case, unknown in (("unsure", 1.0), ("sure", 0.0)):
        with OpenAIServer(reply=PromptReplies(concatenation_unknown=unknown), latency=args.latency) as server:
            llm = OpenAIChatGenerator(
                api_base_url=server.base_url, api_key=Secret.from_token("x"), model="test", max_retries=0
            )
            llm.run([ChatMessage.from_user("warm-up")])
            one = statistics.median(ask_one(llm) for _ in range(args.repeats))
            for k in [int(k) for k in args.ks.split(",")]:
                row: dict[bool, tuple[float, StrategyRun]] = {}
                for speculative in (False, True):
                    pipe = build_pipeline("concat_pf", chat_generator=llm, speculative=speculative)
                    ask(pipe, "Which is the capital? (warm-up)", k)
                    runs = [ask(pipe, f"Which is the capital of region {i}?", k) for i in range(args.repeats)]
                    row[speculative] = (statistics.median(s for s, _ in runs), runs[-1][1])
                (seq_s, seq), (spec_s, spec) = row[False], row[True]
                tokens = [run.usage.prompt_tokens + run.usage.completion_tokens for run in (seq, spec)]
                print(
                    f"| {case} | {k} | {seq_s / one:.2f} | {spec_s / one:.2f} | {seq.usage.calls} / "
                    f"{spec.usage.calls} | {spec.usage.speculative_calls or 0} / "
                    f"{spec.usage.cancelled_calls or 0} | {tokens[0]} / {tokens[1]} |"
                )


def ask_one(llm: OpenAIChatGenerator) -> float:
    start = time.perf_counter()
    llm.run([ChatMessage.from_user("Which is the capital?")])
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
