"""
The one place that fans independent ChatGenerator calls out concurrently, traces them and sums their token usage.

Every component sends its independent calls (one per passage, per sample, per candidate ...) through
`run_chat_calls` / `run_chat_calls_async`; there is no second loop. Each call gets a `haystack.chat_generator.run`
tracing span (`llm.tracing`). Retries and timeouts belong to the generator (its own `max_retries` / `timeout`), so
this module never retries; the HTTP requests its calls cause, retries included, are counted where the generator's
client lets them be seen (`llm.clients`), and the async path first gives the generator an async client of the running
event loop (`llm.clients.bind_async_client`).

Concurrency: by default (`max_concurrency=None`) a fan-out starts all of its calls at once, since they are independent
and a round costs one call's latency only when none waits for a slot (DESIGN "Concurrency"). One process-wide
ceiling, `concurrency_ceiling()` (`settings.DEFAULT_CONCURRENCY_CEILING` calls, or the
`HAYSTACK_FUSION_MAX_CONCURRENCY` environment variable read at every fan-out), caps every fan-out, so one wide round
(k = 100 passages; K = 10 candidates' 10 + 90 verification calls) never has more requests open at once than that; a
component's `max_concurrency` sets a lower bound of its own. The ceiling bounds each fan-out: questions answered
concurrently (evaluation's `concurrency`) multiply it. Across them, the process-wide limit on calls in flight
(`llm.limits`) makes every call wait for one of N slots, shared by all fan-outs, threads and event loops.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import os
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from haystack import logging, tracing
from haystack.components.generators.chat.types import ChatGenerator
from haystack.dataclasses import ChatMessage

from haystack_fusion.llm.clients import bind_async_client, counting_requests, observe_requests
from haystack_fusion.llm.limits import call_slot_async, unwrap_call_limit
from haystack_fusion.llm.tracing import record_chat_call, trace_chat_call
from haystack_fusion.llm.usage import empty_usage, reply_usage, sum_usage
from haystack_fusion.settings import concurrency_ceiling_from_env

logger = logging.getLogger(__name__)

T = TypeVar("T")

WORKER_THREADS = 256
"""Most worker threads the process keeps for generators' blocking `run` calls (`worker_pool`), shared by all
fan-outs; more when the ceiling is set higher. Threads start on demand and stay for the next fan-out."""

_POOL_LOCK = threading.Lock()
_POOL: concurrent.futures.ThreadPoolExecutor | None = None
_POOL_WORKERS = 0
_POOL_PID = 0


def worker_pool(limit: int) -> concurrent.futures.ThreadPoolExecutor:
    """
    The process's worker threads for the sync path, kept between fan-outs.

    Starting a thread per call costs about 1 ms on a busy machine, and a fan-out of k calls started them one
    after another, so the last call began k ms late; kept threads take the next fan-out's calls at once. Each
    fan-out still bounds its own calls under way (its semaphore); the pool only has to hold them all: it has
    max(`WORKER_THREADS`, `limit`) threads at most, and is replaced by a larger one when a fan-out needs more
    (the old one finishes its calls and lets its threads go). A forked child process gets a pool of its own.

    :param limit: The calls the fan-out may have under way at once.
    :returns: A ThreadPoolExecutor with at least `limit` workers.
    """
    global _POOL, _POOL_WORKERS, _POOL_PID
    pid = os.getpid()
    with _POOL_LOCK:
        inherited = pid != _POOL_PID  # a pool made before a fork has no threads in this process
        if _POOL is None or inherited or limit > _POOL_WORKERS:
            if _POOL is not None and not inherited:
                _POOL.shutdown(wait=False)
            _POOL_WORKERS = max(WORKER_THREADS, limit)
            _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=_POOL_WORKERS, thread_name_prefix="llm_call")
            _POOL_PID = pid
        return _POOL


def check_max_concurrency(max_concurrency: int | None) -> int | None:
    """
    Validate a `max_concurrency` setting, as every component's constructor and the fan-out do.

    :param max_concurrency: None (all of a round's calls at once, up to `concurrency_ceiling()`) or the largest
        number of calls under way at once (an integer >= 1).
    :returns: The setting, unchanged.
    :raises ValueError: If it is not None and not an integer >= 1.
    """
    if max_concurrency is None:
        return None
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise ValueError(
            f"`max_concurrency` must be None (all calls of a round at once) or an integer >= 1, got {max_concurrency!r}"
        )
    return max_concurrency


def concurrency_ceiling() -> int:
    """
    The process-wide ceiling on calls under way at once in one fan-out, read now.

    :returns: `HAYSTACK_FUSION_MAX_CONCURRENCY` when set (calls), else `settings.DEFAULT_CONCURRENCY_CEILING`.
    :raises ValueError: If the environment variable is set to anything but an integer >= 1.
    """
    return concurrency_ceiling_from_env()


def concurrency_limit(max_concurrency: int | None, calls: int) -> int:
    """
    How many of a round's calls may be under way at once.

    :param max_concurrency: The component's setting: None (no bound of its own) or an integer >= 1.
    :param calls: The number of calls in the round (>= 0).
    :returns: min(calls, `concurrency_ceiling()`, `max_concurrency`), at least 1.
    :raises ValueError: If `max_concurrency` or the environment's ceiling is invalid (see `check_max_concurrency`,
        `concurrency_ceiling`).
    """
    own = check_max_concurrency(max_concurrency)
    bound = concurrency_ceiling() if own is None else min(own, concurrency_ceiling())
    return max(1, min(calls, bound))


@dataclass
class FanOutResult:
    """
    What a fan-out of n independent calls returned, in input order.

    :param replies: n entries: the first reply of each call, or None where the call failed or returned no reply.
    :param errors: n entries: None, or `"ExceptionType: message"` for a failed call.
    :param usage: Summed usage: `prompt_tokens`, `completion_tokens` (tokens), `calls` (attempted calls) and
        `failed_calls`, plus `http_requests` (requests the calls sent, retries included, failed calls' too) when the
        generator's client is httpx-based (Haystack's OpenAI generators, ollama-haystack; `llm.clients`),
        `cached_tokens` (prompt tokens served from the provider's prefix cache, summed over the replies that report
        them; absent when none does), and `truncated` (calls whose reply the token cap cut, `reply_truncated`;
        absent when none was).
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
    max_concurrency: int | None = None,
    generation_kwargs: dict[str, Any] | None = None,
    raise_on_failure: bool = False,
    raise_if: Callable[[Exception], bool] | None = None,
    use_run_async: bool = True,
) -> FanOutResult:
    """
    Run one ChatGenerator call per prompt concurrently, each in its own span: all at once by default, at most
    `concurrency_limit(max_concurrency, n)` at a time (the process-wide `concurrency_ceiling()`, or the lower
    `max_concurrency`).

    Uses the generator's `run_async` when it has one (and `use_run_async`), otherwise its `run` in worker threads.
    Before the `run_async` calls, the generator's async client is made one of the running event loop
    (`llm.clients.bind_async_client`), so a new event loop per question costs no failed or repeated requests.
    A call that raises, or returns no reply, is recorded in `errors` (and logged) while the other calls go on,
    unless `raise_on_failure`: then the first failure cancels the other calls (a call waiting for its turn never
    starts; a `run_async` under way is cancelled; a `run` under way in a thread cannot be interrupted, runs to its
    end and is discarded) and is re-raised.

    Every call runs inside a `haystack.chat_generator.run` span (`trace_chat_call`), a child of the span that is
    current when this is called (the component's, inside a pipeline), with the call's token counts as tags.

    :param chat_generator: Any Haystack ChatGenerator.
    :param prompts: n prompts, each a list of ChatMessage.
    :param max_concurrency: None (default): all n calls at once, up to `concurrency_ceiling()`; an integer >= 1:
        at most that many calls under way at once (never more than the ceiling).
    :param generation_kwargs: Passed to every call as `generation_kwargs` when given (e.g. a sampling temperature).
    :param raise_on_failure: Cancel the other calls and re-raise the first failure instead of recording it.
    :param raise_if: Treat a failure for which `raise_if(error)` is true as `raise_on_failure` does, and record the
        others (e.g. `llm.clients.backend_unusable`: a refused connection or key is raised, a timeout recorded).
    :param use_run_async: False calls the generator's `run` in worker threads even when it has `run_async`.
    :returns: A `FanOutResult` with n replies and n errors in input order.
    :raises ValueError: If `max_concurrency` is not None or an integer >= 1, or `HAYSTACK_FUSION_MAX_CONCURRENCY`
        is set to anything but an integer >= 1.
    :raises RuntimeError: On the `run_async` path, if the generator's async client is in use on another event loop
        that is still running (`llm.clients.bind_async_client` says what to do).
    :raises Exception: With `raise_on_failure` (or `raise_if` true for it), the first failure as the generator raised
        it (`RuntimeError` for a call that returned no reply).
    """
    # The fan-out holds a slot for each call itself, so it calls a call-limited generator's own generator.
    chat_generator = unwrap_call_limit(chat_generator)
    limit = concurrency_limit(max_concurrency, len(prompts))
    semaphore = asyncio.Semaphore(limit)
    in_flight = 0
    max_in_flight = 0
    extra = {"generation_kwargs": generation_kwargs} if generation_kwargs else {}
    run_async = getattr(chat_generator, "run_async", None) if use_run_async else None
    # The process's kept threads, at least `limit` of them: the loop's default pool may have fewer than that.
    pool = None if run_async is not None else worker_pool(limit)
    observed = False
    if prompts:
        if run_async is not None:
            await bind_async_client(chat_generator)  # its async client must belong to this loop
        observed = observe_requests(chat_generator, async_client=run_async is not None)
    requests = [0] * len(prompts)
    loop = asyncio.get_running_loop()
    parent_span = tracing.tracer.current_span()
    tasks: list[asyncio.Task[tuple[ChatMessage | None, str | None]]] = []
    first_failure: Exception | None = None

    async def call(index: int, messages: list[ChatMessage]) -> tuple[ChatMessage | None, str | None]:
        nonlocal in_flight, max_in_flight, first_failure
        async with semaphore, call_slot_async():  # this fan-out's turn, then one of the process's slots
            in_flight += 1
            max_in_flight = max(max_in_flight, in_flight)
            # The HTTP requests this call causes, retries included, counted by the client's hook in this context.
            with counting_requests() as counter:
                try:
                    with trace_chat_call(chat_generator, {"messages": messages, **extra}, parent_span) as span:
                        if run_async is not None:
                            result = await run_async(messages=messages, **extra)
                        else:
                            run = functools.partial(chat_generator.run, messages=messages, **extra)
                            # The thread runs in a copy of this task's context: spans the generator opens nest
                            # here, and its requests count into this call's counter.
                            result = await loop.run_in_executor(pool, contextvars.copy_context().run, run)
                        record_chat_call(span, result)
                        replies = result.get("replies") or []
                        if not replies:
                            raise RuntimeError("the chat generator returned no reply")
                    return replies[0], None
                except Exception as error:
                    if raise_on_failure or (raise_if is not None and raise_if(error)):
                        # Cancel the other calls before this slot frees: a call waiting for its turn never starts.
                        first_failure = first_failure or error
                        for task in tasks:
                            if task is not asyncio.current_task():
                                task.cancel()
                    else:
                        logger.warning("An LLM call failed and counts as an abstention: {error}", error=error)
                    return None, f"{type(error).__name__}: {error}"
                finally:
                    requests[index] = counter[0]
                    in_flight -= 1

    start = time.perf_counter()
    # The task group waits for cancelled calls to unwind too, so none outlives the fan-out (a cancelled call that
    # had not started in its thread never starts: asyncio cancels its executor future).
    async with asyncio.TaskGroup() as group:
        tasks.extend(group.create_task(call(index, messages)) for index, messages in enumerate(prompts))
    if first_failure is not None:
        raise first_failure
    outcomes = [task.result() for task in tasks]
    replies = [reply for reply, _ in outcomes]
    errors = [error for _, error in outcomes]
    usage = sum_usage(reply_usage(reply) for reply in replies)
    usage["calls"] = len(prompts)
    usage["failed_calls"] = sum(error is not None for error in errors)
    if observed:
        usage["http_requests"] = sum(requests)
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
    max_concurrency: int | None = None,
    generation_kwargs: dict[str, Any] | None = None,
    raise_on_failure: bool = False,
    raise_if: Callable[[Exception], bool] | None = None,
) -> FanOutResult:
    """
    Synchronous form of `run_chat_calls_async`, with the same parameters, result and errors.

    It calls the generator's synchronous `run` in the process's kept worker threads (`worker_pool`), coordinated on
    a private event loop (in a worker thread when the calling thread already runs one, so it works inside Jupyter,
    Hayhooks and AsyncPipeline too). It never uses the generator's `run_async`: async clients such as OpenAI's are
    bound to the event loop they first ran on, and this private loop is closed after each fan-out. The private loop
    and the worker threads run in copies of the caller's context (`contextvars`), so the calls' spans are children
    of the caller's span. With `raise_on_failure`, calls not yet started when one fails never start; calls under way in
    threads run to their end, unobserved.
    """
    return run_sync(
        run_chat_calls_async(
            chat_generator,
            prompts,
            max_concurrency=max_concurrency,
            generation_kwargs=generation_kwargs,
            raise_on_failure=raise_on_failure,
            raise_if=raise_if,
            use_run_async=False,
        )
    )


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from synchronous code, whether or not this thread already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    context = contextvars.copy_context()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(context.run, asyncio.run, coroutine).result()
