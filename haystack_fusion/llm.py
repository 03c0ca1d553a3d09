"""LLM calls over Haystack's ChatGenerators: the fan-out, the process-wide call limit and circuit breaker
(`CallLimitedChatGenerator`), the components' wrapper mixin, token usage and call `generation_kwargs`."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import threading
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any

from haystack import component, default_from_dict, default_to_dict, logging, tracing
from haystack.components.generators.chat.types import ChatGenerator
from haystack.core.serialization import component_to_dict
from haystack.dataclasses import ChatMessage, ComponentInfo, StreamingCallbackT, StreamingChunk
from haystack.utils import deserialize_callable, deserialize_component_inplace, serialize_callable

from haystack_fusion.breaker import CircuitBreaker
from haystack_fusion.failures import UNUSABLE_KINDS, CallFailure, LLMCallsFailedError, failure_kind, record
from haystack_fusion.prompts import template_from_dict, template_to_dict
from haystack_fusion.settings import calls_in_flight_limit_from_env

logger = logging.getLogger(__name__)

INPUT_TOKENS_TAG = "gen_ai.usage.input_tokens"  # OpenTelemetry's generative-AI semantic conventions
OUTPUT_TOKENS_TAG = "gen_ai.usage.output_tokens"
TRUNCATED_FINISH_REASON = "length"  # `meta["finish_reason"]` of a reply the token cap cut

# self-consistency sampling: post-fusion's p > 1 samples, the agreement samples (Liu et al., section 4.4, Figure 5)
DEFAULT_SAMPLING_KWARGS: dict[str, Any] = {"temperature": 0.7}


def backend_unusable(error: BaseException) -> bool:
    """Whether the call's `failure_kind` is in `UNUSABLE_KINDS` (refused connection or key, open breaker)."""
    return failure_kind(error) in UNUSABLE_KINDS


def empty_usage() -> dict[str, int]:
    """A usage record with every counter at zero."""
    return dict.fromkeys(("prompt_tokens", "completion_tokens", "calls", "failed_calls"), 0)


def sum_usage(usages: Iterable[Mapping[str, Any] | None]) -> dict[str, int]:
    """Add usage records key by key (None skipped)."""
    total = empty_usage()
    for usage in usages:
        for key, value in (usage or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + int(value)
    return total


def meta_truncated(meta: Mapping[str, Any]) -> bool | None:
    """Whether the token cap cut the reply (`finish_reason` or Ollama's `done_reason`); None when neither says."""
    reasons = (meta.get("finish_reason"), meta.get("done_reason"))
    return None if reasons == (None, None) else TRUNCATED_FINISH_REASON in reasons


def reply_usage(reply: ChatMessage | None) -> dict[str, int]:
    """One call's usage from OpenAI-style `meta["usage"]` (reply None: failed); `cached_tokens`, `cached_calls`
    and `truncated` only when reported."""
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
    """`{"logprobs": True, "top_logprobs": n}` for the embedded model or a generator whose `generation_kwargs` ask
    for log-probabilities (sent even at n = 0: some servers need it); else {} (a refusing server fails the call)."""
    generator = unwrap_call_limit(chat_generator)
    local = any(cls.__name__ == "LocalChatGenerator" for cls in type(generator).__mro__)
    if local or (getattr(generator, "generation_kwargs", None) or {}).get("logprobs"):
        return {"logprobs": True, "top_logprobs": top_logprobs}
    return {}


def stop_kwargs(
    chat_generator: Any, stop: Sequence[str], generation_kwargs: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """`generation_kwargs` with `stop` merged after the generator's (or call's) own, minus those containing another,
    at most the 4 shortest (OpenAI's limit); unchanged for a generator without `generation_kwargs`."""
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
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"`{name}` must be None ({none}) or an integer >= 1, got {value!r}")
    return value


def check_max_concurrency(max_concurrency: int | None) -> int | None:
    """:returns: `max_concurrency` (None or an integer >= 1). :raises ValueError: If it is neither."""
    return _none_or_positive(max_concurrency, "max_concurrency", "all calls of a round at once")


_LOCK = threading.Lock()
_OVERRIDES: list[int | None] = []  # the `max_calls_in_flight` blocks under way, innermost last
_SEMAPHORES: dict[int, threading.BoundedSemaphore] = {}
_ASYNC_POLL = 0.05  # seconds a waiting coroutine blocks a worker thread at a time


def calls_in_flight_limit() -> int | None:
    """The innermost `max_calls_in_flight` block's limit, else `HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT`, else None.

    :raises ValueError: If the environment variable is set to anything but an integer >= 1."""
    with _LOCK:
        if _OVERRIDES:
            return _OVERRIDES[-1]
    return calls_in_flight_limit_from_env()


@contextlib.contextmanager
def max_calls_in_flight(limit: int | None) -> Iterator[None]:
    """Limit the process's LLM calls in flight to `limit` (None: no limit) while the block runs.

    :raises ValueError: If `limit` is not None or an integer >= 1."""
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
    while not semaphore.acquire(blocking=False):
        waiter = asyncio.ensure_future(asyncio.to_thread(semaphore.acquire, timeout=_ASYNC_POLL))
        try:
            if await asyncio.shield(waiter):
                return
        except asyncio.CancelledError:
            waiter.add_done_callback(lambda done: semaphore.release() if done.result() else None)
            raise


def is_async_callback(callback: Any) -> bool:
    """Whether a streaming callback is a coroutine function (or an object whose `__call__` is one)."""
    return inspect.iscoroutinefunction(callback) or inspect.iscoroutinefunction(type(callback).__call__)


def threaded_callback(
    callback: StreamingCallbackT, loop: asyncio.AbstractEventLoop
) -> Callable[[StreamingChunk], None]:
    """A callback for a call in a worker thread: a sync one as it is, an async one run on `loop`, chunks in order."""
    if not is_async_callback(callback):
        return callback  # type: ignore[return-value]

    def call_on_loop(chunk: StreamingChunk) -> None:
        asyncio.run_coroutine_threadsafe(callback(chunk), loop).result()  # type: ignore[arg-type]

    return call_on_loop


async def emit_chunk(callback: StreamingCallbackT, chunk: StreamingChunk) -> None:
    """Call a sync or an async streaming callback with one chunk, from a coroutine."""
    result = callback(chunk)
    if inspect.isawaitable(result):
        await result


def takes_streaming_callback(generator: Any) -> bool:
    """Whether a generator's `run` takes a `streaming_callback` (looked up past a `CallLimitedChatGenerator`)."""
    run = getattr(unwrap_call_limit(generator), "run", None)
    return run is not None and "streaming_callback" in inspect.signature(run).parameters


_FIRST_LOOPS: weakref.WeakKeyDictionary[Any, weakref.ref[asyncio.AbstractEventLoop]] = weakref.WeakKeyDictionary()


def _on_first_loop(generator: Any) -> bool:
    """Whether the running loop is the one the generator was first awaited on (an async client such as openai's
    stays bound to it: "Event loop is closed" elsewhere)."""
    loop = asyncio.get_running_loop()
    try:
        with _LOCK:
            return _FIRST_LOOPS.setdefault(generator, weakref.ref(loop))() is loop
    except TypeError:
        return True


async def run_generator_async(generator: Any, **inputs: Any) -> dict[str, Any]:
    """`run_async` on the generator's first loop, else `run` in a worker thread."""
    if hasattr(generator, "run_async") and _on_first_loop(generator):
        return await generator.run_async(**inputs)
    if inputs.get("streaming_callback") is not None:
        inputs["streaming_callback"] = threaded_callback(inputs["streaming_callback"], asyncio.get_running_loop())
    return await asyncio.to_thread(generator.run, **inputs)


@dataclass
class Round:
    """One round of a component's LLM calls (`ChatGeneratorWrapper._drive`; fields as `run_chat_calls`'s)."""

    prompts: list[list[ChatMessage]]
    generation_kwargs: dict[str, Any] | None = None
    stop: Sequence[str] = ()
    streaming_callback: StreamingCallbackT | None = None
    raise_if: Callable[[Exception], bool] | None = None
    indexes: Sequence[int] | None = None


Rounds = Generator[Round, "FanOutResult | None", Any]
"""A component's calls: yields each `Round`, gets its `FanOutResult` (None: no prompts), returns the outputs."""


def round_usage(*rounds: FanOutResult | None) -> dict[str, int]:
    """The summed usage of a component's rounds (None: did not run), with `rounds` = how many ran."""
    ran = [calls for calls in rounds if calls is not None]
    return dict(sum_usage(calls.usage for calls in ran), rounds=len(ran))


class InitSerialization:
    """Mixin serializing every init parameter from its attribute: `_COMPONENTS` (as `self._<name>`), `*prompt`
    templates and a streaming callback each in their own way."""

    _COMPONENTS: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Serialize this component with every init parameter."""
        parameters: dict[str, Any] = {}
        for name in list(inspect.signature(type(self).__init__).parameters)[1:]:
            if name in self._COMPONENTS:
                part = getattr(self, f"_{name}")
                parameters[name] = None if part is None else component_to_dict(obj=part, name=name)
            elif name == "streaming_callback":
                callback = getattr(self, name)
                parameters[name] = serialize_callable(callback) if callback else None
            else:
                value = getattr(self, name)
                parameters[name] = template_to_dict(value) if name.endswith("prompt") else value
        return default_to_dict(self, **parameters)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        """Deserialize `to_dict`'s output."""
        parameters = data["init_parameters"]
        for name, value in parameters.items():
            if value is not None and name.endswith("prompt"):
                parameters[name] = template_from_dict(value)
            elif value is not None and name == "streaming_callback":
                parameters[name] = deserialize_callable(value)
        for name in cls._COMPONENTS:
            if parameters.get(name) is not None:
                deserialize_component_inplace(parameters, key=name)
        return default_from_dict(cls, data)


class ChatGeneratorWrapper(InitSerialization):
    """Mixin of components calling `self._chat_generator`: rounds of calls (`_drive`), the wrapped parts'
    lifecycle and serialization (`InitSerialization`)."""

    _chat_generator: ChatGenerator
    _COMPONENTS: tuple[str, ...] = ("chat_generator",)
    _ROUND_MAY_FAIL = False  # a round whose every call failed is an output, not `LLMCallsFailedError`

    def _wrapped_parts(self) -> list[Any]:
        return [part for name in self._COMPONENTS if (part := getattr(self, f"_{name}")) is not None]

    def _each(self, name: str) -> None:
        for part in self._wrapped_parts():
            if hasattr(part, name):
                getattr(part, name)()

    async def _each_async(self, name: str) -> None:
        for part in self._wrapped_parts():
            if hasattr(part, f"{name}_async") and _on_first_loop(part):  # an async client is bound to its first loop
                await getattr(part, f"{name}_async")()
            elif hasattr(part, name):
                getattr(part, name)()

    def warm_up(self) -> None:
        self._each("warm_up")

    async def warm_up_async(self) -> None:
        await self._each_async("warm_up")

    def close(self) -> None:
        self._each("close")

    async def close_async(self) -> None:
        await self._each_async("close")

    def _settings(self, step: Round) -> dict[str, Any]:
        return {
            "max_concurrency": getattr(self, "max_concurrency", None),
            "raise_on_failure": getattr(self, "raise_on_failure", False),
            "raise_if": step.raise_if,
            "generation_kwargs": stop_kwargs(self._chat_generator, step.stop, step.generation_kwargs or None),
            "streaming_callback": step.streaming_callback,
            "caller": self,
            "indexes": step.indexes,
        }

    def _ran(self, ran: list[FanOutResult | None], calls: FanOutResult | None) -> None:
        ran.append(calls)
        if not self._ROUND_MAY_FAIL:
            check_answered(self, *ran)

    def _drive(self, rounds: Rounds, ahead: Callable[[Round], Any] | None = None) -> Any:
        """Run the rounds with `run_chat_calls`; returns what `rounds` returns. `ahead(round)`: the future of the
        round's calls started ahead (`components.speculation`), else None.

        :raises LLMCallsFailedError: If every call of a round failed (with every round's failed calls so far)."""
        calls: FanOutResult | None = None
        ran: list[FanOutResult | None] = []
        try:
            while True:
                step, calls = rounds.send(calls), None
                if (taken := ahead(step) if ahead else None) is not None:
                    calls = taken.result()
                elif step.prompts:
                    calls = run_chat_calls(self._chat_generator, step.prompts, **self._settings(step))
                self._ran(ran, calls)
        except StopIteration as done:
            return done.value

    async def _drive_async(self, rounds: Rounds, ahead: Callable[[Round], Any] | None = None) -> Any:
        """Run the rounds with `run_chat_calls_async`; takes, returns and raises what `_drive` does."""
        calls: FanOutResult | None = None
        ran: list[FanOutResult | None] = []
        try:
            while True:
                step, calls = rounds.send(calls), None
                if (taken := ahead(step) if ahead else None) is not None:
                    calls = await asyncio.wrap_future(taken)
                elif step.prompts:
                    calls = await run_chat_calls_async(self._chat_generator, step.prompts, **self._settings(step))
                self._ran(ran, calls)
        except StopIteration as done:
            return done.value


@component
class CallLimitedChatGenerator(ChatGeneratorWrapper):
    """
    Wraps a ChatGenerator: each call holds one of the process-wide slots (`calls_in_flight_limit`) and, with a
    `breaker`, goes through it first (open: `CircuitOpenError` at once, never sent). Inputs are the wrapped
    generator's; output is `replies`; streamed chunks name this component.

    ### Usage example
    ```python
    from haystack.components.generators.chat import OpenAIChatGenerator
    from haystack.dataclasses import ChatMessage
    from haystack_fusion.breaker import CircuitBreaker
    from haystack_fusion.llm import CallLimitedChatGenerator, max_calls_in_flight

    llm = CallLimitedChatGenerator(
        chat_generator=OpenAIChatGenerator(model="gpt-4o-mini"),
        breaker=CircuitBreaker.shared("openai https://api.openai.com/v1", failure_threshold=5, cooldown=30.0),
    )
    with max_calls_in_flight(4):  # or HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT=4 for the whole process
        result = llm.run(messages=[ChatMessage.from_user("What is the capital of France?")])
    print(result["replies"][0].text)
    ```
    """

    def __init__(
        self,
        *,
        chat_generator: ChatGenerator,
        breaker: CircuitBreaker | None = None,
        generation_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """
        :param breaker: The backend's circuit breaker (shared by every wrapper of that backend); None: none.
        :param generation_kwargs: Sent with every call, under the call's own `generation_kwargs`.
        """
        self._chat_generator = chat_generator
        self.breaker = breaker
        self.generation_kwargs = generation_kwargs
        for parameter in inspect.signature(chat_generator.run).parameters.values():
            if parameter.name != "messages" and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                component.set_input_type(self, parameter.name, Any, parameter.default)
        component.set_output_types(self, replies=list[ChatMessage])

    def _breaker(self) -> contextlib.AbstractContextManager[None]:
        return self.breaker.calling() if self.breaker is not None else contextlib.nullcontext()

    def _inputs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The wrapped generator's inputs: `generation_kwargs` over this wrapper's, chunks tagged with this one."""
        if self.generation_kwargs:
            kwargs["generation_kwargs"] = {**self.generation_kwargs, **(kwargs.get("generation_kwargs") or {})}
        callback, info = kwargs.get("streaming_callback"), ComponentInfo.from_component(self)
        if callback is not None and info.name is not None:
            kwargs["streaming_callback"] = _tagged(callback, info)
        return kwargs

    def run(self, messages: list[ChatMessage], **kwargs: Any) -> dict[str, Any]:
        """Call the wrapped generator holding a call slot. :raises CircuitOpenError: If the breaker refuses it."""
        with self._breaker(), _semaphore() or contextlib.nullcontext():
            return self._chat_generator.run(messages=messages, **self._inputs(kwargs))

    async def run_async(self, messages: list[ChatMessage], **kwargs: Any) -> dict[str, Any]:
        """Async form of `run`."""
        with self._breaker():
            semaphore = _semaphore()
            if semaphore is not None:
                await _acquire_async(semaphore)
            try:
                return await run_generator_async(self._chat_generator, messages=messages, **self._inputs(kwargs))
            finally:
                if semaphore is not None:
                    semaphore.release()

    def to_dict(self) -> dict[str, Any]:
        """Serialize this component: its chat generator, its breaker's settings (`CircuitBreaker.to_dict`) and
        `generation_kwargs`."""
        data = InitSerialization.to_dict(self)
        data["init_parameters"]["breaker"] = None if self.breaker is None else self.breaker.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CallLimitedChatGenerator:
        """Deserialize this component; its breaker is the process's one of that name and settings
        (`CircuitBreaker.shared`)."""
        parameters = data["init_parameters"]
        if parameters.get("breaker") is not None:
            parameters["breaker"] = CircuitBreaker.shared(**parameters["breaker"])
        return InitSerialization.from_dict.__func__(cls, data)  # type: ignore[attr-defined]


def _tagged(callback: StreamingCallbackT, info: ComponentInfo) -> StreamingCallbackT:
    """`callback` (sync or async) given each chunk with `info` as its `component_info`."""
    if is_async_callback(callback):

        async def tag_async(chunk: StreamingChunk) -> None:
            await callback(replace(chunk, component_info=info))  # type: ignore[misc]

        return tag_async

    def tag(chunk: StreamingChunk) -> None:
        callback(replace(chunk, component_info=info))

    return tag


def model_name(chat_generator: Any) -> str:
    """The model a chat generator calls (inside our wrappers): its `model` (a GGUF path's file name), else its class
    name."""
    generator = chat_generator
    while isinstance(generator, ChatGeneratorWrapper):
        generator = generator._chat_generator
    model = getattr(generator, "model", None)
    if isinstance(model, str) and model:
        return model.replace("\\", "/").rsplit("/", 1)[-1] if model.endswith(".gguf") else model
    return type(generator).__name__


def unwrap_call_limit(chat_generator: Any) -> Any:
    """The generator a `CallLimitedChatGenerator` wraps, or `chat_generator`."""
    while isinstance(chat_generator, CallLimitedChatGenerator):
        chat_generator = chat_generator._chat_generator
    return chat_generator


@dataclass
class FanOutResult:
    """A fan-out's n calls in input order: `replies` (None: failed), `errors` (`CallFailure` or None), summed
    `usage`."""

    replies: list[ChatMessage | None]
    errors: list[CallFailure | None]
    usage: dict[str, int] = field(default_factory=empty_usage)

    @property
    def failures(self) -> list[CallFailure]:
        return [error for error in self.errors if error is not None]


def failures_meta(*rounds: FanOutResult | None) -> list[dict[str, Any]]:
    """The failed calls of a component's rounds as an answer's `meta["failures"]`."""
    return [failure.to_dict() for calls in rounds if calls for failure in calls.failures]


def _component_name(caller: Any) -> str:
    return (ComponentInfo.from_component(caller).name or "") if caller is not None else ""


def check_answered(caller: Any, *rounds: FanOutResult | None) -> None:
    """:raises LLMCallsFailedError: If every call of the last round failed (with every round's failures)."""
    last = rounds[-1] if rounds else None
    if last is not None and last.replies and all(reply is None for reply in last.replies):
        name = _component_name(caller)
        what = type(caller).__name__ + (f" {name!r}" if name else "")
        raise LLMCallsFailedError([failure for calls in rounds if calls for failure in calls.failures], what)


Outcome = tuple[ChatMessage | None, CallFailure | None]


class _Calls:
    """A fan-out's calls, each in a `haystack.chat_generator.run` child span tagged with its token counts."""

    def __init__(self, generator: Any, prompts: list[list[ChatMessage]], **settings: Any) -> None:
        check_max_concurrency(settings["max_concurrency"])
        self.generator, self.prompts = generator, prompts
        self.raise_if = (lambda _: True) if settings["raise_on_failure"] else settings["raise_if"]
        self.kwargs: dict[str, Any] = {"generation_kwargs": kw} if (kw := settings["generation_kwargs"]) else {}
        self.streaming: dict[str, Any] = {}
        if (callback := settings["streaming_callback"]) is not None and takes_streaming_callback(generator):
            self.streaming["streaming_callback"] = callback
        self.component = _component_name(settings["caller"])
        indexes = settings["indexes"]
        self.indexes = list(indexes) if indexes is not None else [*range(len(prompts))] if len(prompts) > 1 else [None]
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

    def _failed(self, index: int, error: Exception) -> Outcome:
        if self.raise_if is not None and self.raise_if(error):
            raise error
        failure = CallFailure.of(error, component=self.component, index=self.indexes[index])
        logger.warning("An LLM call failed and counts as an abstention: {failure}", failure=failure)
        return None, failure

    def run(self, index: int) -> Outcome:
        messages = self.prompts[index]
        try:
            with self._span(messages) as span:
                return self._outcome(span, self.generator.run(messages=messages, **self.kwargs, **self.streaming))
        except Exception as error:
            return self._failed(index, error)

    async def run_async(self, index: int) -> Outcome:
        messages = self.prompts[index]
        try:
            with self._span(messages) as span:
                result = await run_generator_async(self.generator, messages=messages, **self.kwargs, **self.streaming)
                return self._outcome(span, result)
        except Exception as error:
            return self._failed(index, error)


def _result(outcomes: list[Outcome]) -> FanOutResult:
    replies, errors = [reply for reply, _ in outcomes], [error for _, error in outcomes]
    usage = sum_usage(reply_usage(reply) for reply in replies)
    usage["failed_calls"] = sum(error is not None for error in errors)
    for error in errors:
        if error is not None:
            record(error)  # in the run under way, in input order
    return FanOutResult(replies=replies, errors=errors, usage=usage)


def run_chat_calls(
    chat_generator: ChatGenerator,
    prompts: list[list[ChatMessage]],
    *,
    max_concurrency: int | None = None,
    generation_kwargs: dict[str, Any] | None = None,
    raise_on_failure: bool = False,
    raise_if: Callable[[Exception], bool] | None = None,
    streaming_callback: StreamingCallbackT | None = None,
    caller: Any = None,
    indexes: Sequence[int] | None = None,
) -> FanOutResult:
    """
    One ChatGenerator call per prompt in a thread pool, each in a copy of the caller's context; a failed call is an
    abstention, logged and recorded as a `CallFailure` (also in `failures.failed_run`).

    :param raise_on_failure: Re-raise the first failure (queued calls never start); `raise_if`: those it is true for.
    :param caller: The calling component (each `CallFailure.component`); `indexes`: each `CallFailure.index`.
    :returns: A `FanOutResult` in input order.
    :raises ValueError: If `max_concurrency` is not None or an integer >= 1.
    :raises Exception: A failure re-raised by `raise_on_failure` or `raise_if`.
    """
    settings = {key: value for key, value in locals().items() if key not in ("chat_generator", "prompts")}
    calls = _Calls(chat_generator, prompts, **settings)
    if not prompts:
        return _result([])
    failed = threading.Event()

    def call(index: int) -> Outcome:
        if failed.is_set():  # a call re-raised its failure: the queued ones never start (nor count: it raises)
            return None, None
        try:
            return calls.run(index)
        except Exception:
            failed.set()
            raise

    pool = ThreadPoolExecutor(max_workers=min(max_concurrency or len(prompts), len(prompts)))
    try:
        futures = [pool.submit(contextvars.copy_context().run, call, index) for index in range(len(prompts))]
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
    streaming_callback: StreamingCallbackT | None = None,
    caller: Any = None,
    indexes: Sequence[int] | None = None,
) -> FanOutResult:
    """Async form of `run_chat_calls`; a re-raised failure cancels the other calls."""
    settings = {key: value for key, value in locals().items() if key not in ("chat_generator", "prompts")}
    calls = _Calls(chat_generator, prompts, **settings)
    semaphore = asyncio.Semaphore(max_concurrency or max(1, len(prompts)))

    async def bounded(index: int) -> Outcome:
        async with semaphore:
            try:
                return await calls.run_async(index)
            except Exception:  # re-raised: cancel the others before this call's turn goes to a waiting one
                for task in tasks:
                    if task is not asyncio.current_task():
                        task.cancel()
                raise

    tasks = [asyncio.ensure_future(bounded(index)) for index in range(len(prompts))]
    try:
        return _result(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # none outlives the fan-out
        raise
