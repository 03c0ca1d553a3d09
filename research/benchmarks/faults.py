"""
Benchmark: faults in a batch (issue 15 item 2). The real `haystack-fusion eval --llm openai` against the
fault-injecting test server, and a 429 storm.

The script starts `tests.support.openai_server` on 127.0.0.1 in a thread (replies shaped by each prompt,
`PromptReplies`) and runs the CLI as a child process, in-memory BM25 over the SQuAD 2.0 dev subset that
`$HAYSTACK_FUSION_SQUAD` names (`SUBSET`):

1. The batch: `eval` over `--questions` questions (a stratified sample, `--sample`) for concat_pf, sure,
   chain_of_note and cascade, with `--fault-rate` of the requests given an injected fault (429 with Retry-After, 500,
   a connection reset, a response that never ends, malformed JSON, a garbage or an empty completion; seeded), and
   `--max-retries` / `--timeout` set. It prints the questions, the records written (one per question and strategy),
   the answered and failed counts and what failed, the server's requests against its calls (first attempts) x
   (1 + max_retries), the faults by kind, the slowest question against the worst case the timeouts allow, and the
   wall time.
2. The same command again, on the same server (whose next fault draws differ), until no record has failed (at most
   `--reruns` times): each re-run's records must be exactly the failed ones.
3. The 429 storm: a server that takes `--capacity` requests at once and answers 429 with Retry-After beyond (no other
   fault), `eval --strategies concat_pf` with every concatenation answering "unknown" (so each question fans out k
   post-fusion calls) and `--parallel-questions` questions at once; without `--max-calls-in-flight`, then with it set
   to the capacity; and, for comparison, the same run against a server without a capacity limit (no storm). It prints
   the 429s, the failed records and the wall time of each.

Run: `.venv/bin/python -m research.benchmarks.faults [--questions 200] [--fault-rate 0.2] [--max-retries 2]
[--timeout 2]`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack_fusion.corpus import default_squad_path
from haystack_fusion.settings import SQUAD_VARIABLE
from haystack_fusion.testing import PromptReplies
from tests.support.openai_server import OpenAIServer

SUBSET = "../shared/data/squad2-dev-subset/squad2_dev_subset.json"
"""The file `$HAYSTACK_FUSION_SQUAD` names for this benchmark: the SQuAD 2.0 dev subset its numbers are made on."""
STRATEGIES = "concat_pf,sure,chain_of_note,cascade"
CLI = str(Path(sys.executable).with_name("haystack-fusion"))


def run_eval(server: OpenAIServer, out: Path, args: argparse.Namespace, strategies: str, questions: int,
             extra: list[str]) -> tuple[list[str], int, float, str]:  # fmt: skip
    """Run the CLI once; returns the command (server URL as PORT), its exit status, wall seconds, last stderr line."""
    command = ["eval", "--llm", "openai", "--api-base-url", server.base_url, "--model", "test-model"]
    command += ["--max-retries", str(args.max_retries), "--timeout", str(args.timeout)]
    command += ["--dataset", str(args.dataset), "--sample", str(questions), "--strategies", strategies]
    command += ["--out", str(out), *extra]
    start = time.perf_counter()
    done = subprocess.run(
        [CLI, *command], env={**os.environ, "OPENAI_API_KEY": "test-key"}, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - start
    last = [line for line in done.stderr.splitlines() if line.startswith("haystack-fusion:")]
    shown = [part.replace(server.base_url, "http://127.0.0.1:PORT/v1") for part in ["haystack-fusion", *command]]
    shown = [str(Path(part).name) if part == str(out) else part for part in shown]
    return shown, done.returncode, seconds, (last[-1] if last else "")


def read_lines(out: Path) -> list[dict[str, Any]]:
    path = out / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def key(line: dict[str, Any]) -> tuple[str, int, str, str]:
    return (line["strategy"], line["top_k"], line["setting"], line["question_id"])


def failure_kind(error: str) -> str:
    """What failed, in a few words: whether the pipeline raised or a call failed, and the first exception's type."""
    if error.startswith("component "):  # "component 'llm' (OpenAIChatGenerator) failed: JSONDecodeError: ..."
        return f"pipeline raised: {error.split('failed: ', 1)[1].split(':', 1)[0]}"
    first = error.split("LLM calls failed: ", 1)[-1]  # "voter (index 2): APITimeoutError: ..."
    return f"a call failed: {first.split(': ')[1] if ': ' in first else first}"


def describe_batch(lines: list[dict[str, Any]], stats: dict[str, Any], args: argparse.Namespace, seconds: float,
                   strategies: list[str]) -> None:  # fmt: skip
    keys = Counter(key(line) for line in lines)
    failed = [line for line in lines if "error" in line]
    questions = {line["question_id"] for line in lines}
    print(f"questions: {len(questions)}; strategies: {len(strategies)} ({', '.join(strategies)})")
    print(f"records: {len(lines)} lines, {len(keys)} (strategy, question) keys, each once: {max(keys.values()) == 1}")
    print(f"answered: {len(lines) - len(failed)}; failed: {len(failed)}")
    for strategy in strategies:
        mine = [line for line in lines if line["strategy"] == strategy]
        bad = [line for line in mine if "error" in line]
        kinds = Counter(failure_kind(line["error"]) for line in bad)
        print(f"  {strategy}: {len(mine) - len(bad)} answered, {len(bad)} failed {dict(kinds) if kinds else ''}")
    bound = stats["first_attempts"] * (1 + args.max_retries)
    print(
        f"server requests: {stats['requests']} <= calls {stats['first_attempts']} x (1 + {args.max_retries}) = "
        f"{bound}: {stats['requests'] <= bound}; retries {stats['retries']}, highest retry count "
        f"{stats['max_retry_count']}"
    )
    print(f"faults injected: {sum(stats['faults'].values())} {stats['faults']}")
    slowest = max((line["score"]["seconds"] for line in lines if "error" not in line), default=0.0)
    # one call: (1 + N) attempts of at most `timeout`, N waits of at most max(Retry-After, the client's 0.5 x 2^i)
    call = (1 + args.max_retries) * args.timeout + sum(
        max(args.retry_after, 0.5 * 2**i) for i in range(args.max_retries)
    )
    print(
        f"slowest answered question: {slowest:.1f} s; one call's worst case (1 + N) x timeout + waits = {call:.1f} s, "
        f"x 4 dependent rounds at most (cascade) = {4 * call:.1f} s"
    )
    print(f"wall time: {seconds:.1f} s")


def batch(args: argparse.Namespace, work: Path) -> None:
    print(f"## The batch: {args.fault_rate:.0%} injected faults\n")
    out = work / "faults"
    strategies = args.strategies.split(",")
    lifetime = 3 * 3600
    with OpenAIServer(
        reply=PromptReplies(seed=args.seed),
        fault_rate=args.fault_rate,
        seed=args.seed,
        retry_after=args.retry_after,
        hang_seconds=4 * args.timeout,
        max_requests=1_000_000,
        lifetime=lifetime,
    ) as server:
        command, status, seconds, last = run_eval(server, out, args, args.strategies, args.questions, [])
        print(f"command: `{' '.join(command)}` (exit status {status})")
        lines = read_lines(out)
        describe_batch(lines, server.stats.snapshot(), args, seconds, strategies)
        if last:
            print(f"last message: {last[:300]}")
        failed = {key(line) for line in lines if "error" in line}
        for rerun in range(1, args.reruns + 1):
            if not failed:
                break
            server.reset()
            before = len(lines)
            _, status, seconds, last = run_eval(server, out, args, args.strategies, args.questions, [])
            lines = read_lines(out)
            appended = lines[before:]
            asked = Counter(key(line) for line in appended)
            still = {key(line) for line in appended if "error" in line}
            stats = server.stats.snapshot()
            print(
                f"\nre-run {rerun} (the same command; exit status {status}): {len(appended)} records appended, for "
                f"exactly the {len(failed)} failed keys: {set(asked) == failed and max(asked.values()) == 1}; "
                f"answered {len(appended) - len(still)}, failed {len(still)}; server requests {stats['requests']} "
                f"(calls {stats['first_attempts']}); wall time {seconds:.1f} s"
            )
            failed = still
        print(f"\nquestions without a clean record at the end: {len(failed)}")


def storm(args: argparse.Namespace, work: Path) -> None:
    print(
        f"\n## The 429 storm: a server that takes {args.capacity} requests at once, concat_pf falling back to "
        f"post-fusion on every question, --parallel-questions {args.parallel_questions}\n"
    )
    for capacity, limit in ((None, None), (args.capacity, None), (args.capacity, args.capacity)):
        with OpenAIServer(
            reply=PromptReplies(concatenation_unknown=1.0, seed=args.seed),
            latency=args.latency,
            capacity=capacity,
            retry_after=args.retry_after,
            max_requests=1_000_000,
            lifetime=3600,
        ) as server:
            extra = ["--parallel-questions", str(args.parallel_questions)]
            extra += ["--max-calls-in-flight", str(limit)] if limit else []
            out = work / f"storm-{capacity or 'none'}-{limit or 'none'}"
            command, status, seconds, _ = run_eval(server, out, args, "concat_pf", args.storm_questions, extra)
            lines = read_lines(out)
            stats = server.stats.snapshot()
            failed = sum("error" in line for line in lines)
            server_kind = f"capacity {capacity}" if capacity else "no capacity limit (no storm)"
            print(
                f"- {server_kind}, `{' '.join(command)}`: exit status {status}; records {len(lines)}, "
                f"answered {len(lines) - failed}, "
                f"failed {failed}; 429s {stats['throttled']}; server requests {stats['requests']} (calls "
                f"{stats['first_attempts']}), at most {stats['max_in_flight']} at once; wall time {seconds:.1f} s"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--strategies", default=STRATEGIES)
    parser.add_argument("--fault-rate", type=float, default=0.2)
    parser.add_argument("--max-retries", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=2.0, help="the client's timeout per request, seconds")
    parser.add_argument("--retry-after", type=float, default=0.5, help="the 429s' Retry-After, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reruns", type=int, default=3)
    parser.add_argument("--capacity", type=int, default=4, help="the storm server's requests at once")
    parser.add_argument("--parallel-questions", type=int, default=8, help="the storm run's questions at once")
    parser.add_argument("--latency", type=float, default=0.2, help="the storm server's seconds per request")
    parser.add_argument("--storm-questions", type=int, default=40)
    parser.add_argument("--skip-batch", action="store_true")
    parser.add_argument("--skip-storm", action="store_true")
    parser.add_argument("--work", help="folder for the runs' records (default: a temporary one)")
    args = parser.parse_args()
    if not os.environ.get(SQUAD_VARIABLE):
        sys.exit(f"set ${SQUAD_VARIABLE} to the SQuAD 2.0 dev subset: {SUBSET}")
    args.dataset = default_squad_path()
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(args.work or temporary)
        work.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        subprocess.run([CLI, "strategies"], capture_output=True, check=True)
        print(
            f"(the CLI's start-up on this machine, `haystack-fusion strategies`: {time.perf_counter() - start:.1f} s)\n"
        )
        if not args.skip_batch:
            batch(args, work)
        if not args.skip_storm:
            storm(args, work)


if __name__ == "__main__":
    main()
