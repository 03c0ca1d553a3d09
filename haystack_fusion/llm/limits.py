"""
The process-wide limit on LLM calls in flight: N call slots shared by every fan-out, thread and event loop, and
`CallLimitedChatGenerator`, the ChatGenerator wrapper whose every call holds one.

The limit is `max_calls_in_flight` inside such a block (as the evaluation runner sets it for
`eval --max-calls-in-flight`), else `HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT` (`settings.calls_in_flight_limit_from_env`,
read at every call), else none. With a limit, every call waits for one of the N slots, first come first served, so a
rate-limited API's 429 storm slows a batch down instead of failing its calls. The fan-out
(`llm.fanout.run_chat_calls`) holds a slot for each of its calls; the calls a pipeline makes of a generator directly
(the concatenation stage's `llm` component) hold one through `CallLimitedChatGenerator`. A call made while its context
already holds a slot (a wrapped generator called by a fan-out) takes no second one.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from haystack import component, default_from_dict, default_to_dict
from haystack.components.generators.chat.types import ChatGenerator
from haystack.core.serialization import component_to_dict
from haystack.dataclasses import ChatMessage
from haystack.utils import deserialize_chatgenerator_inplace

from haystack_fusion.settings import calls_in_flight_limit_from_env

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
    return calls_in_flight_limit_from_env()


@contextlib.contextmanager
def max_calls_in_flight(limit: int | None) -> Iterator[None]:
    """
    Limit the LLM calls in flight in the whole process to `limit` while the block runs (as the evaluation runner does
    for `eval --max-calls-in-flight`); the environment's limit applies again after it.

    :param limit: An integer >= 1, or None for no limit inside the block.
    :raises ValueError: If `limit` is not None or an integer >= 1.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"`max_calls_in_flight` must be None (no limit) or an integer >= 1, got {limit!r}")
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


def _input_sockets(chat_generator: Any) -> dict[str, tuple[Any, Any]]:
    """
    The generator's inputs but `messages` (the wrapper's own, a list of ChatMessage), name -> (type, default): its
    component sockets, else its `run`'s parameters.
    """
    sockets = getattr(getattr(chat_generator, "__haystack_input__", None), "_sockets_dict", None)
    if sockets is not None:
        return {name: (s.type, s.default_value) for name, s in sockets.items() if name != "messages"}
    parameters = inspect.signature(chat_generator.run).parameters.values()
    return {
        p.name: (Any if p.annotation is inspect.Parameter.empty else p.annotation, p.default)
        for p in parameters
        if p.name != "messages" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def _output_types(chat_generator: Any) -> dict[str, Any]:
    """The generator's outputs, name -> type: its component sockets, else a ChatGenerator's `replies`."""
    sockets = getattr(getattr(chat_generator, "__haystack_output__", None), "_sockets_dict", None)
    if sockets is None:
        return {"replies": list[ChatMessage]}
    return {name: socket.type for name, socket in sockets.items()}


@component
class CallLimitedChatGenerator:
    """
    Wraps a ChatGenerator so that each of its calls holds one of the process-wide call slots while it runs.

    With no limit set (`max_calls_in_flight`, `HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT`) a call takes no slot and the
    wrapper only passes it on. With a limit of N, at most N calls are under way in the process at once, across this
    wrapper's calls, the fan-outs of every component and every thread and event loop; the others wait, first come
    first served. A call made where a slot is held already (a component's fan-out calling the wrapper) takes no
    second one. Retries and timeouts stay the wrapped generator's.

    The wrapper has the wrapped generator's inputs (`messages`, and those of `generation_kwargs`, `tools`,
    `streaming_callback` ... it accepts, with its defaults) and outputs (`replies`), and passes each call's inputs
    on unchanged. The package's strategy pipelines are built on one when the evaluation runner or the serving
    wrappers make them; our components and the fan-out read the wrapped generator's settings through it
    (`unwrap_call_limit`).

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
        """
        Create a CallLimitedChatGenerator.

        :param chat_generator: The ChatGenerator to call (any Haystack ChatGenerator, or another component with a
            `run(messages=...)` that returns `replies`).
        """
        self.chat_generator = chat_generator
        for name, (socket_type, default) in _input_sockets(chat_generator).items():
            component.set_input_type(self, name, socket_type, default)
        component.set_output_types(self, **_output_types(chat_generator))

    def warm_up(self) -> None:
        """Warm up the wrapped generator (idempotent)."""
        if hasattr(self.chat_generator, "warm_up"):
            self.chat_generator.warm_up()

    async def warm_up_async(self) -> None:
        """Warm up the wrapped generator on the running event loop: its `warm_up_async`, else its `warm_up`."""
        if hasattr(self.chat_generator, "warm_up_async"):
            await self.chat_generator.warm_up_async()
        elif hasattr(self.chat_generator, "warm_up"):
            self.chat_generator.warm_up()

    def close(self) -> None:
        """Release the wrapped generator's resources."""
        if hasattr(self.chat_generator, "close"):
            self.chat_generator.close()

    async def close_async(self) -> None:
        """Release the wrapped generator's async resources: its `close_async`, else its `close`."""
        if hasattr(self.chat_generator, "close_async"):
            await self.chat_generator.close_async()
        elif hasattr(self.chat_generator, "close"):
            self.chat_generator.close()

    def to_dict(self) -> dict[str, Any]:
        """
        Serialize this component, with the wrapped generator, to a dictionary.

        :returns: The dictionary: `type` and `init_parameters` (`chat_generator`, the wrapped generator's own).
        """
        return default_to_dict(self, chat_generator=component_to_dict(obj=self.chat_generator, name="chat_generator"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CallLimitedChatGenerator:
        """
        Deserialize this component, with the wrapped generator, from a dictionary.

        :param data: What `to_dict` returned.
        :returns: The component.
        """
        deserialize_chatgenerator_inplace(data["init_parameters"], key="chat_generator")
        return default_from_dict(cls, data)

    def run(self, messages: list[ChatMessage], **kwargs: Any) -> dict[str, Any]:
        """
        Call the wrapped generator while holding a call slot (waiting for one when all are taken).

        :param messages: The conversation to send.
        :param kwargs: The wrapped generator's other inputs (`generation_kwargs`, `tools`, `streaming_callback` ...),
            passed on as given.
        :returns: What the wrapped generator returned: a dictionary with `replies`, a list of ChatMessage.
        :raises ValueError: If `HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT` is set to anything but an integer >= 1.
        :raises Exception: What the wrapped generator raised.
        """
        with call_slot():
            return self.chat_generator.run(messages=messages, **kwargs)

    async def run_async(self, messages: list[ChatMessage], **kwargs: Any) -> dict[str, Any]:
        """
        Async form of `run`, with the same inputs, outputs and errors; waits for its slot without blocking the loop.

        Calls the wrapped generator's `run_async`, or its `run` in a worker thread when it has none.
        """
        async with call_slot_async():
            run_async = getattr(self.chat_generator, "run_async", None)
            if run_async is None:
                return await asyncio.to_thread(self.chat_generator.run, messages=messages, **kwargs)
            return await run_async(messages=messages, **kwargs)


def unwrap_call_limit(chat_generator: Any) -> Any:
    """
    The generator a `CallLimitedChatGenerator` wraps (through any number of them), or `chat_generator` itself.

    What to read a generator's own settings from (`generation_kwargs`, its class, its HTTP clients): the wrapper only
    adds a call slot to its calls.
    """
    while isinstance(chat_generator, CallLimitedChatGenerator):
        chat_generator = chat_generator.chat_generator
    return chat_generator
