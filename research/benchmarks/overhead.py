"""
Benchmark: our orchestration overhead over real HTTP, against the openai client alone making the same calls
(issue 14 item 2: at most 2% of the wall at 200 ms per call for post-fusion k = 5, async and sync, in one run).

The server is `peers.py`'s: `tests.support.openai_server` in a child process on 127.0.0.1 (a free port; it
stops by itself), waiting `--latency` seconds before each reply. Per round it runs, in a shuffled order, one question
of:
- `bare async`: the k prompts `PostFusionVoter` sends (the same messages, rendered by `prompts.render`), as k
  `openai.AsyncOpenAI().chat.completions.create` calls in one `asyncio.gather`: the floor for any async fan-out on
  that client, and the reference of both overhead figures, as the issue defines them;
- `bare threads`: the same k calls with `openai.OpenAI` from a kept pool of k threads (the sync floor, for reference);
- `ours run_async`: `await PostFusionVoter(chat_generator=OpenAIChatGenerator(...)).run_async(...)`, defaults;
- `ours run`: `PostFusionVoter.run(...)` from synchronous code (no running loop), defaults.
Rounds are paired: each system's wall time is compared with the `bare async` time of the same round, so drifting load
on a shared machine cancels out. It prints per system the median wall time of one question (ms), the median paired
difference from `bare async` (ms) and that as a percentage of the `bare async` wall, with a 95% bootstrap CI of the
median difference (`scipy.stats.bootstrap`), and the CPU time per question of this process (ms, `time.process_time`:
the client-side work, which does not depend on the server's scheduling). Every run checks that the server received
exactly k requests (no retry) and that the vote answered "Paris".

Run: `.venv/bin/python -m research.benchmarks.overhead [--latency 0.2] [--k 5] [--rounds 40]`.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import random
import statistics
import time
from typing import Any

import numpy as np
import openai
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.utils import Secret
from scipy import stats

from haystack_fusion import PostFusionVoter
from haystack_fusion.prompts import PROMPTS, format_passages, render
from research.benchmarks.peers import ANSWER, MODEL, QUERY, ServerProcess, passages

SYSTEMS = ("bare async", "bare threads", "ours run_async", "ours run")


def openai_messages(k: int) -> list[list[dict[str, Any]]]:
    """The k prompts PostFusionVoter sends for `QUERY` over `passages(k)`, in the openai client's message format."""
    prompts = [
        render(PROMPTS["figure7"], passages=format_passages([document]), query=QUERY) for document in passages(k)
    ]
    return [[message.to_openai_dict_format() for message in prompt] for prompt in prompts]


class Systems:
    """The four systems, with their clients kept between rounds (the async ones on `loop`)."""

    def __init__(self, base_url: str, k: int) -> None:
        self.k = k
        self.loop = asyncio.new_event_loop()
        self.messages = openai_messages(k)
        self.documents = passages(k)
        self.async_client = self.loop.run_until_complete(self._async_client(base_url))
        self.client = openai.OpenAI(base_url=base_url, api_key="x")
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=k)
        self.voter = PostFusionVoter(
            chat_generator=OpenAIChatGenerator(api_base_url=base_url, api_key=Secret.from_token("x"), model=MODEL)
        )
        self.sync_voter = PostFusionVoter(
            chat_generator=OpenAIChatGenerator(api_base_url=base_url, api_key=Secret.from_token("x"), model=MODEL)
        )

    @staticmethod
    async def _async_client(base_url: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=base_url, api_key="x")  # made in the loop that uses it

    def run(self, system: str) -> None:
        """Answer one question with `system`; raises if the vote did not answer `ANSWER`."""
        if system == "bare async":
            self.loop.run_until_complete(self._bare_async())
        elif system == "bare threads":
            list(self.pool.map(self._create, self.messages))
        elif system == "ours run_async":
            self._check(self.loop.run_until_complete(self.voter.run_async(query=QUERY, documents=self.documents)))
        else:
            self._check(self.sync_voter.run(query=QUERY, documents=self.documents))

    async def _bare_async(self) -> None:
        await asyncio.gather(
            *(self.async_client.chat.completions.create(model=MODEL, messages=m) for m in self.messages)  # type: ignore[arg-type]
        )

    def _create(self, messages: list[dict[str, Any]]) -> Any:
        return self.client.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]

    @staticmethod
    def _check(result: dict[str, Any]) -> None:
        answer = result["answers"][0]
        if answer.data != ANSWER or answer.meta["usage"].get("failed_calls"):
            raise AssertionError(f"post-fusion answered {answer.data!r}, usage {answer.meta['usage']}")

    def close(self) -> None:
        self.loop.run_until_complete(self.async_client.close())
        self.loop.run_until_complete(self.voter.close_async())
        self.sync_voter.close()
        self.client.close()
        self.pool.shutdown()
        self.loop.close()


def median_ci(differences: list[float], seed: int) -> tuple[float, float]:
    """95% percentile-bootstrap CI of the median of paired differences (scipy.stats.bootstrap)."""
    if len(set(differences)) < 2:
        return differences[0], differences[0]
    result = stats.bootstrap(
        (np.asarray(differences),), np.median, confidence_level=0.95, method="percentile", random_state=seed
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.2, help="seconds the server waits before each reply")
    parser.add_argument("--k", type=int, default=5, help="passages (calls) per question")
    parser.add_argument("--rounds", type=int, default=40, help="paired rounds (each runs every system once)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the run order and of the bootstrap")
    args = parser.parse_args()

    walls: dict[str, list[float]] = {system: [] for system in SYSTEMS}
    cpus: dict[str, list[float]] = {system: [] for system in SYSTEMS}
    order = random.Random(args.seed)
    with ServerProcess(latency=args.latency, lifetime=60 + args.rounds * 10 * args.latency) as server:
        systems = Systems(server.base_url, args.k)
        try:
            for system in SYSTEMS:  # warm-up: connections open, templates compiled
                systems.run(system)
            for _ in range(args.rounds):
                for system in order.sample(SYSTEMS, len(SYSTEMS)):
                    server.reset()
                    cpu, wall = time.process_time(), time.perf_counter()
                    systems.run(system)
                    walls[system].append(time.perf_counter() - wall)
                    cpus[system].append(time.process_time() - cpu)
                    requests = server.stats()["requests"]
                    if requests != args.k:
                        raise AssertionError(f"{system}: the server received {requests} requests for {args.k} calls")
        finally:
            systems.close()

    reference = walls["bare async"]
    print(
        f"post-fusion k = {args.k}, {args.latency * 1000:.0f} ms per call, {args.rounds} paired rounds; "
        f"bare async median {statistics.median(reference) * 1000:.1f} ms"
    )
    print("| system | median wall ms | diff. vs bare async, ms [95% CI] | % of bare async wall | CPU ms/question |")
    print("|---|---:|---:|---:|---:|")
    for system in SYSTEMS:
        differences = [(wall - base) * 1000 for wall, base in zip(walls[system], reference, strict=True)]
        median = statistics.median(differences)
        low, high = median_ci(differences, args.seed)
        share = 100 * median / (statistics.median(reference) * 1000)
        print(
            f"| {system} | {statistics.median(walls[system]) * 1000:.1f} | {median:+.1f} [{low:+.1f}, {high:+.1f}] "
            f"| {share:+.1f}% | {statistics.median(cpus[system]) * 1000:.1f} |"
        )


if __name__ == "__main__":
    main()
