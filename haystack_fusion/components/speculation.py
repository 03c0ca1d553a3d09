"""Speculative post-fusion: post-fusion's calls started beside concatenation's, cancelled when its answer holds."""

from __future__ import annotations

import asyncio
import atexit
import math
import threading
import weakref
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING, Any

from anyio.from_thread import BlockingPortal, start_blocking_portal
from haystack import Document, component
from haystack.dataclasses import ChatMessage

from haystack_fusion.llm import (
    ChatGeneratorWrapper,
    FanOutResult,
    Round,
    Rounds,
    _run_async,
    reply_usage,
    run_chat_calls_async,
    sum_usage,
)

if TYPE_CHECKING:
    from haystack_fusion.components.post_fusion_voter import PostFusionVoter

CHARS_PER_TOKEN = 4.0
"""A cancelled call's prompt tokens, when no call of its round reported any: its characters / 4 (OpenAI's rule of
thumb for English); else its characters at the round's reported characters per prompt token."""

_PORTAL: list[BlockingPortal] = []
_PORTAL_LOCK = threading.Lock()


def _portal() -> BlockingPortal:
    """The process's one event-loop thread for `Pipeline.run`'s speculative calls (anyio's blocking portal, a daemon
    thread started on first use, stopped at exit): one loop, as an async client stays on the loop it first ran on."""
    with _PORTAL_LOCK:
        if not _PORTAL:
            manager = start_blocking_portal()
            _PORTAL.append(portal := manager.__enter__())
            atexit.register(lambda: (portal.call(portal.stop, True), manager.__exit__(None, None, None)))
        return _PORTAL[0]


class _Calls:
    """The speculative round's generator: the prompt characters of the calls under way, the usage of those that
    ended (a cancelled call stays under way: its reply is never read)."""

    def __init__(self, generator: Any) -> None:
        self.generator, self.lock = generator, threading.Lock()
        self.under_way: dict[object, int] = {}
        self.ended: list[tuple[int, dict[str, int]]] = []

    async def run_async(self, messages: list[ChatMessage], **inputs: Any) -> dict[str, Any]:
        key = object()
        with self.lock:
            self.under_way[key] = sum(len(message.text or "") for message in messages)
        try:
            result = await _run_async(self.generator, messages=messages, **inputs)
        except Exception:
            self._end(key, {**reply_usage(None), "failed_calls": 1})
            raise
        self._end(key, reply_usage((result.get("replies") or [None])[0]))
        return result

    def _end(self, key: object, usage: dict[str, int]) -> None:
        with self.lock:
            self.ended.append((self.under_way.pop(key), usage))

    def usage(self, cancelled: bool) -> dict[str, int]:
        """`speculative_calls` (calls sent); `cancelled`: also every call sent, each with its reported tokens or, under
        way, its prompt's estimated tokens (`cancelled_calls`, `estimated_prompt_tokens`; `CHARS_PER_TOKEN`)."""
        with self.lock:
            ended, under_way = list(self.ended), list(self.under_way.values())
        sent = {"speculative_calls": len(ended) + len(under_way)}
        if not cancelled:
            return sent
        reported = [(chars, usage["prompt_tokens"]) for chars, usage in ended if usage["prompt_tokens"]]
        per_token = sum(c for c, _ in reported) / sum(t for _, t in reported) if reported else CHARS_PER_TOKEN
        estimates = [math.ceil(chars / per_token) for chars in under_way]
        cancelled_calls = [
            {"calls": 1, "cancelled_calls": 1, "prompt_tokens": n, "estimated_prompt_tokens": n} for n in estimates
        ]
        return {**sum_usage([*(usage for _, usage in ended), *cancelled_calls]), **sent}


def _send(rounds: Rounds, calls: FanOutResult | None) -> Any:
    """What a one-round component's `rounds` returns given its round's calls."""
    try:
        rounds.send(calls)
    except StopIteration as done:
        return done.value
    raise RuntimeError("a speculated component has one round")


def _replay(step: Round, rounds: Rounds) -> Rounds:
    """`rounds` whose first round, `step`, was already taken from it."""
    return _send(rounds, (yield step))


class Speculation:
    """
    A `PostFusionVoter` round started before it is known to be needed (`PostFusionSpeculator`): the voter takes its
    calls (`drive`), or the router cancels them (`cancel`). Copies are the same speculation; a speculation dropped
    unsettled (the run failed first) is cancelled.

    :param round: The voter's round it runs.
    """

    def __init__(self, step: Round, voter: PostFusionVoter, portal: BlockingPortal | None) -> None:
        self.round, self.taken, self.cancelled = step, False, False
        self._calls = _Calls(voter._chat_generator)
        calls = partial(run_chat_calls_async, self._calls, step.prompts, **voter._settings(step))  # type: ignore[arg-type]
        self._future: Future[FanOutResult] | asyncio.Future[FanOutResult] = (
            portal.start_task_soon(calls) if portal is not None else asyncio.ensure_future(calls())
        )
        weakref.finalize(self, self._future.cancel)

    def __deepcopy__(self, memo: dict[int, Any]) -> Speculation:
        return self

    @property
    def usage(self) -> dict[str, int]:
        """The speculative calls' usage the voter's does not count (`_Calls.usage`)."""
        return self._calls.usage(self.cancelled)

    def cancel(self) -> None:
        """Cancel the calls under way: their requests are closed, their replies never read."""
        self.cancelled = not self.taken
        self._future.cancel()
        if self._future.done() and not self._future.cancelled():
            self._future.exception()  # retrieved: a failure of calls no one waits for is not logged

    def _take(self, step: Round) -> bool:
        """Whether the voter's round `step` (with prompts) is the speculated one; cancelled when it is not."""
        self.taken = bool(step.prompts) and step == self.round
        if not self.taken:
            self.cancel()
        return self.taken

    def drive(self, voter: PostFusionVoter, rounds: Rounds) -> Any:
        """`voter._drive(rounds)`, the speculated calls (waited for) as its round's when the prompts are the same."""
        step = next(rounds)
        return _send(rounds, self._future.result()) if self._take(step) else voter._drive(_replay(step, rounds))

    async def drive_async(self, voter: PostFusionVoter, rounds: Rounds) -> Any:
        """Async form of `drive`."""
        step = next(rounds)
        if not self._take(step):
            return await voter._drive_async(_replay(step, rounds))
        calls: FanOutResult = await asyncio.wrap_future(self._future)  # type: ignore[arg-type]
        return _send(rounds, calls)


@component
class PostFusionSpeculator(ChatGeneratorWrapper):
    """
    Starts post-fusion's calls (its `voter`'s round) beside the concatenation call, so a question that falls back waits
    for the longer of the two rounds instead of their sum (Liu et al., section 3.3, run ahead). `UnknownRouter`
    cancels its `speculation` when it accepts concatenation's answer, else hands it on (`fallback_speculation`) to the
    `PostFusionVoter`, which waits for these calls instead of making its own. `run` makes them with the generator's
    `run_async` on the process's speculation thread (an anyio blocking portal), `run_async` on the running loop, so
    cancelling closes their requests. Its usage (`Speculation.usage`) counts every call the voter does not.
    """

    _COMPONENTS = ("voter",)

    def __init__(self, *, voter: PostFusionVoter) -> None:
        """:param voter: The voter whose round it starts (the pipeline's, or one with its settings)."""
        self._voter = voter
        self._chat_generator = voter._chat_generator

    @component.output_types(speculation=Speculation)
    def run(self, query: str, documents: list[Document]) -> dict[str, Any]:
        """:returns: `speculation`, the round under way. :raises ValueError: If `query` is empty or whitespace."""
        return {"speculation": Speculation(next(self._voter._rounds(query, documents)), self._voter, _portal())}

    @component.output_types(speculation=Speculation)
    async def run_async(self, query: str, documents: list[Document]) -> dict[str, Any]:
        """Async form of `run`: the calls are tasks of the running loop."""
        return {"speculation": Speculation(next(self._voter._rounds(query, documents)), self._voter, None)}
