"""
Load on the chat endpoint: `haystack-fusion serve` with `concat_pf`, many concurrent clients through the real
`openai` client, every request answered or refused with 503, latency percentiles and the server's memory.

Two modes:

- default: the OpenAI backend against the project's test server (`tests.support.openai_server`, `--latency`
  seconds per call, replying "Paris", so concatenation answers and each request makes one LLM call) over a saved
  in-memory index of three made-up passages. `--clients` workers send `--requests` chat completions in all, each the
  next as soon as its last one returns. Prints requests, answered, refused (503/429), other outcomes (timeouts, other
  statuses: there should be none), p50/p95/p99 latency of the answered and the refused, the most calls the LLM server
  saw at once, and the Hayhooks process's RSS: after startup, after a warm-up, every 100 requests, after the run, and
  the trend (least-squares slope over the marks after the first 200 requests, in MB per 100 requests).
- `--embedded`: the embedded llama.cpp model over the SQuAD 2.0 subset `$HAYSTACK_FUSION_SQUAD` names (`SUBSET`),
  which serializes its calls: `--clients` requests at once (default 6), one question each, against the admission
  limit's queue (`HAYSTACK_FUSION_MAX_REQUESTS` 1 by default there). Prints each request's status and seconds: the
  answered ones one after another, the others refused with 503 once they have waited `--queue-timeout` seconds.

The admission limit comes from `--max-requests`, `--max-waiting` and `--queue-timeout` (unset: the wrappers'
defaults, `haystack_fusion.serving.hayhooks`). The clients do not retry (`max_retries=0`) and give up after
`--client-timeout` seconds, which would count as a hang. With `--unauthenticated-every n`, the server requires
`HAYSTACK_FUSION_API_KEY` and every n-th request carries a wrong key: each of those should be a 401.

    .venv/bin/python -m research.benchmarks.load --requests 1000 --clients 50 --latency 0.2
    .venv/bin/python -m research.benchmarks.load --requests 1000 --clients 50 --latency 0.2 \
        --max-requests 8 --max-waiting 16
    .venv/bin/python -m research.benchmarks.load --embedded --clients 6 --queue-timeout 30
    .venv/bin/python -m research.benchmarks.load --requests 1000 --clients 50 --latency 0.2 --unauthenticated-every 10
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

import openai
from haystack import Document

from haystack_fusion.backends import save_store
from tests.support.openai_server import OpenAIServer
from tests.support.serve_process import HayhooksProcess

SUBSET = "../shared/data/squad2-dev-subset/squad2_dev_subset.json"
"""The file `$HAYSTACK_FUSION_SQUAD` names for this benchmark: the SQuAD 2.0 dev subset its numbers are made on."""
MB = 1024 * 1024
DOCUMENTS = [
    Document(content="Paris is the capital and largest city of France.", meta={"title": "Paris"}),
    Document(content="France is a country in Western Europe; its capital is Paris.", meta={"title": "France"}),
    Document(content="Berlin is the capital of Germany.", meta={"title": "Berlin"}),
]
QUESTION = "What is the capital of France?"
API_KEY = "load-benchmark-key"


@dataclass
class Outcomes:
    """What the clients saw: seconds of each answered and refused request, and anything else (should be empty)."""

    answered: list[float] = field(default_factory=list)
    refused: list[float] = field(default_factory=list)
    refused_status: dict[int, int] = field(default_factory=dict)
    unauthorized: list[float] = field(default_factory=list)
    other: list[str] = field(default_factory=list)
    per_request: list[tuple[int, str, float]] = field(default_factory=list)

    @property
    def done(self) -> int:
        return len(self.answered) + len(self.refused) + len(self.unauthorized) + len(self.other)


class RssSampler:
    """Samples a process's RSS every `interval` seconds in a thread; `marks` are taken on demand."""

    def __init__(self, hayhooks: HayhooksProcess, interval: float = 0.25) -> None:
        self.hayhooks = hayhooks
        self.interval = interval
        self.samples: list[int] = []
        self.marks: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.samples.append(self.hayhooks.rss_bytes())

    def mark(self, done: int) -> None:
        self.marks.append((done, self.hayhooks.rss_bytes()))

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), nearest-rank on the sorted values; nan when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def slope_mb_per_100(marks: list[tuple[int, int]]) -> float:
    """Least-squares slope of RSS against requests done, in MB per 100 requests."""
    if len(marks) < 2:
        return float("nan")
    xs = [done for done, _ in marks]
    ys = [rss / MB for _, rss in marks]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    covariance = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    variance = sum((x - mean_x) ** 2 for x in xs)
    return 100 * covariance / variance if variance else float("nan")


async def drive(
    url: str,
    model: str,
    questions: list[str],
    clients: int,
    timeout: float,
    on_done=None,
    *,
    api_key: str = "unused",
    unauthenticated_every: int = 0,
) -> Outcomes:
    """
    Send one chat completion per question from `clients` workers; each sends its next when the last returns. With
    `unauthenticated_every` = n > 0, every n-th request is sent with a wrong key (its 401 counts as `unauthorized`).
    """
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=timeout)
    stranger = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="not-the-key", max_retries=0, timeout=timeout)
    outcomes = Outcomes()
    pending = iter(enumerate(questions))

    async def worker() -> None:
        for index, question in pending:
            start = time.monotonic()
            sender = stranger if unauthenticated_every and index % unauthenticated_every == 0 else client
            try:
                await sender.chat.completions.create(model=model, messages=[{"role": "user", "content": question}])
                outcomes.answered.append(time.monotonic() - start)
                outcomes.per_request.append((index, "200", time.monotonic() - start))
            except openai.APIStatusError as error:
                seconds = time.monotonic() - start
                if error.status_code == 401 and sender is stranger:
                    outcomes.unauthorized.append(seconds)
                elif error.status_code in (429, 503):
                    outcomes.refused.append(seconds)
                    outcomes.refused_status[error.status_code] = outcomes.refused_status.get(error.status_code, 0) + 1
                else:
                    outcomes.other.append(f"HTTP {error.status_code}")
                outcomes.per_request.append((index, str(error.status_code), seconds))
            except Exception as error:  # a client timeout is a hang: counted, not raised
                outcomes.other.append(type(error).__name__)
                outcomes.per_request.append((index, type(error).__name__, time.monotonic() - start))
            if on_done is not None:
                on_done(outcomes.done)

    try:
        await asyncio.gather(*(worker() for _ in range(clients)))
    finally:
        await client.close()
        await stranger.close()
    return outcomes


def limit_env(args: argparse.Namespace) -> dict[str, str]:
    env = {}
    for option, variable in (
        ("max_requests", "HAYSTACK_FUSION_MAX_REQUESTS"),
        ("max_waiting", "HAYSTACK_FUSION_MAX_WAITING"),
        ("queue_timeout", "HAYSTACK_FUSION_QUEUE_TIMEOUT"),
    ):
        if getattr(args, option) is not None:
            env[variable] = str(getattr(args, option))
    return env


def print_latency(name: str, seconds: list[float]) -> None:
    if not seconds:
        print(f"{name:<9} none")
        return
    p50, p95, p99 = (percentile(seconds, q) * 1000 for q in (50, 95, 99))
    print(f"{name:<9} p50 {p50:.0f} ms, p95 {p95:.0f} ms, p99 {p99:.0f} ms, max {max(seconds) * 1000:.0f} ms")


def run_openai(args: argparse.Namespace, workdir: Path) -> None:
    index = workdir / "index.json"
    save_store(DOCUMENTS, index)
    lifetime = 60 + args.requests * args.latency * 2
    with OpenAIServer(reply="Paris", latency=args.latency, max_requests=args.requests * 10, lifetime=lifetime) as llm:
        env = {
            "HAYSTACK_FUSION_LLM": "openai",
            "OPENAI_API_KEY": "unused-by-the-test-server",
            "OPENAI_BASE_URL": llm.base_url,
            "HAYSTACK_FUSION_DOCUMENT_STORE": "memory",
            "HAYSTACK_FUSION_STORE": str(index),
            **limit_env(args),
        }
        key = {"api_key": API_KEY, "unauthenticated_every": args.unauthenticated_every}
        if args.unauthenticated_every:
            env["HAYSTACK_FUSION_API_KEY"] = API_KEY
        with HayhooksProcess(["concat_pf"], env=env, workdir=workdir) as hayhooks:
            rss_start = hayhooks.rss_bytes()
            warmup = asyncio.run(
                drive(hayhooks.url, "concat_pf", [QUESTION] * args.warmup, 10, args.client_timeout, **key)
            )
            rss_warm = hayhooks.rss_bytes()
            llm.reset()
            with RssSampler(hayhooks) as sampler:
                sampler.mark(0)

                def on_done(done: int) -> None:
                    if done % 100 == 0:
                        sampler.mark(done)

                start = time.monotonic()
                outcomes = asyncio.run(
                    drive(
                        hayhooks.url,
                        "concat_pf",
                        [QUESTION] * args.requests,
                        args.clients,
                        args.client_timeout,
                        on_done,
                        **key,
                    )
                )
                wall = time.monotonic() - start
            time.sleep(1.0)
            rss_end = hayhooks.rss_bytes()
            stats = llm.stats
            log = hayhooks.log()

    print(
        f"concat_pf on haystack-fusion serve, OpenAI backend = the test server, {args.latency * 1000:.0f} ms per call"
    )
    limits = limit_env(args) or {"(defaults)": "HAYSTACK_FUSION_MAX_REQUESTS 32, MAX_WAITING 64, QUEUE_TIMEOUT 30"}
    print("limits   ", ", ".join(f"{key}={value}" for key, value in limits.items()))
    print(f"warm-up   {args.warmup} requests ({len(warmup.answered)} answered) before measuring")
    print(f"requests  {args.requests} from {args.clients} concurrent clients in {wall:.1f} s")
    print(f"answered  {len(outcomes.answered)}")
    refused = ", ".join(f"HTTP {status}: {count}" for status, count in sorted(outcomes.refused_status.items()))
    print(f"refused   {len(outcomes.refused)}" + (f" ({refused})" if refused else ""))
    if args.unauthenticated_every:
        print(f"401       {len(outcomes.unauthorized)} (every {args.unauthenticated_every}th request, a wrong key)")
    print(f"other     {len(outcomes.other)}" + (f" {sorted(set(outcomes.other))}" if outcomes.other else ""))
    print_latency("answered", outcomes.answered)
    print_latency("refused", outcomes.refused)
    print(f"LLM server: {stats.requests} calls, at most {stats.max_in_flight} at once")
    print(
        f"RSS       after startup {rss_start / MB:.1f} MB, after warm-up {rss_warm / MB:.1f} MB, "
        f"after the run {rss_end / MB:.1f} MB; sampled {len(sampler.samples)} times during it: "
        f"min {min(sampler.samples) / MB:.1f}, max {max(sampler.samples) / MB:.1f} MB"
    )
    print("RSS marks", ", ".join(f"{done}: {rss / MB:.1f}" for done, rss in sampler.marks), "(requests done: MB)")
    later = [mark for mark in sampler.marks if mark[0] >= 200]
    print(f"RSS trend {slope_mb_per_100(later):+.2f} MB per 100 requests (least squares over the marks from 200 on)")
    print(f"server log: {log.count('Traceback')} tracebacks, {log.count('HTTP 503 server_busy')} refusals logged")


def run_embedded(args: argparse.Namespace, workdir: Path) -> None:
    from haystack_fusion.corpus import default_squad_path, load_squad
    from haystack_fusion.settings import SQUAD_VARIABLE

    if not os.environ.get(SQUAD_VARIABLE):
        sys.exit(f"set ${SQUAD_VARIABLE} to the SQuAD 2.0 dev subset: {SUBSET}")
    path = default_squad_path()
    documents, questions = load_squad(path)
    index = workdir / "index.json"
    save_store(documents, index)
    env = {
        "HAYSTACK_FUSION_LLM": "local",
        "HAYSTACK_FUSION_DOCUMENT_STORE": "memory",
        "HAYSTACK_FUSION_STORE": str(index),
        **limit_env(args),
    }
    asked = [question.question for question in questions[: args.clients]]
    with HayhooksProcess(["concat_pf"], env=env, workdir=workdir, startup_seconds=600) as hayhooks:
        start = time.monotonic()
        outcomes = asyncio.run(drive(hayhooks.url, "concat_pf", asked, args.clients, args.client_timeout))
        wall = time.monotonic() - start
        log = hayhooks.log()
    limits = limit_env(args) or {"(defaults)": "HAYSTACK_FUSION_MAX_REQUESTS 1, MAX_WAITING 64, QUEUE_TIMEOUT 30"}
    print("concat_pf on Hayhooks, embedded llama.cpp model, BM25 top-5 over the SQuAD 2.0 subset")
    print("limits   ", ", ".join(f"{key}={value}" for key, value in limits.items()))
    print(f"requests  {args.clients} at once (the first {args.clients} questions), all done in {wall:.1f} s")
    for index, status, seconds in sorted(outcomes.per_request, key=lambda item: item[2]):
        print(f"  request {index}: {status} after {seconds:.1f} s")
    print(f"answered  {len(outcomes.answered)}, refused {len(outcomes.refused)}, other {len(outcomes.other)}")
    print_latency("answered", outcomes.answered)
    print_latency("refused", outcomes.refused)
    print(f"server log: {log.count('Traceback')} tracebacks, {log.count('HTTP 503 server_busy')} refusals logged")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedded", action="store_true", help="the embedded model's bounded queue instead")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=None, help="concurrent clients (default 50; 6 embedded)")
    parser.add_argument("--latency", type=float, default=0.2, help="the test LLM server's seconds per call")
    parser.add_argument("--warmup", type=int, default=50, help="requests before the measured run")
    parser.add_argument("--client-timeout", type=float, default=300.0, help="seconds before a client gives up")
    parser.add_argument("--max-requests", type=int, default=None)
    parser.add_argument("--max-waiting", type=int, default=None)
    parser.add_argument("--queue-timeout", type=float, default=None)
    parser.add_argument(
        "--unauthenticated-every",
        type=int,
        default=0,
        help="set HAYSTACK_FUSION_API_KEY on the server and send every n-th request with a wrong key (0: no key)",
    )
    args = parser.parse_args()
    if args.clients is None:
        args.clients = 6 if args.embedded else 50
    with tempfile.TemporaryDirectory(prefix="load-") as workdir:
        (run_embedded if args.embedded else run_openai)(args, Path(workdir))


if __name__ == "__main__":
    main()
