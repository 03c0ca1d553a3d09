"""
Every parser of model output on hypothesis-generated replies, and how its time grows with the size of a reply.

Usage: `.venv/bin/python -m research.benchmarks.fuzz_parsers [--examples 10000]`

The parsers and the reply strategies are those of the unit tests (`tests.support.fuzzing`: `PARSERS`,
`replies`): arbitrary and hostile Unicode, the prompts' vocabulary with nested and unbalanced markers. One set of
`--examples` replies is drawn once and given to every parser; the script counts exceptions and wrong shapes and keeps
the slowest reply. Scaling: each parser runs on adversarial repetitions ("a" + " " * n + "b", "(a) " * n, "*" * n + "x",
...) of n, 2n, 4n and 8n characters; the ratio t(8n) / t(n) of the worst family is about 8 for linear time and about 64
for quadratic time (regular-expression backtracking); garbage collection is paused while timing. Families are measured
until a parser has used `--budget` seconds; the worst family is then measured again from `--large-n` (up to 1.28M
characters; its time at 8 x `--large-n` characters is printed too: the slowest input of the run) unless its ratio is
above 30 (then that would take hours). Figures, not a test: one run on the machine at hand.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings

from tests.support.fuzzing import PARSERS, replies

FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("", " ", "x"),
    ("a", " ", "b"),
    ("", "\n", "x"),
    ("Passage", "\n", ""),
    ("x", ".", ""),
    ("", ".", "x"),
    ("", "*", "x"),
    ("", "_", "x"),
    ("x", ",'", ""),
    ("", "a", "!"),
    ("", "a ", ""),
    ("Passage", " ", "x"),
    ("Answer", " ", "x"),
    ("(a)", " ", "x"),
    ("x\nquestion", " ", "x"),
    ("based on x,", " ", "y"),
    ("", "(a) ", ""),
    ("", "1. ", ""),
    ("", "Passage ", ""),
    ("", "<passage key=", ""),
    ("", "Answer: ", ""),
    ("", "the answer is ", ""),
    ("", "Choices: [", ""),
)
"""(head, unit, tail): the reply is head + unit repeated to the size + tail."""


def family_reply(family: tuple[str, str, str], characters: int) -> str:
    head, unit, tail = family
    return head + unit * (characters // len(unit)) + tail


def best_time(call: Callable[[Any], Any], reply: Any, budget: float = 0.2) -> float:
    """
    The fastest of a few runs (at least one, more while they fit in `budget` seconds): noise only adds time. Garbage
    collection is paused while timing: its pauses depend on what else lives in the process, not on the parser.
    """
    best = float("inf")
    spent = 0.0
    for _ in range(5):
        gc.disable()
        start = time.perf_counter()
        try:
            call(reply)
        finally:
            elapsed = time.perf_counter() - start
            gc.enable()
        best = min(best, elapsed)
        spent += elapsed
        if spent > budget:
            break
    return best


def draw_replies(examples: int) -> list[str]:
    drawn: list[str] = []

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(reply=replies)
    def draw(reply: str) -> None:
        drawn.append(reply)

    draw()
    return drawn


def fuzz(name: str, drawn: list[str]) -> dict[str, Any]:
    parser = PARSERS[name]
    exceptions = bad_shapes = 0
    first_error = ""
    slowest = (0.0, 0)
    for reply in drawn:
        prepared = parser.prepare(reply)
        start = time.perf_counter()
        try:
            result = parser.call(prepared)
        except Exception as error:
            exceptions += 1
            first_error = first_error or f"{type(error).__name__}: {error} on {reply[:80]!r}"
            continue
        elapsed = time.perf_counter() - start
        slowest = max(slowest, (elapsed, len(reply)))
        if not parser.check(result):
            bad_shapes += 1
            first_error = first_error or f"wrong shape {result!r:.80} on {reply[:80]!r}"
    return {"exceptions": exceptions, "bad_shapes": bad_shapes, "slowest": slowest, "first_error": first_error}


def ratio(name: str, family: tuple[str, str, str], n: int) -> tuple[float, float]:
    """t(8n) / t(n) on one family (after timing 2n and 4n too), and t(8n) in seconds."""
    parser = PARSERS[name]
    times = [best_time(parser.call, parser.prepare(family_reply(family, n * factor))) for factor in (1, 2, 4, 8)]
    return times[3] / max(times[0], 1e-6), times[3]


def scaling(name: str, n: int, budget: float) -> tuple[float, tuple[str, str, str], float]:
    """The worst t(8n) / t(n) over the families, its family, and t at 8n; stops early past `budget` seconds."""
    worst = (0.0, FAMILIES[0], 0.0)
    started = time.perf_counter()
    for family in FAMILIES:
        family_ratio, seconds = ratio(name, family, n)
        if family_ratio > worst[0]:
            worst = (family_ratio, family, seconds)
        if time.perf_counter() - started > budget:
            break
    return worst


def main() -> None:
    arguments = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    arguments.add_argument("--examples", type=int, default=10_000, help="hypothesis-generated replies per parser")
    arguments.add_argument("--n", type=int, default=5_000, help="scaling: the smallest size n, in characters")
    arguments.add_argument("--budget", type=float, default=5.0, help="scaling: seconds per parser before stopping")
    arguments.add_argument(
        "--large-n", type=int, default=160_000, help="scaling: n for the worst family again (up to 8n characters)"
    )
    arguments.add_argument("--only", nargs="*", help="parser names (default: all)")
    options = arguments.parse_args()

    started = time.perf_counter()
    drawn = draw_replies(options.examples)
    sizes = sorted(len(reply) for reply in drawn)
    print(
        f"{len(drawn)} replies drawn in {time.perf_counter() - started:.1f} s "
        f"(median {sizes[len(sizes) // 2]} characters, longest {sizes[-1]}); scaling from n = {options.n} characters\n"
    )
    print(
        f"| parser | examples | exceptions | wrong shapes | slowest example (ms, chars) | t(8n)/t(n), n = {options.n} "
        f"| worst family | same, n = {options.large_n}: t(8n)/t(n), t(8n) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    errors = []
    for name in options.only or sorted(PARSERS):
        result = fuzz(name, drawn)
        worst, family, _ = scaling(name, options.n, options.budget)
        # Small sizes are noisy (caches, allocation): the worst family again at sizes where only the algorithm
        # counts, unless it is clearly super-linear already (at 1.28M characters that would take hours).
        if worst > 30:
            large = "-"
        else:
            large_ratio, large_seconds = ratio(name, family, options.large_n)
            large = f"{large_ratio:.1f}, {large_seconds * 1000:.1f} ms"
        seconds, characters = result["slowest"]
        head, unit, tail = family
        print(
            f"| `{name}` | {len(drawn)} | {result['exceptions']} | {result['bad_shapes']} | "
            f"{seconds * 1000:.2f} ms, {characters} | {worst:.1f} | `{head!r} + {unit!r} * k + {tail!r}` | {large} |",
            flush=True,
        )
        if result["first_error"]:
            errors.append(f"{name}: {result['first_error']}")
    for error in errors:
        print(error)
    print(f"\n{time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
