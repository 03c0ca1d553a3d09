"""
The one fan-out of independent ChatGenerator calls (one per passage, per sample, per candidate ...), as Haystack's
`LLMMetadataExtractor` does it: threads for `run`, a semaphore and `gather` for `run_async`. A failed call is an
abstention, logged and recorded, while the other calls go on. Retries and timeouts belong to the generator.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from haystack import logging, tracing
from haystack.components.generators.chat.types import ChatGenerator
from haystack.dataclasses import ChatMessage

from haystack_fusion.llm.limits import unwrap_call_limit
from haystack_fusion.llm.usage import empty_usage, reply_usage, sum_usage

logger = logging.getLogger(__name__)

INPUT_TOKENS_TAG = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS_TAG = "gen_ai.usage.output_tokens"
"""A call's token counts on its span, as OpenTelemetry's semantic conventions for generative AI name them."""

Outcome = tuple[ChatMessage | None, str | None]


def check_max_concurrency(max_concurrency: int | None) -> int | None:
    """
    :returns: `max_concurrency` unchanged: None (all calls of a round at once) or an integer >= 1.
    :raises ValueError: If it is neither.
    """
    if max_concurrency is not None and (
        isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1
    ):
        raise ValueError(
            f"`max_concurrency` must be None (all calls of a round at once) or an integer >= 1, got {max_concurrency!r}"
        )
    return max_concurrency


@dataclass
class FanOutResult:
    """
    What a fan-out of n independent calls returned, in input order.

    :param replies: n entries: each call's first reply, or None where it failed or returned no reply.
    :param errors: n entries: None, or `"ExceptionType: message"` for a failed call.
    :param usage: Summed usage (`llm.usage`): `prompt_tokens`, `completion_tokens` (tokens), `calls`,
        `failed_calls`, and `cached_tokens` / `truncated` when any reply reported them.
    """

    replies: list[ChatMessage | None]
    errors: list[str | None]
    usage: dict[str, int] = field(default_factory=empty_usage)

    @property
    def failures(self) -> list[dict[str, Any]]:
        """The failed calls as `{"index": i, "error": "..."}` dicts, ready for an answer's `meta`."""
        return [{"index": i, "error": error} for i, error in enumerate(self.errors) if error is not None]


class _Call:
    """One call of a fan-out, in a `haystack.chat_generator.run` span (a child of the caller's), as Haystack's own
    components trace their generator calls; the span is tagged with the reply's token counts."""

    def __init__(self, generator: Any, kwargs: dict[str, Any], raise_if: Callable[[Exception], bool] | None) -> None:
        self.generator, self.kwargs, self.raise_if = generator, kwargs, raise_if
        self.parent = tracing.tracer.current_span()
        self.tags = {"haystack.component.name": "chat_generator"}
        self.tags["haystack.component.type"] = type(unwrap_call_limit(generator)).__name__

    def _span(self) -> Any:
        return tracing.tracer.trace("haystack.chat_generator.run", tags=self.tags, parent_span=self.parent)

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
            with self._span() as span:
                span.set_content_tag("haystack.component.input", {"messages": messages, **self.kwargs})
                return self._outcome(span, self.generator.run(messages=messages, **self.kwargs))
        except Exception as error:
            return self._failed(error)

    async def run_async(self, messages: list[ChatMessage]) -> Outcome:
        try:
            with self._span() as span:
                span.set_content_tag("haystack.component.input", {"messages": messages, **self.kwargs})
                if hasattr(self.generator, "run_async"):
                    result = await self.generator.run_async(messages=messages, **self.kwargs)
                else:
                    result = await asyncio.to_thread(self.generator.run, messages=messages, **self.kwargs)
                return self._outcome(span, result)
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
    Call the generator's `run` once per prompt, in a `ThreadPoolExecutor` of this fan-out's own; each call runs in a
    copy of the caller's context, so its span nests under the caller's.

    :param chat_generator: Any Haystack ChatGenerator (through a `CallLimitedChatGenerator`, each call holds one of
        the process-wide slots).
    :param prompts: n prompts, each a list of ChatMessage.
    :param max_concurrency: None: all n calls at once; an integer >= 1: at most that many under way at once.
    :param generation_kwargs: Passed to every call when given.
    :param raise_on_failure: Re-raise the first failure (calls not yet started never start) instead of recording it.
    :param raise_if: Re-raise a failure for which `raise_if(error)` is true (`llm.backend_unusable`), record others.
    :returns: A `FanOutResult` with n replies and n errors in input order.
    :raises ValueError: If `max_concurrency` is not None or an integer >= 1.
    :raises Exception: A failure re-raised by `raise_on_failure` or `raise_if` (`RuntimeError` for no reply).
    """
    check_max_concurrency(max_concurrency)
    if not prompts:
        return _result([])
    kwargs = {"generation_kwargs": generation_kwargs} if generation_kwargs else {}
    call = _Call(chat_generator, kwargs, (lambda _: True) if raise_on_failure else raise_if)
    pool = ThreadPoolExecutor(max_workers=min(max_concurrency or len(prompts), len(prompts)))
    failed = threading.Event()

    def start(messages: list[ChatMessage]) -> Outcome:
        if failed.is_set():  # a call re-raised its failure: the queued ones never start
            return None, "CancelledError: another call failed"
        try:
            return call.run(messages)
        except Exception:
            failed.set()
            raise

    try:
        futures = [pool.submit(contextvars.copy_context().run, start, messages) for messages in prompts]
        wait(futures, return_when=FIRST_EXCEPTION)
        for future in futures:
            if future.done() and future.exception() is not None:
                raise future.exception()  # type: ignore[misc]
        return _result([future.result() for future in futures])
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # after a re-raised failure, queued calls never start


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
    kwargs = {"generation_kwargs": generation_kwargs} if generation_kwargs else {}
    call = _Call(chat_generator, kwargs, (lambda _: True) if raise_on_failure else raise_if)
    semaphore = asyncio.Semaphore(max_concurrency or max(1, len(prompts)))

    async def bounded(messages: list[ChatMessage]) -> Outcome:
        async with semaphore:
            try:
                return await call.run_async(messages)
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
