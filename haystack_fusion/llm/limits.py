"""
The process-wide limit on LLM calls in flight: `CallLimitedChatGenerator`, whose every call holds one of N slots of a
`threading.BoundedSemaphore` shared by every thread and event loop.

N is `max_calls_in_flight` inside such a block (`eval --max-calls-in-flight`), else
`HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT` (read at every call), else no limit. With a limit, a rate-limited API's 429
storm slows a batch down instead of failing its calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Iterator
from typing import Any

from haystack import component, default_from_dict, default_to_dict
from haystack.components.generators.chat.types import ChatGenerator
from haystack.core.serialization import component_to_dict
from haystack.dataclasses import ChatMessage
from haystack.utils import deserialize_chatgenerator_inplace

from haystack_fusion.settings import calls_in_flight_limit_from_env

_LOCK = threading.Lock()
_OVERRIDES: list[int | None] = []  # the `max_calls_in_flight` blocks under way, innermost last
_SEMAPHORES: dict[int, threading.BoundedSemaphore] = {}
_ASYNC_POLL = 0.05
"""Seconds a coroutine's wait blocks a worker thread at a time: waiters never hold every thread a call may need."""


def calls_in_flight_limit() -> int | None:
    """
    :returns: The innermost `max_calls_in_flight` block's limit, else `HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT`, else
        None (no limit).
    :raises ValueError: If the environment variable is set to anything but an integer >= 1.
    """
    with _LOCK:
        if _OVERRIDES:
            return _OVERRIDES[-1]
    return calls_in_flight_limit_from_env()


@contextlib.contextmanager
def max_calls_in_flight(limit: int | None) -> Iterator[None]:
    """
    Limit the calls in flight of the whole process to `limit` (None: no limit) while the block runs.

    :raises ValueError: If `limit` is not None or an integer >= 1.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"`max_calls_in_flight` must be None (no limit) or an integer >= 1, got {limit!r}")
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


@component
class CallLimitedChatGenerator:
    """
    Wraps a ChatGenerator so that each of its calls holds one of the process-wide call slots while it runs.

    With no limit it only passes calls on. With a limit of N, at most N calls through such wrappers are under way in
    the process at once, from any thread or event loop; the others wait. Retries and timeouts stay the wrapped
    generator's. Its inputs are the wrapped generator's (`messages`, `generation_kwargs`, `tools` ...); its output
    is `replies`.

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
        """:param chat_generator: The ChatGenerator to call (any component whose `run(messages=...)` returns
        `replies`)."""
        self.chat_generator = chat_generator
        for parameter in inspect.signature(chat_generator.run).parameters.values():
            if parameter.name != "messages" and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                component.set_input_type(self, parameter.name, Any, parameter.default)
        component.set_output_types(self, replies=list[ChatMessage])

    def warm_up(self) -> None:
        """Warm up the wrapped generator (idempotent)."""
        if hasattr(self.chat_generator, "warm_up"):
            self.chat_generator.warm_up()

    async def warm_up_async(self) -> None:
        """Warm up the wrapped generator on the running loop: its `warm_up_async`, else its `warm_up`."""
        await self.chat_generator.warm_up_async() if hasattr(self.chat_generator, "warm_up_async") else self.warm_up()

    def close(self) -> None:
        """Release the wrapped generator's resources."""
        if hasattr(self.chat_generator, "close"):
            self.chat_generator.close()

    async def close_async(self) -> None:
        """Release the wrapped generator's async resources: its `close_async`, else its `close`."""
        await self.chat_generator.close_async() if hasattr(self.chat_generator, "close_async") else self.close()

    def to_dict(self) -> dict[str, Any]:
        """:returns: `type` and `init_parameters` (`chat_generator`, the wrapped generator's own dictionary)."""
        return default_to_dict(self, chat_generator=component_to_dict(obj=self.chat_generator, name="chat_generator"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CallLimitedChatGenerator:
        """:returns: The component `to_dict` described, with its wrapped generator."""
        deserialize_chatgenerator_inplace(data["init_parameters"], key="chat_generator")
        return default_from_dict(cls, data)

    def run(self, messages: list[ChatMessage], **kwargs: Any) -> dict[str, Any]:
        """
        Call the wrapped generator while holding a call slot (waiting for one when all are taken).

        :param messages: The conversation to send.
        :param kwargs: The wrapped generator's other inputs, passed on as given.
        :returns: What the wrapped generator returned: `replies`, a list of ChatMessage.
        :raises ValueError: If `HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT` is set to anything but an integer >= 1.
        :raises Exception: What the wrapped generator raised.
        """
        with _semaphore() or contextlib.nullcontext():
            return self.chat_generator.run(messages=messages, **kwargs)

    async def run_async(self, messages: list[ChatMessage], **kwargs: Any) -> dict[str, Any]:
        """Async form of `run` (same inputs, outputs, errors): waits for its slot without blocking the loop, then
        calls the wrapped generator's `run_async`, or its `run` in a worker thread."""
        semaphore = _semaphore()
        if semaphore is not None:
            await _acquire_async(semaphore)
        try:
            if hasattr(self.chat_generator, "run_async"):
                return await self.chat_generator.run_async(messages=messages, **kwargs)
            return await asyncio.to_thread(self.chat_generator.run, messages=messages, **kwargs)
        finally:
            if semaphore is not None:
                semaphore.release()


def unwrap_call_limit(chat_generator: Any) -> Any:
    """The generator a `CallLimitedChatGenerator` wraps (where its own settings are read), or `chat_generator`."""
    while isinstance(chat_generator, CallLimitedChatGenerator):
        chat_generator = chat_generator.chat_generator
    return chat_generator
