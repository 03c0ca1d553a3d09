"""Speculative post-fusion: post-fusion's calls started beside concatenation's, cancelled when its answer holds."""

from __future__ import annotations

import asyncio
import math
import threading
import weakref
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from haystack import Document, component
from haystack.dataclasses import ChatMessage

from haystack_fusion.llm import ChatGeneratorWrapper, reply_usage, run_chat_calls_async, run_generator_async, sum_usage

if TYPE_CHECKING:
    from asyncio import AbstractEventLoop

    from haystack_fusion.components.post_fusion_voter import PostFusionVoter
    from haystack_fusion.llm import FanOutResult, Round

CHARS_PER_TOKEN = 4.0  # a cancelled call's prompt tokens: its characters / 4 (OpenAI's rule of thumb for English)

_LOOP: list[asyncio.AbstractEventLoop] = []
_LOCK = threading.Lock()


def _loop() -> asyncio.AbstractEventLoop:
    """The process's one event loop for `Pipeline.run`'s speculative calls, in a daemon thread started on first use:
    one loop, as an async client stays on the loop it first ran on (`llm.run_generator_async`)."""
    with _LOCK:
        if not _LOOP:
            _LOOP.append(asyncio.new_event_loop())
            threading.Thread(target=_LOOP[0].run_forever, name="speculation", daemon=True).start()
        return _LOOP[0]


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

    def __init__(self, voter: PostFusionVoter, query: str, documents: list[Document], loop: AbstractEventLoop) -> None:
        self.round, self.taken, self.cancelled = next(voter._rounds(query, documents)), False, False
        self._calls = _Calls(voter._chat_generator)
        calls = run_chat_calls_async(self._calls, self.round.prompts, **voter._settings(self.round))  # type: ignore[arg-type]
        self._future = asyncio.run_coroutine_threadsafe(calls, loop)
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
    generator's `run_async`, for `run` on the process's speculation thread), else hands it on (`fallback_speculation`)
    to the `PostFusionVoter`, which takes them.
    """

    _COMPONENTS = ("voter",)

    def __init__(self, *, voter: PostFusionVoter) -> None:
        """:param voter: The voter whose round it starts (the pipeline's, or one with its settings)."""
        self._voter, self._chat_generator = voter, voter._chat_generator

    @component.output_types(speculation=Speculation)
    def run(self, query: str, documents: list[Document]) -> dict[str, Any]:
        """:returns: `speculation`, the round under way. :raises ValueError: If `query` is empty or whitespace."""
        return {"speculation": Speculation(self._voter, query, documents, _loop())}

    @component.output_types(speculation=Speculation)
    async def run_async(self, query: str, documents: list[Document]) -> dict[str, Any]:
        """Async form of `run`: the calls are tasks of the running loop."""
        return {"speculation": Speculation(self._voter, query, documents, asyncio.get_running_loop())}
