"""
Benchmark: post-fusion's k calls with a hosted-API-like generator, sequential vs concurrent (DESIGN "Concurrency").

The generator waits a fixed latency per call (time.sleep in `run`, as a blocking remote API would) and answers
"Paris", so the figures measure the fan-out, not a model. Prints wall time per question at `max_concurrency` 1, 2, 4
and the default (None: all k calls at once), the speed-up over sequential calls, and the default's cost in units of
one call's latency (issue 14's target: at most 1.15x for k = 10), all measured in one run.

It also prints the per-prompt cost of rendering post-fusion's Figure 7 prompt, before (a new ChatPromptBuilder per
prompt, which parses and compiles the Jinja text each time) and after (`prompts.render`: the template compiled once),
and checks that both give the same messages.
Run: `.venv/bin/python -m research.benchmarks.fan_out [--latency 0.2] [--k 10] [--questions 5] [--renders 2000]`.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from haystack import Document, component
from haystack.dataclasses import ChatMessage

from haystack_fusion import PostFusionVoter
from haystack_fusion.prompts import PROMPTS, format_passages, render


@component
class RemoteLikeGenerator:
    """Answers "Paris" after `latency` seconds, in `run_async` (event loop) and `run` (blocking)."""

    def __init__(self, latency: float) -> None:
        self.latency = latency

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], **_: Any) -> dict[str, Any]:
        time.sleep(self.latency)
        return {"replies": [ChatMessage.from_assistant("Paris", meta={"usage": {"prompt_tokens": 100}})]}

    @component.output_types(replies=list[ChatMessage])
    async def run_async(self, messages: list[ChatMessage], **_: Any) -> dict[str, Any]:
        await asyncio.sleep(self.latency)
        return {"replies": [ChatMessage.from_assistant("Paris", meta={"usage": {"prompt_tokens": 100}})]}


def seconds_per_question(max_concurrency: int | None, latency: float, k: int, questions: int) -> float:
    voter = PostFusionVoter(chat_generator=RemoteLikeGenerator(latency), max_concurrency=max_concurrency)
    documents = [Document(content=f"Passage {i} about Paris.") for i in range(k)]
    start = time.perf_counter()
    for _ in range(questions):
        voter.run(query="What is the capital of France?", documents=documents)
    return (time.perf_counter() - start) / questions


def render_seconds(renders: int) -> tuple[float, float]:
    """Seconds per Figure 7 prompt rendered with a new ChatPromptBuilder each time, and with `render`."""
    prompt = PROMPTS["figure7"]
    variables = [
        {"passages": format_passages([Document(content=f"Passage {i} about Paris.")]), "query": "Capital of France?"}
        for i in range(renders)
    ]
    render(prompt, **variables[0])  # compile once, outside the timing, as every later prompt finds it compiled
    start = time.perf_counter()
    before = [prompt.builder().run(**v)["prompt"] for v in variables]
    middle = time.perf_counter()
    after = [render(prompt, **v) for v in variables]
    end = time.perf_counter()
    if before != after:
        raise AssertionError("the compiled template rendered other messages than a new ChatPromptBuilder")
    return (middle - start) / renders, (end - middle) / renders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per simulated call")
    parser.add_argument("--k", type=int, default=10, help="passages per question")
    parser.add_argument("--questions", type=int, default=5)
    parser.add_argument("--renders", type=int, default=2000, help="prompts rendered for the render-cost figure")
    args = parser.parse_args()
    sequential = seconds_per_question(1, args.latency, args.k, args.questions)
    print(f"k={args.k}, latency {args.latency:.3f} s/call, {args.questions} questions")
    print(f"max_concurrency=1: {sequential:.3f} s/question")
    for concurrency in (2, 4):
        concurrent = seconds_per_question(concurrency, args.latency, args.k, args.questions)
        print(f"max_concurrency={concurrency}: {concurrent:.3f} s/question, speed-up x{sequential / concurrent:.2f}")
    default = seconds_per_question(None, args.latency, args.k, args.questions)
    print(
        f"default (max_concurrency=None): {default:.3f} s/question, speed-up x{sequential / default:.2f}, "
        f"{default / args.latency:.3f}x one call's latency"
    )
    before, after = render_seconds(args.renders)
    print(
        f"render one Figure 7 prompt ({args.renders} prompts): new ChatPromptBuilder {before * 1e6:.0f} us, "
        f"compiled once {after * 1e6:.0f} us (x{before / after:.1f} faster); same messages"
    )


if __name__ == "__main__":
    main()
