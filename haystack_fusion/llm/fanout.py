"""
The one place that fans independent ChatGenerator calls out concurrently, traces them and sums their token usage.

Every component sends its independent calls (one per passage, per sample, per candidate ...) through
`run_chat_calls` / `run_chat_calls_async`; there is no second loop. Each call gets a `haystack.chat_generator.run`
tracing span, as Haystack's own components give the generator calls they make inside their `run`. Retries and
timeouts belong to the generator (its own `max_retries` / `timeout`), so this module never retries; the HTTP requests
its calls cause, retries included, are counted where the generator's client lets them be seen (`llm_clients`), and
the async path first gives the generator an async client of the running event loop (`llm_clients.bind_async_client`).

Concurrency: by default (`max_concurrency=None`) a fan-out starts all of its calls at once, since they are independent
and a round costs one call's latency only when none waits for a slot (DESIGN "Concurrency"). One process-wide
ceiling, `concurrency_ceiling()` (`DEFAULT_CONCURRENCY_CEILING` calls, or the `HAYSTACK_FUSION_MAX_CONCURRENCY`
environment variable read at every fan-out), caps every fan-out, so one wide round (k = 100 passages; K = 10
candidates' 10 + 90 verification calls) never has more requests open at once than that; a component's
`max_concurrency` sets a lower bound of its own. The ceiling bounds each fan-out: questions answered concurrently
(evaluation's `concurrency`) multiply it. Across them, one optional process-wide limit on calls in flight
(`max_calls_in_flight`, or the `HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT` environment variable) makes every call wait for
one of N slots, shared by all fan-outs, threads and event loops, and by the generators' direct calls in pipelines
(`limit_calls`): a rate-limited API's 429 storm then slows a batch down instead of failing its calls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from haystack import logging, tracing
from haystack.components.generators.chat.types import ChatGenerator
from haystack.dataclasses import ChatMessage

from haystack_fusion.llm_clients import bind_async_client, counting_requests, observe_requests

logger = logging.getLogger(__name__)

T = TypeVar("T")

USAGE_KEYS = ("prompt_tokens", "completion_tokens", "calls", "failed_calls")

MAX_CONCURRENCY_ENV = "HAYSTACK_FUSION_MAX_CONCURRENCY"
"""The environment variable that sets the process-wide ceiling on calls under way at once in one fan-out (an integer
>= 1), read at every fan-out; unset: `DEFAULT_CONCURRENCY_CEILING`."""

DEFAULT_CONCURRENCY_CEILING = 64
"""The process-wide ceiling on calls under way at once in one fan-out when `HAYSTACK_FUSION_MAX_CONCURRENCY` is unset.
Above every round of the shipped strategies at the papers' settings, so those run at once (post-fusion's k <= 20
passages, paper 000 Figure 4; SuRe's verification round of K + K(K-1) = 25 calls at K = 5, paper 002), and low
enough that one wide round does not open hundreds of connections to a rate-limited API. Lower it with the variable
for a tight rate limit; raise it for a server that takes more."""

# The token counts of a call's span, named as OpenTelemetry's semantic conventions for generative AI name them.
INPUT_TOKENS_TAG = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS_TAG = "gen_ai.usage.output_tokens"


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

    :returns: `HAYSTACK_FUSION_MAX_CONCURRENCY` when set (calls), else `DEFAULT_CONCURRENCY_CEILING`.
    :raises ValueError: If the environment variable is set to anything but an integer >= 1.
    """
    ceiling = _positive_int_env(MAX_CONCURRENCY_ENV, "calls under way at once")
    return DEFAULT_CONCURRENCY_CEILING if ceiling is None else ceiling


def _positive_int_env(name: str, unit: str) -> int | None:
    """
    An environment variable that holds an integer >= 1, read now.

    :param name: The variable's name.
    :param unit: What the integer counts, for the error message.
    :returns: Its value, or None when it is unset or blank.
    :raises ValueError: If it is set to anything but an integer >= 1.
    """
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"`{name}` must be an integer >= 1 ({unit}), got {value!r}")
    return number


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


MAX_CALLS_IN_FLIGHT_ENV = "HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT"
"""The environment variable that sets the process-wide limit on LLM calls in flight (an integer >= 1), read at every
call; unset: no process-wide limit. `max_calls_in_flight` overrides it for a block of code."""

_LIMIT_LOCK = threading.Lock()
_LIMIT_OVERRIDE: list[int | None] = []  # the stack of `max_calls_in_flight` blocks, innermost last
_SLOTS: CallSlots | None = None
_HOLDING: contextvars.ContextVar[bool] = contextvars.ContextVar("haystack_fusion_call_slot", default=False)


class CallSlots:
    """
    N slots for LLM calls, shared by threads and event loops, handed out first come, first served.

    A thread waits on an event, a coroutine on a future of its own loop; a released slot goes straight to the longest
    waiter, so a steady stream of new calls cannot starve it.

    :param limit: The number of slots (>= 1).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.taken = 0
        self._lock = threading.Lock()
        self._waiters: deque[Callable[[], None]] = deque()

    @property
    def waiting(self) -> int:
        """Callers waiting for a slot now."""
        return len(self._waiters)

    def _take(self, wake: Callable[[], None]) -> bool:
        with self._lock:
            if self.taken < self.limit and not self._waiters:
                self.taken += 1
                return True
            self._waiters.append(wake)
            return False

    def acquire(self) -> None:
        """Take a slot, blocking this thread until one is free."""
        event = threading.Event()
        if not self._take(event.set):
            event.wait()  # `release` handed its slot over

    async def acquire_async(self) -> None:
        """Take a slot, waiting (without blocking the loop) until one is free."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def hand_over() -> None:  # in the loop: a slot handed to a waiter that was cancelled goes back
            if future.cancelled():
                self.release()
            elif not future.done():
                future.set_result(None)

        def wake() -> None:
            try:
                loop.call_soon_threadsafe(hand_over)
            except RuntimeError:  # the waiter's loop is closed: nobody takes the slot
                self.release()

        if self._take(wake):
            return
        try:
            await future
        except asyncio.CancelledError:
            with self._lock:
                waiting = wake in self._waiters
                if waiting:
                    self._waiters.remove(wake)
            if not waiting and future.done() and not future.cancelled():
                self.release()  # handed over, then cancelled before it ran: give it back
            raise

    def release(self) -> None:
        """Give a slot back: to the longest waiter if any, else to the pool."""
        with self._lock:
            wake = self._waiters.popleft() if self._waiters else None
            if wake is None:
                self.taken -= 1
        if wake is not None:
            wake()


def calls_in_flight_limit() -> int | None:
    """
    The process-wide limit on LLM calls in flight, read now.

    :returns: The innermost `max_calls_in_flight` block's limit, else `HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT` when set,
        else None (no limit).
    :raises ValueError: If the environment variable is set to anything but an integer >= 1.
    """
    with _LIMIT_LOCK:
        if _LIMIT_OVERRIDE:
            return _LIMIT_OVERRIDE[-1]
    return _positive_int_env(MAX_CALLS_IN_FLIGHT_ENV, "LLM calls in flight")


@contextlib.contextmanager
def max_calls_in_flight(limit: int | None) -> Iterator[None]:
    """
    Limit the LLM calls in flight in the whole process to `limit` while the block runs (as the evaluation runner does
    for `eval --max-calls-in-flight`); the environment's limit applies again after it.

    :param limit: An integer >= 1, or None for no limit inside the block.
    :raises ValueError: If `limit` is not None or an integer >= 1.
    """
    check_max_concurrency(limit)
    with _LIMIT_LOCK:
        _LIMIT_OVERRIDE.append(limit)
    try:
        yield
    finally:
        with _LIMIT_LOCK:
            _LIMIT_OVERRIDE.pop()


def _call_slots() -> CallSlots | None:
    """The process's slots for the current limit (new ones when the limit changed; calls under way keep theirs)."""
    global _SLOTS
    limit = calls_in_flight_limit()
    if limit is None:
        return None
    with _LIMIT_LOCK:
        if _SLOTS is None or _SLOTS.limit != limit:
            _SLOTS = CallSlots(limit)
        return _SLOTS


@contextlib.contextmanager
def _holding(slots: CallSlots) -> Iterator[None]:
    """Mark this context as holding a slot taken from `slots` (nested calls take none), and give it back after."""
    token = _HOLDING.set(True)
    try:
        yield
    finally:
        _HOLDING.reset(token)
        slots.release()


@contextlib.asynccontextmanager
async def call_slot_async() -> AsyncIterator[None]:
    """Hold one of the process-wide slots for the block (none when there is no limit, or this call holds one)."""
    slots = None if _HOLDING.get() else _call_slots()
    if slots is None:
        yield
        return
    await slots.acquire_async()
    with _holding(slots):
        yield


@contextlib.contextmanager
def call_slot() -> Iterator[None]:
    """`call_slot_async` for a thread: blocks until a slot is free."""
    slots = None if _HOLDING.get() else _call_slots()
    if slots is None:
        yield
        return
    slots.acquire()
    with _holding(slots):
        yield


def limit_calls(chat_generator: ChatGenerator) -> ChatGenerator:
    """
    Make every call of this generator instance hold a process-wide slot (`call_slot`), the calls a pipeline makes of
    it directly (the concatenation stage's `llm` component) as well as the fan-outs' (which hold one already and do
    not take a second). Its class, settings and serialization stay as they were.

    :param chat_generator: Any ChatGenerator; wrapped once (a second call changes nothing).
    :returns: The same instance, its `run` (and `run_async`, when it has one) wrapped.
    """
    if getattr(chat_generator, "_haystack_fusion_call_slots", False):
        return chat_generator
    run = chat_generator.run

    @functools.wraps(run)
    def limited_run(*args: Any, **kwargs: Any) -> dict[str, Any]:
        with call_slot():
            return run(*args, **kwargs)

    chat_generator.run = limited_run  # type: ignore[method-assign]
    run_async = getattr(chat_generator, "run_async", None)
    if run_async is not None:

        @functools.wraps(run_async)
        async def limited_run_async(*args: Any, **kwargs: Any) -> dict[str, Any]:
            async with call_slot_async():
                return await run_async(*args, **kwargs)

        chat_generator.run_async = limited_run_async  # type: ignore[attr-defined]
    chat_generator._haystack_fusion_call_slots = True  # type: ignore[attr-defined]
    return chat_generator


def empty_usage() -> dict[str, int]:
    """A usage record with every counter at zero: prompt / completion tokens, calls made and calls failed."""
    return dict.fromkeys(USAGE_KEYS, 0)


def sum_usage(usages: Iterable[Mapping[str, Any] | None]) -> dict[str, int]:
    """
    Add usage records key by key.

    :param usages: Records with any of `prompt_tokens`, `completion_tokens`, `calls`, `failed_calls` (and `rounds`,
        `cached_tokens`, `cached_calls`, `http_requests`, `truncated`, summed too when present); None entries are
        skipped.
    :returns: A dict with every key of `USAGE_KEYS` (counts of tokens and calls), plus each optional key that any
        input had (absent from all inputs: absent here too, never 0).
    """
    total = empty_usage()
    for usage in usages:
        for key, value in (usage or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + int(value)
    return total


def cached_prompt_tokens(usage: Mapping[str, Any] | None) -> int | None:
    """
    The prompt tokens a provider served from its prompt (prefix) cache, as one reply's usage reports them.

    Read from OpenAI's `usage.prompt_tokens_details.cached_tokens` (a nested dict in the `meta["usage"]` of Haystack's
    OpenAIChatGenerator replies; the embedded `LocalChatGenerator` reports its reused prefix in the same place).

    :param usage: A reply's `meta["usage"]`, or None.
    :returns: The cached prompt tokens (an integer >= 0; 0 is a reported miss), or None when the provider reported
        none (no `prompt_tokens_details`, or its `cached_tokens` is missing or null): not reported is not a miss.
    """
    details = (usage or {}).get("prompt_tokens_details")
    value = details.get("cached_tokens") if isinstance(details, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


TRUNCATED_FINISH_REASON = "length"
"""The finish reason of a reply cut by the token cap (`max_tokens`), as OpenAIChatGenerator and the embedded
`LocalChatGenerator` (llama.cpp's `finish_reason`) put it in `meta["finish_reason"]`."""


def reply_truncated(reply: ChatMessage | None) -> bool:
    """
    Whether a reply was cut by the token cap rather than ended by the model or a stop sequence.

    Read from `meta["finish_reason"] == "length"` (OpenAIChatGenerator, the embedded `LocalChatGenerator`, any
    OpenAI-compatible server), or a raw Ollama `meta["done_reason"] == "length"`. ollama-haystack (7.x) maps Ollama's
    `done_reason` to `finish_reason` and drops "length" (it becomes None), so an Ollama reply is never seen as cut.

    :param reply: A generator reply, or None for a failed call.
    :returns: True for a reply cut by the cap; False otherwise (a failed call and a reply that says nothing too).
    """
    return reply is not None and bool(meta_truncated(reply.meta))


def meta_truncated(meta: Mapping[str, Any]) -> bool | None:
    """
    Whether the reply behind this `meta` (a reply's, or an AnswerBuilder answer's, which copies it) was cut by the
    token cap, as `reply_truncated` reads it.

    :param meta: A reply's or an answer's `meta`.
    :returns: True or False when it says how the reply finished (`finish_reason` or Ollama's `done_reason`); None
        when it does not.
    """
    reasons = (meta.get("finish_reason"), meta.get("done_reason"))
    if reasons == (None, None):
        return None
    return TRUNCATED_FINISH_REASON in reasons


def reply_usage(reply: ChatMessage | None) -> dict[str, int]:
    """
    The token usage of one reply, read from `reply.meta["usage"]` as OpenAI-style generators report it.

    :param reply: A generator reply, or None for a failed call.
    :returns: `prompt_tokens` and `completion_tokens` (0 when the generator reported none) and `calls` = 1, plus
        `cached_tokens` (prompt tokens the provider's prefix cache served, `cached_prompt_tokens`) only when the
        reply reports them, `cached_calls` = 1 for a reply the embedded model's reply cache gave
        (`meta["cached"]`): it still counts the tokens of the call it stands for, and `truncated` = 1 for a reply
        cut by the token cap (`reply_truncated`). `truncated` is absent, not 0, for a reply that was not cut, so the
        usage of runs made before it was counted reads the same; summed, it is the number of calls cut.
    """
    usage = (reply.meta.get("usage") if reply is not None else None) or {}
    counted = {
        "prompt_tokens": int(usage.get("prompt_tokens") or 0),
        "completion_tokens": int(usage.get("completion_tokens") or 0),
        "calls": 1,
        "failed_calls": 0,
    }
    cached_tokens = cached_prompt_tokens(usage)
    if cached_tokens is not None:
        counted["cached_tokens"] = cached_tokens
    if reply is not None and reply.meta.get("cached"):
        counted["cached_calls"] = 1
    if reply_truncated(reply):
        counted["truncated"] = 1
    return counted


@contextlib.contextmanager
def trace_chat_call(
    chat_generator: ChatGenerator, generator_inputs: dict[str, Any], parent_span: tracing.Span | None
) -> Iterator[tracing.Span]:
    """
    Open the tracing span of one ChatGenerator call made inside a component, as Haystack's own components do.

    The span is named `haystack.chat_generator.run` and tagged `haystack.component.name` = "chat_generator" and
    `haystack.component.type` = the generator's class name (the convention of Haystack's
    `components.generators.utils._trace_chat_generator_run`); the inputs are its `haystack.component.input` content
    tag, recorded only when content tracing is on (`HAYSTACK_CONTENT_TRACING_ENABLED`). The caller sets the output
    and the token counts (`record_chat_call`). An exception raised inside the block closes the span as failed.

    :param chat_generator: The ChatGenerator being called.
    :param generator_inputs: Its inputs (`messages`, and `generation_kwargs` when given).
    :param parent_span: The span of the component that fans out. Tracers that follow the context (OpenTelemetry's)
        find it themselves, since the fan-out copies the caller's context into its tasks and threads; the others
        are given it here.
    :returns: The span, as a context manager.
    """
    with tracing.tracer.trace(
        "haystack.chat_generator.run",
        tags={"haystack.component.name": "chat_generator", "haystack.component.type": type(chat_generator).__name__},
        parent_span=parent_span,
    ) as span:
        span.set_content_tag("haystack.component.input", generator_inputs)
        yield span


def record_chat_call(span: tracing.Span, result: dict[str, Any]) -> None:
    """
    Tag a call's span with its result: the `haystack.component.output` content tag (when content tracing is on) and
    the first reply's token counts, `gen_ai.usage.input_tokens` and `gen_ai.usage.output_tokens` (always; 0 when
    the generator reported none).
    """
    span.set_content_tag("haystack.component.output", result)
    usage = reply_usage((result.get("replies") or [None])[0])
    span.set_tags({INPUT_TOKENS_TAG: usage["prompt_tokens"], OUTPUT_TOKENS_TAG: usage["completion_tokens"]})


@dataclass
class FanOutResult:
    """
    What a fan-out of n independent calls returned, in input order.

    :param replies: n entries: the first reply of each call, or None where the call failed or returned no reply.
    :param errors: n entries: None, or `"ExceptionType: message"` for a failed call.
    :param usage: Summed usage: `prompt_tokens`, `completion_tokens` (tokens), `calls` (attempted calls) and
        `failed_calls`, plus `http_requests` (requests the calls sent, retries included, failed calls' too) when the
        generator's client is httpx-based (Haystack's OpenAI generators, ollama-haystack; `llm_clients`),
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
    (`llm_clients.bind_async_client`), so a new event loop per question costs no failed or repeated requests.
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
        others (e.g. `llm_clients.backend_unusable`: a refused connection or key is raised, a timeout recorded).
    :param use_run_async: False calls the generator's `run` in worker threads even when it has `run_async`.
    :returns: A `FanOutResult` with n replies and n errors in input order.
    :raises ValueError: If `max_concurrency` is not None or an integer >= 1, or `HAYSTACK_FUSION_MAX_CONCURRENCY`
        is set to anything but an integer >= 1.
    :raises RuntimeError: On the `run_async` path, if the generator's async client is in use on another event loop
        that is still running (`llm_clients.bind_async_client` says what to do).
    :raises Exception: With `raise_on_failure` (or `raise_if` true for it), the first failure as the generator raised
        it (`RuntimeError` for a call that returned no reply).
    """
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
    :returns: `{"logprobs": True, "top_logprobs": n}` for `supports_logprobs` generators, else {}: `top_logprobs`
        even at 0, because some OpenAI-compatible servers send log-probabilities only with it
        (`backends.logprobs.OPENAI_LOGPROBS_KWARGS`).
    """
    if not supports_logprobs(chat_generator):
        return {}
    return {"logprobs": True, "top_logprobs": top_logprobs}


MAX_STOP_SEQUENCES = 4
"""OpenAI's limit on `stop` sequences per request."""


def merge_stop_sequences(own: Iterable[str] | str | None, extra: Iterable[str]) -> list[str]:
    """
    A generator's own stop sequences plus a prompt's, without the redundant ones.

    A sequence that contains another one never ends a reply first (the other occurs at or before it), so it is
    dropped: with `"\n"` added, the embedded model's `"\n\n"`, `"\nQuestion:"` and `"\nContext:"` all go. The
    generator's own sequences keep their order and come first, so adding nothing new returns them unchanged.

    :param own: The generator's `generation_kwargs["stop"]` (a list, one string, or None).
    :param extra: The prompt's stop sequences (`PromptTemplate.stop`).
    :returns: The merged list (at most `MAX_STOP_SEQUENCES` when the inputs allow it: the shortest are kept).
    """
    listed = [own] if isinstance(own, str) else list(own or [])
    merged: list[str] = []
    for sequence in [*listed, *extra]:
        if sequence and sequence not in merged:
            merged.append(sequence)
    kept = [s for s in merged if not any(other != s and other in s for other in merged)]
    if len(kept) > MAX_STOP_SEQUENCES:
        kept = sorted(kept, key=len)[:MAX_STOP_SEQUENCES]
    return kept


def stop_kwargs(
    chat_generator: Any, stop: Sequence[str], generation_kwargs: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """
    The `generation_kwargs` of a call whose reply should end at any of `stop` (issue 16: a short-answer prompt ends
    at its answer line), on top of the generator's own stop sequences.

    :param chat_generator: Any ChatGenerator. One with `generation_kwargs` settings (OpenAI, Ollama, llama.cpp,
        the embedded model) gets the stops, its own `generation_kwargs["stop"]` kept; one without (mocks, custom
        generators whose `run` may not take `generation_kwargs`) gets `generation_kwargs` unchanged.
    :param stop: The prompt's stop sequences (`PromptTemplate.stop`); empty returns `generation_kwargs` unchanged.
    :param generation_kwargs: The call's other `generation_kwargs`, or None (their `stop`, when set, replaces the
        generator's, as a call's own settings do).
    :returns: `generation_kwargs` with `stop` set to `merge_stop_sequences` of the stops in force and `stop`; the
        given `generation_kwargs` itself (None included) when nothing is added.
    """
    settings = getattr(chat_generator, "generation_kwargs", None)
    if not stop or not isinstance(settings, dict):
        return generation_kwargs
    call = dict(generation_kwargs or {})
    own = call["stop"] if "stop" in call else settings.get("stop")
    return {**call, "stop": merge_stop_sequences(own, stop)}


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from synchronous code, whether or not this thread already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    context = contextvars.copy_context()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(context.run, asyncio.run, coroutine).result()
