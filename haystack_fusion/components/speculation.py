"""Speculative post-fusion: post-fusion's calls started beside concatenation's, cancelled when its answer holds."""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import math
import threading
import weakref
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING, Any

from anyio.from_thread import BlockingPortal, start_blocking_portal
from haystack import Document, component
from haystack.dataclasses import ChatMessage

from haystack_fusion.llm import ChatGeneratorWrapper, reply_usage, run_chat_calls_async, run_generator_async, sum_usage

if TYPE_CHECKING:
    from haystack_fusion.components.post_fusion_voter import PostFusionVoter
    from haystack_fusion.llm import FanOutResult, Round

CHARS_PER_TOKEN = 4.0  # a cancelled call's prompt tokens: its characters / 4 (OpenAI's rule of thumb for English)

_PORTAL: list[BlockingPortal] = []
_LOCK = threading.Lock()
Start = Callable[[Callable[[], Coroutine[Any, Any, Any]]], Future]


def _portal() -> BlockingPortal:
    """The process's one anyio blocking portal (an event loop in its own thread, started on first use, stopped at exit)
    for `Pipeline.run`'s speculative calls: one loop, as an async client stays on the loop it first ran on."""
    with _LOCK:
        if not _PORTAL:
            manager = start_blocking_portal()
            _PORTAL.append(portal := manager.__enter__())
            atexit.register(lambda: (portal.call(portal.stop, True), manager.__exit__(None, None, None)))
        return _PORTAL[0]


async def _in_context(context: contextvars.Context, calls: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """`calls()` as a task in the caller's `context` (where the run records its failed calls)."""
    return await asyncio.create_task(calls(), context=context)


def _start_on_portal(calls: Callable[[], Coroutine[Any, Any, Any]]) -> Future:
    return _portal().start_task_soon(_in_context, contextvars.copy_context(), calls)


class _Calls:
    """The round's generator, recording each call sent: its prompt's characters, its usage (None: under way)."""

    def __init__(self, generator: Any) -> None:
        self.generator = generator
        self.sent: dict[object, tuple[int, dict[str, int] | None]] = {}

    async def run_async(self, messages: list[ChatMessage], **inputs: Any) -> dict[str, Any]:
        key, chars = object(), sum(len(message.text or "") for message in messages)
        self.sent[key] = (chars, None)
        try:
            result = await run_generator_async(self.generator, messages=messages, **inputs)
        except Exception:
            self.sent[key] = (chars, {**reply_usage(None), "failed_calls": 1})
            raise
        self.sent[key] = (chars, reply_usage((result.get("replies") or [None])[0]))
        return result


class Speculation:
    """A `PostFusionVoter` round started on `loop`, in the caller's context, before it is known to be needed: the voter
    takes its calls (`take`), or the router cancels them (`cancel`). Copies are the same speculation; one dropped
    unsettled (the run failed first) is cancelled."""

    def __init__(self, voter: PostFusionVoter, query: str, documents: list[Document], start: Start) -> None:
        self.round, self.taken, self.cancelled = next(voter._rounds(query, documents)), False, False
        self._calls = _Calls(voter._chat_generator)
        settings = voter._settings(self.round)
        self._future = start(partial(run_chat_calls_async, self._calls, self.round.prompts, **settings))  # type: ignore[arg-type]
        weakref.finalize(self, self._future.cancel)

    def __deepcopy__(self, memo: dict[int, Any]) -> Speculation:
        return self

    def to_dict(self) -> dict[str, Any]:
        """What a pipeline snapshot shows of it (a failed run's): its calls, and whether taken or cancelled."""
        return {"calls": len(self.round.prompts), "taken": self.taken, "cancelled": self.cancelled}

    def take(self, step: Round) -> Future[FanOutResult] | None:
        """The calls, for the voter's round `step` when it is the speculated one (`ChatGeneratorWrapper._drive`'s
        `ahead`); else None, and they are cancelled."""
        if not self.taken and step.prompts and step == self.round:
            self.taken = True
            return self._future
        self.cancel()
        return None

    def cancel(self) -> None:
        """Cancel the calls under way: their requests are closed, their replies never read."""
        self.cancelled = not self.taken
        self._future.cancel()

    @property
    def usage(self) -> dict[str, int]:
        """What the voter does not count: `speculative_calls` (the calls sent) and, cancelled, the usage of every call
        sent, one under way (`cancelled_calls`) with its prompt's `estimated_prompt_tokens` (`CHARS_PER_TOKEN`, or the
        characters per token its round's ended calls reported)."""
        sent = list(self._calls.sent.values())
        if not self.cancelled:
            return {"speculative_calls": len(sent)}
        reported = [(chars, usage["prompt_tokens"]) for chars, usage in sent if usage and usage["prompt_tokens"]]
        per_token = sum(c for c, _ in reported) / sum(t for _, t in reported) if reported else CHARS_PER_TOKEN
        estimated = [math.ceil(chars / per_token) for chars, usage in sent if usage is None]
        n, tokens = len(estimated), sum(estimated)
        cut = {"calls": n, "cancelled_calls": n, "prompt_tokens": tokens, "estimated_prompt_tokens": tokens}
        return {**sum_usage([*(usage for _, usage in sent), cut]), "speculative_calls": len(sent)}


@component
class PostFusionSpeculator(ChatGeneratorWrapper):
    """
    Starts post-fusion's calls (its `voter`'s round) beside the concatenation call, so a question that falls back waits
    for the longer of the two rounds instead of their sum (Liu et al., section 3.3, run ahead). `UnknownRouter`
    cancels its `speculation` when it accepts concatenation's answer, closing their requests (they run on the
    generator's `run_async`; for `run`, on the process's anyio blocking portal), else hands it on
    (`fallback_speculation`) to the `PostFusionVoter`, which takes them.
    """

    _COMPONENTS = ("voter",)

    def __init__(self, *, voter: PostFusionVoter) -> None:
        """:param voter: The voter whose round it starts (the pipeline's, or one with its settings)."""
        self._voter, self._chat_generator = voter, voter._chat_generator

    @component.output_types(speculation=Speculation)
    def run(self, query: str, documents: list[Document]) -> dict[str, Any]:
        """:returns: `speculation`, the round under way. :raises ValueError: If `query` is empty or whitespace."""
        return {"speculation": Speculation(self._voter, query, documents, _start_on_portal)}

    @component.output_types(speculation=Speculation)
    async def run_async(self, query: str, documents: list[Document]) -> dict[str, Any]:
        """Async form of `run`: the calls are tasks of the running loop."""
        loop = asyncio.get_running_loop()
        start: Start = lambda calls: asyncio.run_coroutine_threadsafe(calls(), loop)  # noqa: E731
        return {"speculation": Speculation(self._voter, query, documents, start)}
