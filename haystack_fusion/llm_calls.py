"""
The one place that fans independent ChatGenerator calls out concurrently and sums their token usage.

Every component sends its independent calls (one per passage, per sample, per candidate ...) through
`run_chat_calls` / `run_chat_calls_async`; there is no second loop. Retries and timeouts belong to the generator
(its own `max_retries` / `timeout`), so this module never retries.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import time
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from haystack import logging
from haystack.components.generators.chat.types import ChatGenerator
from haystack.dataclasses import ChatMessage

logger = logging.getLogger(__name__)

T = TypeVar("T")

USAGE_KEYS = ("prompt_tokens", "completion_tokens", "calls", "failed_calls")


def empty_usage() -> dict[str, int]:
    """A usage record with every counter at zero: prompt / completion tokens, calls made and calls failed."""
    return dict.fromkeys(USAGE_KEYS, 0)


def sum_usage(usages: Iterable[Mapping[str, Any] | None]) -> dict[str, int]:
    """
    Add usage records key by key.

    :param usages: Records with any of `prompt_tokens`, `completion_tokens`, `calls`, `failed_calls` (and `rounds`,
        summed too when present); None entries are skipped.
    :returns: A dict with every key of `USAGE_KEYS` (counts of tokens and calls), plus `rounds` when any input had it.
    """
    total = empty_usage()
    for usage in usages:
        for key, value in (usage or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + int(value)
    return total


def reply_usage(reply: ChatMessage | None) -> dict[str, int]:
    """
    The token usage of one reply, read from `reply.meta["usage"]` as OpenAI-style generators report it.

    :param reply: A generator reply, or None for a failed call.
    :returns: `prompt_tokens` and `completion_tokens` (0 when the generator reported none) and `calls` = 1, plus
        `cached_calls` = 1 for a reply the embedded model's reply cache gave (`meta["cached"]`): it still counts the
        tokens of the call it stands for.
    """
    usage = (reply.meta.get("usage") if reply is not None else None) or {}
    counted = {
        "prompt_tokens": int(usage.get("prompt_tokens") or 0),
        "completion_tokens": int(usage.get("completion_tokens") or 0),
        "calls": 1,
        "failed_calls": 0,
    }
    if reply is not None and reply.meta.get("cached"):
        counted["cached_calls"] = 1
    return counted


@dataclass
class FanOutResult:
    """
    What a fan-out of n independent calls returned, in input order.

    :param replies: n entries: the first reply of each call, or None where the call failed or returned no reply.
    :param errors: n entries: None, or `"ExceptionType: message"` for a failed call.
    :param usage: Summed usage: `prompt_tokens`, `completion_tokens` (tokens), `calls` (attempted calls) and
        `failed_calls`.
    :param max_in_flight: The largest number of calls that were under way at once.
    :param seconds: Wall-clock time of the whole fan-out, in seconds.
    """

    replies: list[ChatMessage | None]
    errors: list[str | None]
    usage: dict[str, int] = field(default_factory=empty_usage)
    max_in_flight: int = 0
    seconds: float = 0.0

    @property
    def failures(self) -> list[dict[str, Any]]:
        """The failed calls as `{"index": i, "error": "..."}` dicts, ready for an answer's `meta`."""
        return [{"index": i, "error": error} for i, error in enumerate(self.errors) if error is not None]


async def run_chat_calls_async(
    chat_generator: ChatGenerator,
    prompts: list[list[ChatMessage]],
    *,
    max_concurrency: int,
    generation_kwargs: dict[str, Any] | None = None,
    raise_on_failure: bool = False,
    use_run_async: bool = True,
) -> FanOutResult:
    """
    Run one ChatGenerator call per prompt concurrently, at most `max_concurrency` at a time.

    Uses the generator's `run_async` when it has one (and `use_run_async`), otherwise its `run` in worker threads.
    A call that raises, or returns no reply, is recorded in `errors` (and logged) while the other calls go on,
    unless `raise_on_failure`.

    :param chat_generator: Any Haystack ChatGenerator.
    :param prompts: n prompts, each a list of ChatMessage.
    :param max_concurrency: Upper bound on calls under way at once (>= 1).
    :param generation_kwargs: Passed to every call as `generation_kwargs` when given (e.g. a sampling temperature).
    :param raise_on_failure: Re-raise the first failure instead of recording it.
    :param use_run_async: False calls the generator's `run` in worker threads even when it has `run_async`.
    :returns: A `FanOutResult` with n replies and n errors in input order.
    :raises ValueError: If `max_concurrency` < 1.
    """
    if max_concurrency < 1:
        raise ValueError(f"`max_concurrency` must be at least 1, got {max_concurrency}")
    semaphore = asyncio.Semaphore(max_concurrency)
    in_flight = 0
    max_in_flight = 0
    extra = {"generation_kwargs": generation_kwargs} if generation_kwargs else {}
    run_async = getattr(chat_generator, "run_async", None) if use_run_async else None
    # A private pool of max_concurrency threads: the loop's default pool may have fewer threads than that.
    pool = None if run_async is not None else concurrent.futures.ThreadPoolExecutor(max_workers=max_concurrency)
    loop = asyncio.get_running_loop()

    async def call(messages: list[ChatMessage]) -> tuple[ChatMessage | None, str | None]:
        nonlocal in_flight, max_in_flight
        async with semaphore:
            in_flight += 1
            max_in_flight = max(max_in_flight, in_flight)
            try:
                if run_async is not None:
                    result = await run_async(messages=messages, **extra)
                else:
                    run = functools.partial(chat_generator.run, messages=messages, **extra)
                    result = await loop.run_in_executor(pool, contextvars.copy_context().run, run)
                replies = result.get("replies") or []
                if not replies:
                    raise RuntimeError("the chat generator returned no reply")
                return replies[0], None
            except Exception as error:
                if raise_on_failure:
                    raise
                logger.warning("An LLM call failed and counts as an abstention: {error}", error=error)
                return None, f"{type(error).__name__}: {error}"
            finally:
                in_flight -= 1

    start = time.perf_counter()
    try:
        outcomes = await asyncio.gather(*(call(messages) for messages in prompts))
    finally:
        if pool is not None:
            pool.shutdown(wait=False)
    replies = [reply for reply, _ in outcomes]
    errors = [error for _, error in outcomes]
    usage = sum_usage(reply_usage(reply) for reply in replies)
    usage["calls"] = len(prompts)
    usage["failed_calls"] = sum(error is not None for error in errors)
    return FanOutResult(
        replies=replies,
        errors=errors,
        usage=usage,
        max_in_flight=max_in_flight,
        seconds=time.perf_counter() - start,
    )


def run_chat_calls(
    chat_generator: ChatGenerator,
    prompts: list[list[ChatMessage]],
    *,
    max_concurrency: int,
    generation_kwargs: dict[str, Any] | None = None,
    raise_on_failure: bool = False,
) -> FanOutResult:
    """
    Synchronous form of `run_chat_calls_async`, with the same parameters, result and errors.

    It calls the generator's synchronous `run` in `max_concurrency` worker threads, coordinated on a private event
    loop (in a worker thread when the calling thread already runs one, so it works inside Jupyter, Hayhooks and
    AsyncPipeline too). It never uses the generator's `run_async`: async clients such as OpenAI's are bound to the
    event loop they first ran on, and this private loop is closed after each fan-out.
    """
    return run_sync(
        run_chat_calls_async(
            chat_generator,
            prompts,
            max_concurrency=max_concurrency,
            generation_kwargs=generation_kwargs,
            raise_on_failure=raise_on_failure,
            use_run_async=False,
        )
    )


def supports_logprobs(chat_generator: Any) -> bool:
    """
    Whether this generator returns token log-probabilities when asked: the embedded model (a LlamaCppChatGenerator
    subclass, which reads them at no memory cost), or a generator whose own `generation_kwargs` already ask for them
    (OpenAIChatGenerator made with `logprobs=True`, `--logprobs` on the command line). An OpenAI-compatible server
    is not asked unless told to: not every server returns them (llama.cpp's needs `logits_all`, whose memory grows
    with the context times the vocabulary) and one that refuses fails the call. ollama-haystack returns none (7.x).
    """
    if any(cls.__name__ == "LlamaCppChatGenerator" for cls in type(chat_generator).__mro__):
        return True
    return bool((getattr(chat_generator, "generation_kwargs", None) or {}).get("logprobs"))


def logprob_kwargs(chat_generator: Any, top_logprobs: int = 0) -> dict[str, Any]:
    """
    The `generation_kwargs` that ask this generator for token log-probabilities, or {} when it is not to be asked.

    :param chat_generator: Any ChatGenerator.
    :param top_logprobs: Alternatives per token to return as well (0: none; OpenAI allows up to 20).
    :returns: `{"logprobs": True}` (plus `"top_logprobs": n` when n > 0) for `supports_logprobs` generators, else {}.
    """
    if not supports_logprobs(chat_generator):
        return {}
    return {"logprobs": True, **({"top_logprobs": top_logprobs} if top_logprobs > 0 else {})}


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from synchronous code, whether or not this thread already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    context = contextvars.copy_context()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(context.run, asyncio.run, coroutine).result()
