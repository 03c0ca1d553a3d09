"""
The package's LLM calls over Haystack's ChatGenerators: one fan-out (`run_chat_calls`, `run_chat_calls_async`), one
process-wide limit on calls in flight (`CallLimitedChatGenerator`), the components' `ChatGeneratorWrapper`, token
usage, the `generation_kwargs` a call adds, and what a client's exception says about its backend.

A usage record counts `prompt_tokens` and `completion_tokens` (tokens), `calls` and `failed_calls` (always present),
and `rounds`, `cached_tokens`, `cached_calls` and `truncated` only when something reported them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from haystack import component, default_from_dict, default_to_dict, logging, tracing
from haystack.components.generators.chat.types import ChatGenerator
from haystack.core.serialization import component_to_dict
from haystack.dataclasses import ChatMessage
from haystack.utils import deserialize_chatgenerator_inplace

from haystack_fusion.settings import calls_in_flight_limit_from_env

logger = logging.getLogger(__name__)

INPUT_TOKENS_TAG = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS_TAG = "gen_ai.usage.output_tokens"
"""A call's token counts on its span, as OpenTelemetry's semantic conventions for generative AI name them."""

TRUNCATED_FINISH_REASON = "length"
"""The `meta["finish_reason"]` of a reply the token cap (`max_tokens`) cut (OpenAI, the embedded model)."""

ERROR_KINDS: dict[tuple[str, str], str] = {
    ("openai", "AuthenticationError"): "openai_key",
    ("openai", "PermissionDeniedError"): "openai_key",
    ("openai", "APITimeoutError"): "openai_timeout",
    ("openai", "APIConnectionError"): "openai_unreachable",
    ("elastic_transport", "ConnectionTimeout"): "es_unreachable",
    ("elastic_transport", "ConnectionError"): "es_unreachable",
    ("elasticsearch", "AuthenticationException"): "es_key",
    ("elasticsearch", "AuthorizationException"): "es_key",
    ("elasticsearch", "NotFoundError"): "es_index",
    ("httpx", "TimeoutException"): "ollama_timeout",
    ("builtins", "ConnectionError"): "ollama_unreachable",
}
"""(top-level module, class name) of an exception or one of its bases -> what went wrong. `ConnectionError` and
httpx's timeouts are the ollama client's (it turns `httpx.ConnectError` into a builtin `ConnectionError`). The openai
client raises `APITimeoutError` (a subclass of `APIConnectionError`): the first match along the class's bases wins,
so a timeout is not taken for a refused connection."""


def exception_chain(error: BaseException) -> Iterator[BaseException]:
    """`error`, then the exceptions it was raised from (causes and contexts), depth first, each once."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [error]
    while stack:
        current = stack.pop()
        if current is not None and id(current) not in seen:
            seen.add(id(current))
            yield current
            stack.extend([current.__context__, current.__cause__])


def backend_unusable(error: BaseException) -> bool:
    """
    Whether an LLM call's exception says its backend cannot be used at all (a refused connection or key), so every
    other call to it fails the same way, rather than that this one call failed (a timeout, a 5xx, a bad reply).

    :returns: True when the first LLM-client `ERROR_KINDS` entry along the exception chain (each link's class and
        its bases, in order) is `openai_key`, `openai_unreachable` or `ollama_unreachable`.
    """
    for link in exception_chain(error):
        for cls in type(link).__mro__:
            kind = ERROR_KINDS.get((cls.__module__.split(".")[0], cls.__name__))
            if kind is not None and not kind.startswith("es_"):
                return kind in ("openai_key", "openai_unreachable", "ollama_unreachable")
    return False


def empty_usage() -> dict[str, int]:
    """A usage record with every counter at zero: prompt / completion tokens, calls made and calls failed."""
    return dict.fromkeys(("prompt_tokens", "completion_tokens", "calls", "failed_calls"), 0)


def sum_usage(usages: Iterable[Mapping[str, Any] | None]) -> dict[str, int]:
    """Add usage records key by key (None entries skipped): the four counters of `empty_usage`, plus each optional
    key any input had (never 0 for one none had)."""
    total = empty_usage()
    for usage in usages:
        for key, value in (usage or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + int(value)
    return total


def meta_truncated(meta: Mapping[str, Any]) -> bool | None:
    """
    Whether the reply behind this `meta` (a reply's, or an answer's copy) was cut by the token cap: True or False
    when its `finish_reason` (OpenAI-compatible servers, the embedded model) or a raw Ollama `done_reason` says how
    it finished, else None (ollama-haystack 7.x maps a "length" `done_reason` to None).
    """
    reasons = (meta.get("finish_reason"), meta.get("done_reason"))
    return None if reasons == (None, None) else TRUNCATED_FINISH_REASON in reasons


def reply_usage(reply: ChatMessage | None) -> dict[str, int]:
    """
    The usage of one call (its reply, or None for a failed call), read from `meta["usage"]` as OpenAI-style
    generators report it: `prompt_tokens` and `completion_tokens` (0 when not reported), `calls` = 1,
    `failed_calls` = 0, plus `cached_tokens` when the provider reported prefix-cache hits
    (`usage.prompt_tokens_details.cached_tokens`; 0 is a reported miss), `cached_calls` = 1 for a reply from the
    embedded model's reply cache (`meta["cached"]`), and `truncated` = 1 for a reply the token cap cut.
    """
    meta = reply.meta if reply is not None else {}
    usage = meta.get("usage") or {}
    counted = {
        "prompt_tokens": int(usage.get("prompt_tokens") or 0),
        "completion_tokens": int(usage.get("completion_tokens") or 0),
        "calls": 1,
        "failed_calls": 0,
    }
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    if isinstance(cached, (int, float)) and not isinstance(cached, bool):
        counted["cached_tokens"] = int(cached)
    if meta.get("cached"):
        counted["cached_calls"] = 1
    if meta_truncated(meta):
        counted["truncated"] = 1
    return counted


def logprob_kwargs(chat_generator: Any, top_logprobs: int = 0) -> dict[str, Any]:
    """
    The `generation_kwargs` that ask for token log-probabilities, for a generator that returns them: the embedded
    model (`LocalChatGenerator`), or one whose own `generation_kwargs` ask for them (`--logprobs`). Other
    OpenAI-compatible servers are not asked: one that refuses fails the call (llama.cpp's server needs `logits_all`);
    ollama-haystack returns none.

    :param top_logprobs: Alternatives per token to return as well (0: none; OpenAI allows up to 20).
    :returns: `{"logprobs": True, "top_logprobs": n}` (`top_logprobs` even at 0: some OpenAI-compatible servers send
        log-probabilities only with it), or {} for a generator that does not return them.
    """
    generator = unwrap_call_limit(chat_generator)
    local = any(cls.__name__ == "LocalChatGenerator" for cls in type(generator).__mro__)
    if local or (getattr(generator, "generation_kwargs", None) or {}).get("logprobs"):
        return {"logprobs": True, "top_logprobs": top_logprobs}
    return {}


def stop_kwargs(
    chat_generator: Any, stop: Sequence[str], generation_kwargs: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    r"""
    The call's `generation_kwargs` with `stop` (the prompt's stop sequences, `PromptTemplate.stop`) merged after the
    generator's own (or the call's, which replace them), without the redundant ones (a sequence containing another
    never ends a reply first: with `"\n"` added, `"\n\n"` goes), at most the 4 shortest (OpenAI's limit). A
    generator without `generation_kwargs` settings (a mock) gets none added: `generation_kwargs` itself comes back.
    """
    settings = getattr(unwrap_call_limit(chat_generator), "generation_kwargs", None)
    if not stop or not isinstance(settings, dict):
        return generation_kwargs
    call = dict(generation_kwargs or {})
    own = call["stop"] if "stop" in call else settings.get("stop")
    merged: list[str] = []
    for sequence in [*([own] if isinstance(own, str) else own or []), *stop]:
        if sequence and sequence not in merged:
            merged.append(sequence)
    kept = [s for s in merged if not any(other != s and other in s for other in merged)]
    return {**call, "stop": sorted(kept, key=len)[:4] if len(kept) > 4 else kept}


def _none_or_positive(value: int | None, name: str, none: str) -> int | None:
    """:raises ValueError: If `value` is neither None nor an integer >= 1."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"`{name}` must be None ({none}) or an integer >= 1, got {value!r}")
    return value


def check_max_concurrency(max_concurrency: int | None) -> int | None:
    """
    :returns: `max_concurrency` unchanged: None (all calls of a round at once) or an integer >= 1.
    :raises ValueError: If it is neither.
    """
    return _none_or_positive(max_concurrency, "max_concurrency", "all calls of a round at once")


_LOCK = threading.Lock()
_OVERRIDES: list[int | None] = []  # the `max_calls_in_flight` blocks under way, innermost last
_SEMAPHORES: dict[int, threading.BoundedSemaphore] = {}
_ASYNC_POLL = 0.05
"""Seconds a coroutine's wait blocks a worker thread at a time: waiters never hold every thread a call may need."""


def calls_in_flight_limit() -> int | None:
    """
    :returns: The process-wide limit on LLM calls in flight: the innermost `max_calls_in_flight` block's, else
        `HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT` (read at every call), else None (no limit).
    :raises ValueError: If the environment variable is set to anything but an integer >= 1.
    """
    with _LOCK:
        if _OVERRIDES:
            return _OVERRIDES[-1]
    return calls_in_flight_limit_from_env()


@contextlib.contextmanager
def max_calls_in_flight(limit: int | None) -> Iterator[None]:
    """
    Limit the calls in flight of the whole process to `limit` (None: no limit) while the block runs
    (`eval --max-calls-in-flight`): a rate-limited API's 429 storm then slows a batch down instead of failing it.

    :raises ValueError: If `limit` is not None or an integer >= 1.
    """
    _none_or_positive(limit, "max_calls_in_flight", "no limit")
    with _LOCK:
        _OVERRIDES.append(limit)
    try:
        yield
    finally:
        with _LOCK:
            _OVERRIDES.pop()


def _semaphore() -> threading.BoundedSemaphore | None:
    limit = calls_in_flight_limit()
    with _LOCK:
        return None if limit is None else _SEMAPHORES.setdefault(limit, threading.BoundedSemaphore(limit))


async def _acquire_async(semaphore: threading.BoundedSemaphore) -> None:
    """Take a slot without blocking the event loop; a cancelled wait leaves no slot taken."""
    while not semaphore.acquire(blocking=False):
        waiter = asyncio.ensure_future(asyncio.to_thread(semaphore.acquire, timeout=_ASYNC_POLL))
        try:
            if await asyncio.shield(waiter):
                return
        except asyncio.CancelledError:
            waiter.add_done_callback(lambda done: semaphore.release() if done.result() else None)
            raise


async def _run_async(generator: Any, **inputs: Any) -> dict[str, Any]:
    """The generator's `run_async`, or its `run` in a worker thread when it has none."""
    if hasattr(generator, "run_async"):
        return await generator.run_async(**inputs)
    return await asyncio.to_thread(generator.run, **inputs)


class _Wrapper:
    """Lifecycle and serialization of a component that keeps a ChatGenerator in `self._chat_generator`."""

    _chat_generator: ChatGenerator

    def _wrapped_parts(self) -> list[Any]:
        """The components this one warms up and closes: its chat generator (SummaryVerifier adds its ranker)."""
        return [self._chat_generator]

    def warm_up(self) -> None:
        """Warm up the wrapped chat generator (idempotent)."""
        for part in self._wrapped_parts():
            if hasattr(part, "warm_up"):
                part.warm_up()

    async def warm_up_async(self) -> None:
        """Warm up the wrapped chat generator on the running loop: its `warm_up_async`, else its `warm_up`."""
        for part in self._wrapped_parts():
            if hasattr(part, "warm_up_async"):
                await part.warm_up_async()
            elif hasattr(part, "warm_up"):
                part.warm_up()

    def close(self) -> None:
        """Release the wrapped chat generator's resources."""
        for part in self._wrapped_parts():
            if hasattr(part, "close"):
                part.close()

    async def close_async(self) -> None:
        """Release the wrapped chat generator's async resources: its `close_async`, else its `close`."""
        for part in self._wrapped_parts():
            if hasattr(part, "close_async"):
                await part.close_async()
            elif hasattr(part, "close"):
                part.close()

    def to_dict(self) -> dict[str, Any]:
        """Serialize this component, with its chat generator, to a dictionary."""
        return default_to_dict(self, chat_generator=component_to_dict(obj=self._chat_generator, name="chat_generator"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        """Deserialize this component, with its chat generator, from a dictionary."""
        deserialize_chatgenerator_inplace(data["init_parameters"], key="chat_generator")
        return default_from_dict(cls, data)


class ChatGeneratorWrapper(_Wrapper):
    """
    Mixin of the package's components that call a ChatGenerator (kept in `self._chat_generator`, serialized as
    `chat_generator`) and report their calls' usage and failures in their `meta`. As Haystack's wrappers
    (`LLMRanker`, `FallbackChatGenerator`) do, `warm_up_async` / `close_async` prefer a wrapped part's async method,
    so a `Pipeline.run_async` builds and releases async clients on the loop that uses them.
    """


@component
class CallLimitedChatGenerator(_Wrapper):
    """
    Wraps a ChatGenerator so that each of its calls holds one of the process-wide call slots while it runs.

    With no limit (`calls_in_flight_limit`) it only passes calls on. With a limit of N, at most N calls through such
    wrappers are under way in the process at once, from any thread or event loop (one `threading.BoundedSemaphore`);
    the others wait. Retries and timeouts stay the wrapped generator's. Its inputs are the wrapped generator's
    (`messages`, `generation_kwargs`, `tools` ...); its output is `replies`.

    ### Usage example
    ```python
    from haystack.components.generators.chat import OpenAIChatGenerator
    from haystack.dataclasses import ChatMessage
    from haystack_fusion.llm import CallLimitedChatGenerator, max_calls_in_flight

    llm = CallLimitedChatGenerator(chat_generator=OpenAIChatGenerator(model="gpt-4o-mini"))
    with max_calls_in_flight(4):  # or HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT=4 for the whole process
        result = llm.run(messages=[ChatMessage.from_user("What is the capital of France?")])
    print(result["replies"][0].text)
    ```
    """

    def __init__(self, *, chat_generator: ChatGenerator) -> None:
        """:param chat_generator: Any component whose `run(messages=...)` returns `replies`."""
        self._chat_generator = chat_generator
        for parameter in inspect.signature(chat_generator.run).parameters.values():
            if parameter.name != "messages" and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                component.set_input_type(self, parameter.name, Any, parameter.default)
        component.set_output_types(self, replies=list[ChatMessage])

    def run(self, messages: list[ChatMessage], **kwargs: Any) -> dict[str, Any]:
        """
        Call the wrapped generator with `messages` and its other inputs (`kwargs`), holding a call slot.

        :returns: What the wrapped generator returned: `replies`, a list of ChatMessage.
        :raises ValueError: If `HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT` is set to anything but an integer >= 1.
        :raises Exception: What the wrapped generator raised.
        """
        with _semaphore() or contextlib.nullcontext():
            return self._chat_generator.run(messages=messages, **kwargs)

    async def run_async(self, messages: list[ChatMessage], **kwargs: Any) -> dict[str, Any]:
        """Async form of `run` (same inputs, outputs, errors): waits for its slot without blocking the loop, then
        calls the wrapped generator's `run_async`, or its `run` in a worker thread."""
        semaphore = _semaphore()
        if semaphore is not None:
            await _acquire_async(semaphore)
        try:
            return await _run_async(self._chat_generator, messages=messages, **kwargs)
        finally:
            if semaphore is not None:
                semaphore.release()


def unwrap_call_limit(chat_generator: Any) -> Any:
    """The generator a `CallLimitedChatGenerator` wraps (where its own settings are read), or `chat_generator`."""
    while isinstance(chat_generator, CallLimitedChatGenerator):
        chat_generator = chat_generator._chat_generator
    return chat_generator


@dataclass
class FanOutResult:
    """
    What a fan-out of n independent calls returned, in input order.

    :param replies: n entries: each call's first reply, or None where it failed or returned no reply.
    :param errors: n entries: None, or `"ExceptionType: message"` for a failed call.
    :param usage: Summed usage: `prompt_tokens`, `completion_tokens` (tokens), `calls`, `failed_calls`, and
        `cached_tokens` / `cached_calls` / `truncated` when any reply reported them.
    """

    replies: list[ChatMessage | None]
    errors: list[str | None]
    usage: dict[str, int] = field(default_factory=empty_usage)

    @property
    def failures(self) -> list[dict[str, Any]]:
        """The failed calls as `{"index": i, "error": "..."}` dicts, ready for an answer's `meta`."""
        return [{"index": i, "error": error} for i, error in enumerate(self.errors) if error is not None]


Outcome = tuple[ChatMessage | None, str | None]


class _Calls:
    """The calls of one fan-out, each in a `haystack.chat_generator.run` span (a child of the caller's, as Haystack's
    own components trace their generator calls) tagged with the reply's token counts."""

    def __init__(self, generator: Any, generation_kwargs: dict[str, Any] | None, raise_if: Callable | None) -> None:
        self.generator, self.raise_if = generator, raise_if
        self.kwargs = {"generation_kwargs": generation_kwargs} if generation_kwargs else {}
        self.parent = tracing.tracer.current_span()
        self.tags = {
            "haystack.component.name": "chat_generator",
            "haystack.component.type": type(unwrap_call_limit(generator)).__name__,
        }

    @contextlib.contextmanager
    def _span(self, messages: list[ChatMessage]) -> Iterator[tracing.Span]:
        with tracing.tracer.trace("haystack.chat_generator.run", tags=self.tags, parent_span=self.parent) as span:
            span.set_content_tag("haystack.component.input", {"messages": messages, **self.kwargs})
            yield span

    def _outcome(self, span: tracing.Span, result: dict[str, Any]) -> Outcome:
        span.set_content_tag("haystack.component.output", result)
        reply = (result.get("replies") or [None])[0]
        usage = reply_usage(reply)
        span.set_tags({INPUT_TOKENS_TAG: usage["prompt_tokens"], OUTPUT_TOKENS_TAG: usage["completion_tokens"]})
        if reply is None:
            raise RuntimeError("the chat generator returned no reply")
        return reply, None

    def _failed(self, error: Exception) -> Outcome:
        if self.raise_if is not None and self.raise_if(error):
            raise error
        logger.warning("An LLM call failed and counts as an abstention: {error}", error=error)
        return None, f"{type(error).__name__}: {error}"

    def run(self, messages: list[ChatMessage]) -> Outcome:
        try:
            with self._span(messages) as span:
                return self._outcome(span, self.generator.run(messages=messages, **self.kwargs))
        except Exception as error:
            return self._failed(error)

    async def run_async(self, messages: list[ChatMessage]) -> Outcome:
        try:
            with self._span(messages) as span:
                return self._outcome(span, await _run_async(self.generator, messages=messages, **self.kwargs))
        except Exception as error:
            return self._failed(error)


def _result(outcomes: list[Outcome]) -> FanOutResult:
    replies, errors = [reply for reply, _ in outcomes], [error for _, error in outcomes]
    usage = sum_usage(reply_usage(reply) for reply in replies)
    usage["failed_calls"] = sum(error is not None for error in errors)
    return FanOutResult(replies=replies, errors=errors, usage=usage)


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
    The one fan-out of independent ChatGenerator calls (one per passage, per sample, per candidate ...), as
    Haystack's `LLMMetadataExtractor` does it: the generator's `run` once per prompt, in a `ThreadPoolExecutor` of
    this fan-out's own, each call in a copy of the caller's context (its span nests under the caller's). A failed
    call is an abstention, logged and recorded, while the other calls go on; retries and timeouts are the generator's.

    :param chat_generator: Any Haystack ChatGenerator (through a `CallLimitedChatGenerator`, each call holds one of
        the process-wide slots).
    :param prompts: n prompts, each a list of ChatMessage.
    :param max_concurrency: None: all n calls at once; an integer >= 1: at most that many under way at once.
    :param generation_kwargs: Passed to every call when given.
    :param raise_on_failure: Re-raise the first failure (calls not yet started never start) instead of recording it.
    :param raise_if: Re-raise a failure for which `raise_if(error)` is true (`backend_unusable`), record others.
    :returns: A `FanOutResult` with n replies and n errors in input order.
    :raises ValueError: If `max_concurrency` is not None or an integer >= 1.
    :raises Exception: A failure re-raised by `raise_on_failure` or `raise_if` (`RuntimeError` for no reply).
    """
    check_max_concurrency(max_concurrency)
    if not prompts:
        return _result([])
    calls = _Calls(chat_generator, generation_kwargs, (lambda _: True) if raise_on_failure else raise_if)
    failed = threading.Event()

    def call(messages: list[ChatMessage]) -> Outcome:
        if failed.is_set():  # a call re-raised its failure: the queued ones never start
            return None, "CancelledError: another call failed"
        try:
            return calls.run(messages)
        except Exception:
            failed.set()
            raise

    pool = ThreadPoolExecutor(max_workers=min(max_concurrency or len(prompts), len(prompts)))
    try:
        futures = [pool.submit(contextvars.copy_context().run, call, messages) for messages in prompts]
        wait(futures, return_when=FIRST_EXCEPTION)
        for future in futures:
            if future.done() and future.exception() is not None:
                raise future.exception()  # type: ignore[misc]
        return _result([future.result() for future in futures])
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


async def run_chat_calls_async(
    chat_generator: ChatGenerator,
    prompts: list[list[ChatMessage]],
    *,
    max_concurrency: int | None = None,
    generation_kwargs: dict[str, Any] | None = None,
    raise_on_failure: bool = False,
    raise_if: Callable[[Exception], bool] | None = None,
) -> FanOutResult:
    """
    Async form of `run_chat_calls`, with the same parameters, result and errors: `asyncio.gather` of the generator's
    `run_async` calls (its `run` in a worker thread when it has none) under an `asyncio.Semaphore(max_concurrency)`.
    A re-raised failure cancels the other calls.
    """
    check_max_concurrency(max_concurrency)
    calls = _Calls(chat_generator, generation_kwargs, (lambda _: True) if raise_on_failure else raise_if)
    semaphore = asyncio.Semaphore(max_concurrency or max(1, len(prompts)))

    async def bounded(messages: list[ChatMessage]) -> Outcome:
        async with semaphore:
            try:
                return await calls.run_async(messages)
            except Exception:  # re-raised: cancel the others before this call's turn goes to a waiting one
                for task in tasks:
                    if task is not asyncio.current_task():
                        task.cancel()
                raise

    tasks = [asyncio.ensure_future(bounded(messages)) for messages in prompts]
    try:
        return _result(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # none outlives the fan-out
        raise
