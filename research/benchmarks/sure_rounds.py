"""
Benchmark: SuRe's 1 + K + K + K(K-1) calls, one after another (as the official code makes them) vs in 3 rounds.

CandidateSummarizer and SummaryVerifier send independent calls concurrently, so a question takes 3 dependent rounds
(candidates; summaries; validity and ranking) instead of 1 + K + K + K(K-1) sequential calls. The generator waits a
fixed latency per call (as a hosted API would) and answers each prompt in its form (`haystack_fusion.testing`), so
the figures measure the call structure, not a model. Prints seconds per question and the speed-up, measured in one run.
Run: `.venv/bin/python -m research.benchmarks.sure_rounds [--latency 0.2] [--k 2] [--questions 3]`.
"""

from __future__ import annotations

import argparse
import time

from haystack import Document

from haystack_fusion import CandidateSummarizer, SummaryVerifier
from haystack_fusion.testing import AsyncScriptedChatGenerator, PromptReplies


def remote_like_generator(latency: float, k: int) -> AsyncScriptedChatGenerator:
    """Replies to each SuRe prompt in its form after `latency` seconds, in `run_async` (event loop) and `run`."""
    replies = PromptReplies([f"City {i}" for i in range(k)], validity_true=1.0, prefer_first=1.0)
    return AsyncScriptedChatGenerator(replies, latency=latency)


def seconds_per_question(max_concurrency: int, latency: float, k: int, questions: int) -> tuple[float, int]:
    generator = remote_like_generator(latency, k)
    summarizer = CandidateSummarizer(chat_generator=generator, num_candidates=k, max_concurrency=max_concurrency)
    verifier = SummaryVerifier(chat_generator=generator, max_concurrency=max_concurrency)
    documents = [Document(content=f"Passage {i} about French cities.") for i in range(10)]
    query = "Which city is the capital of France?"
    calls = 0
    start = time.perf_counter()
    for _ in range(questions):
        summarized = summarizer.run(query=query, documents=documents)
        verified = verifier.run(query=query, candidates=summarized["candidates"], summaries=summarized["summaries"])
        calls = summarized["meta"]["usage"]["calls"] + verified["answers"][0].meta["usage"]["calls"]
    return (time.perf_counter() - start) / questions, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per simulated call")
    parser.add_argument("--k", type=int, default=2, help="answer candidates K")
    parser.add_argument("--questions", type=int, default=3)
    args = parser.parse_args()
    sequential, calls = seconds_per_question(1, args.latency, args.k, args.questions)
    print(f"K={args.k}: {calls} calls per question, latency {args.latency:.3f} s/call, {args.questions} questions")
    print(f"max_concurrency=1 (one call after another): {sequential:.3f} s/question")
    width = args.k * (args.k - 1) + args.k
    for concurrency in sorted({2, 4, width}):
        concurrent, _ = seconds_per_question(concurrency, args.latency, args.k, args.questions)
        print(f"max_concurrency={concurrency}: {concurrent:.3f} s/question, speed-up x{sequential / concurrent:.2f}")


if __name__ == "__main__":
    main()
