"""
What a served wrapper admits: a bound on the question's length and a process-wide admission limit with a bounded
queue, so that overload is refused at once with HTTP 503 instead of piling up until clients time out.

- `ServingLimits`: the settings, read from the environment by the Hayhooks wrappers at setup
  (`HAYSTACK_FUSION_MAX_IN_FLIGHT`, `HAYSTACK_FUSION_MAX_WAITING`, `HAYSTACK_FUSION_QUEUE_TIMEOUT`,
  `HAYSTACK_FUSION_MAX_QUESTION_CHARS`).
- `AdmissionLimit`: at most `max_in_flight` requests run at once; up to `max_waiting` more wait for a slot in arrival
  order, each for at most `queue_timeout` seconds; any other request is refused with `ServerBusyError`. One per
  process (`admission_limit`), shared by every wrapper, because they share the backend (the embedded model runs one
  call at a time).

Needs no extra: `serving.hayhooks` turns `ServerBusyError` into HTTP 503 with a `Retry-After` header.
"""

from __future__ import annotations

import asyncio
import collections
import math
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from haystack import logging

logger = logging.getLogger(__name__)

DEFAULT_MAX_IN_FLIGHT = {"local": 1, "openai": 32, "ollama": 4}
"""Requests run at once by default, per LLM kind: the embedded model answers one call at a time, so one request runs
and the others queue; a hosted API takes many; an Ollama server on one machine, a few."""

DEFAULT_MAX_WAITING = 64
"""Requests that may wait for a slot by default; the next ones are refused at once."""

DEFAULT_QUEUE_TIMEOUT = 30.0
"""Seconds a request waits for a slot by default before it is refused."""

DEFAULT_MAX_QUESTION_CHARS = 2000
"""The longest question served by default, in characters (the SQuAD 2.0 dev questions have at most a few hundred)."""


_VARIABLES = {
    "max_in_flight": "HAYSTACK_FUSION_MAX_IN_FLIGHT",
    "max_waiting": "HAYSTACK_FUSION_MAX_WAITING",
    "queue_timeout": "HAYSTACK_FUSION_QUEUE_TIMEOUT",
    "max_question_chars": "HAYSTACK_FUSION_MAX_QUESTION_CHARS",
}


class ServerBusyError(RuntimeError):
    """
    A request the admission limit refused: too many waiting, or no slot within the queue timeout.

    :param message: One line saying why, with the limit's figures.
    :param retry_after: Seconds after which a retry may find a slot (for the `Retry-After` header), at least 1.
    """

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class ServingLimits:
    """
    The limits a served wrapper applies before it runs a question.

    :param max_in_flight: Requests that run at once, process-wide (>= 1).
    :param max_waiting: Requests that may wait for a slot (>= 0); the next ones are refused at once.
    :param queue_timeout: Seconds a request waits for a slot before it is refused (> 0).
    :param max_question_chars: The longest question served, in characters after stripping (>= 1).
    :raises ValueError: If a value is out of its range, naming the parameter.
    """

    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT["openai"]
    max_waiting: int = DEFAULT_MAX_WAITING
    queue_timeout: float = DEFAULT_QUEUE_TIMEOUT
    max_question_chars: int = DEFAULT_MAX_QUESTION_CHARS

    def __post_init__(self) -> None:
        if self.max_in_flight < 1:
            raise ValueError(f"`max_in_flight` must be at least 1, got {self.max_in_flight}")
        if self.max_waiting < 0:
            raise ValueError(f"`max_waiting` must be at least 0, got {self.max_waiting}")
        if not self.queue_timeout > 0:
            raise ValueError(f"`queue_timeout` must be a positive number of seconds, got {self.queue_timeout}")
        if self.max_question_chars < 1:
            raise ValueError(f"`max_question_chars` must be at least 1, got {self.max_question_chars}")

    @classmethod
    def from_env(cls, llm: str, env: Mapping[str, str] | None = None) -> ServingLimits:
        """
        The limits the environment sets, else the defaults for the LLM kind.

        Reads `HAYSTACK_FUSION_MAX_IN_FLIGHT` (default `DEFAULT_MAX_IN_FLIGHT[llm]`: 1 for the embedded model, 32
        for OpenAI, 4 for Ollama), `HAYSTACK_FUSION_MAX_WAITING` (64), `HAYSTACK_FUSION_QUEUE_TIMEOUT` (seconds, 30)
        and `HAYSTACK_FUSION_MAX_QUESTION_CHARS` (2000).

        :param llm: "local", "openai" or "ollama" (`BackendConfig.llm`).
        :param env: The environment (default `os.environ`).
        :raises ValueError: If a variable is not a number or is out of range, naming the variable.
        """
        env = os.environ if env is None else env
        values: dict[str, float | int] = {}
        for name, variable in _VARIABLES.items():
            cast = float if name == "queue_timeout" else int
            raw = env.get(variable)
            if not raw:
                continue
            try:
                values[name] = cast(raw)
            except ValueError:
                raise ValueError(f"{variable} must be a number, got {raw!r}") from None
        values.setdefault("max_in_flight", DEFAULT_MAX_IN_FLIGHT.get(llm, DEFAULT_MAX_IN_FLIGHT["openai"]))
        for name, value in values.items():
            try:
                cls(**{name: value})  # type: ignore[arg-type]
            except ValueError as error:
                raise ValueError(f"{_VARIABLES[name]}: {error}") from None
        return cls(**values)  # type: ignore[arg-type]

    def check_question(self, question: str) -> None:
        """
        :raises ValueError: If the stripped question is longer than `max_question_chars`, giving both lengths (and
            not the question).
        """
        length = len(question.strip())
        if length > self.max_question_chars:
            raise ValueError(
                f"The question has {length} characters; this server answers questions of at most "
                f"{self.max_question_chars} characters"
            )


class Slot:
    """A place taken in an `AdmissionLimit`; `release` gives it back (it may be called more than once)."""

    def __init__(self, limit: AdmissionLimit) -> None:
        self._limit: AdmissionLimit | None = limit

    def release(self) -> None:
        """Give the place back: to the longest-waiting request, else to the pool. Idempotent."""
        limit, self._limit = self._limit, None
        if limit is not None:
            limit._release()


class AdmissionLimit:
    """
    At most `max_in_flight` requests at once; up to `max_waiting` more wait in arrival order, each at most
    `queue_timeout` seconds; the others are refused with `ServerBusyError` (HTTP 503 from the wrappers).

    For requests served on one asyncio event loop (Hayhooks' async endpoints). A slot freed by a request goes straight
    to the longest-waiting one, so a request that arrives later cannot overtake the queue.

    ### Usage example
    ```python
    import asyncio

    from haystack_fusion.serving.limits import AdmissionLimit, ServerBusyError

    limit = AdmissionLimit(max_in_flight=1, max_waiting=0, queue_timeout=1.0)


    async def main() -> None:
        slot = await limit.acquire()
        try:
            await limit.acquire()  # nothing may wait: refused at once
        except ServerBusyError as error:
            print(error, error.retry_after)
        slot.release()


    asyncio.run(main())
    ```

    :param max_in_flight: Requests that run at once (>= 1).
    :param max_waiting: Requests that may wait for a slot (>= 0).
    :param queue_timeout: Seconds a request may wait (> 0).
    :raises ValueError: If a value is out of its range.
    """

    def __init__(self, *, max_in_flight: int, max_waiting: int, queue_timeout: float) -> None:
        ServingLimits(max_in_flight=max_in_flight, max_waiting=max_waiting, queue_timeout=queue_timeout)
        self.max_in_flight = max_in_flight
        self.max_waiting = max_waiting
        self.queue_timeout = queue_timeout
        self.in_flight = 0
        self.admitted = 0
        self.refused = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot now."""
        return sum(not waiter.done() for waiter in self._waiters)

    def _retry_after(self) -> int:
        return max(1, math.ceil(self.queue_timeout))

    async def acquire(self) -> Slot:
        """
        Take a slot, waiting for one at most `queue_timeout` seconds.

        :returns: The `Slot`; release it when the request is done.
        :raises ServerBusyError: If `max_waiting` requests are already waiting, or no slot came within
            `queue_timeout` seconds.
        """
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (tests): nothing of the old one can still be waiting
            self._loop, self._waiters = loop, collections.deque()
            self.in_flight = min(self.in_flight, self.max_in_flight)
        if self.in_flight < self.max_in_flight and not self.waiting:
            self.in_flight += 1
            self.admitted += 1
            return Slot(self)
        if self.waiting >= self.max_waiting:
            self.refused += 1
            message = (
                f"The server is busy: {self.in_flight} requests are running and {self.waiting} waiting (the limits: "
                f"{self.max_in_flight} and {self.max_waiting}); retry later"
            )
            logger.warning("Refused a request (503): {reason}", reason=message)
            raise ServerBusyError(message, retry_after=self._retry_after())
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, self.queue_timeout)
        except asyncio.TimeoutError:
            self.refused += 1
            message = (
                f"The server is busy: no request slot came free within {self.queue_timeout:g} s (the limit: "
                f"{self.max_in_flight} requests at once); retry later"
            )
            logger.warning("Refused a request (503): {reason}", reason=message)
            raise ServerBusyError(message, retry_after=self._retry_after()) from None
        except BaseException:  # cancelled while waiting: a slot handed over just before must go on
            if waiter.done() and not waiter.cancelled():
                self._release()
            raise
        finally:
            if waiter in self._waiters and waiter.done():
                self._waiters.remove(waiter)
        self.admitted += 1
        return Slot(self)

    def _release(self) -> None:
        loop = self._loop
        if loop is not None and loop.is_running() and _running_loop() is not loop:
            loop.call_soon_threadsafe(self._release)  # released from another thread (a collected generator)
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to it: in_flight unchanged
                return
        self.in_flight = max(0, self.in_flight - 1)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


_LIMIT: AdmissionLimit | None = None
_LIMIT_LOCK = threading.Lock()


def admission_limit(limits: ServingLimits) -> AdmissionLimit:
    """
    The process's admission limit, made from the first `limits` it is given (every wrapper of a Hayhooks process
    reads the same environment, and shares the backend).

    :returns: The one `AdmissionLimit` of the process.
    """
    global _LIMIT
    with _LIMIT_LOCK:
        if _LIMIT is None:
            _LIMIT = AdmissionLimit(
                max_in_flight=limits.max_in_flight,
                max_waiting=limits.max_waiting,
                queue_timeout=limits.queue_timeout,
            )
        return _LIMIT
