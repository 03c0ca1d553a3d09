"""
What a served wrapper admits: a bound on the question's length and one process-wide admission limit with a bounded
queue, so overload is refused at once (`ServerBusyError`, HTTP 503 with `Retry-After`) instead of piling up.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from haystack import logging

from haystack_fusion.settings import SERVING_LIMIT_VARIABLES, serving_limit_values

logger = logging.getLogger(__name__)

DEFAULT_MAX_IN_FLIGHT = {"local": 1, "openai": 32, "ollama": 4}
"""Requests run at once by default, per LLM kind (the embedded model answers one call at a time)."""

DEFAULT_MAX_WAITING = 64
"""Requests that may wait for a slot by default; the next ones are refused at once."""

DEFAULT_QUEUE_TIMEOUT = {"local": 300.0, "openai": 30.0, "ollama": 120.0}
"""Seconds a request waits for a slot by default, per LLM kind (an embedded-model question takes 30-140 s)."""

DEFAULT_MAX_QUESTION_CHARS = 2000
"""The longest question served by default, in characters (SQuAD 2.0 dev questions have at most a few hundred)."""


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
    queue_timeout: float = DEFAULT_QUEUE_TIMEOUT["openai"]
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
        The limits `HAYSTACK_FUSION_MAX_IN_FLIGHT`, `_MAX_WAITING`, `_QUEUE_TIMEOUT` (seconds) and
        `_MAX_QUESTION_CHARS` set, else the defaults above for the LLM kind.

        :param llm: "local", "openai" or "ollama" (`BackendConfig.llm`).
        :param env: The environment (default `os.environ`).
        :raises ValueError: If a variable is not a number or is out of range, naming the variable.
        """
        values = serving_limit_values(env)
        values.setdefault("max_in_flight", DEFAULT_MAX_IN_FLIGHT.get(llm, DEFAULT_MAX_IN_FLIGHT["openai"]))
        values.setdefault("queue_timeout", DEFAULT_QUEUE_TIMEOUT.get(llm, DEFAULT_QUEUE_TIMEOUT["openai"]))
        for name, value in values.items():
            try:
                cls(**{name: value})  # type: ignore[arg-type]
            except ValueError as error:
                raise ValueError(f"{SERVING_LIMIT_VARIABLES[name]}: {error}") from None
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
    """A place taken in an `AdmissionLimit`; `release` gives it back (idempotent)."""

    def __init__(self, limit: AdmissionLimit) -> None:
        self._limit: AdmissionLimit | None = limit

    def release(self) -> None:
        """Give the place back, to the longest-waiting request if any."""
        limit, self._limit = self._limit, None
        if limit is not None:
            limit.in_flight -= 1
            limit._semaphore.release()


class AdmissionLimit:
    """
    At most `max_in_flight` requests at once; up to `max_waiting` more wait in arrival order, each at most
    `queue_timeout` seconds; the others are refused with `ServerBusyError`. Used from the server's one event loop.

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

    :raises ValueError: If a value is out of its range (as `ServingLimits`).
    """

    def __init__(self, *, max_in_flight: int, max_waiting: int, queue_timeout: float) -> None:
        ServingLimits(max_in_flight=max_in_flight, max_waiting=max_waiting, queue_timeout=queue_timeout)
        self.max_in_flight = max_in_flight
        self.max_waiting = max_waiting
        self.queue_timeout = queue_timeout
        self.in_flight = 0
        """Requests holding a slot now."""
        self.waiting = 0
        """Requests waiting for a slot now."""
        self._semaphore = asyncio.Semaphore(max_in_flight)

    @property
    def busy(self) -> bool:
        """Whether a request that arrives now has to wait: every slot is taken, or others wait already."""
        return self.in_flight >= self.max_in_flight or self.waiting > 0

    def check_room(self) -> None:
        """
        Refuse at once what `acquire` would refuse at once, without taking a slot.

        :raises ServerBusyError: If a request that arrives now would have to wait and `max_waiting` already do.
        """
        if self.busy and self.waiting >= self.max_waiting:
            raise self._busy(
                f"The server is busy: {self.in_flight} requests are running and {self.waiting} waiting (the limits: "
                f"{self.max_in_flight} and {self.max_waiting}); retry later"
            )

    def _busy(self, message: str) -> ServerBusyError:
        logger.warning("Refused a request (503): {reason}", reason=message)
        return ServerBusyError(message, retry_after=max(1, math.ceil(self.queue_timeout)))

    async def acquire(self) -> Slot:
        """
        Take a slot, waiting for one at most `queue_timeout` seconds.

        :returns: The `Slot`; release it when the request is done.
        :raises ServerBusyError: If `max_waiting` requests are already waiting, or no slot came within
            `queue_timeout` seconds.
        """
        self.check_room()
        if not self.busy:
            await self._semaphore.acquire()  # free: taken at once, without yielding to the loop
        else:
            self.waiting += 1
            try:
                await asyncio.wait_for(self._semaphore.acquire(), self.queue_timeout)
            except TimeoutError:
                raise self._busy(
                    f"The server is busy: no request slot came free within {self.queue_timeout:g} s (the limit: "
                    f"{self.max_in_flight} {'request' if self.max_in_flight == 1 else 'requests'} at once); retry later"
                ) from None
            finally:
                self.waiting -= 1
        self.in_flight += 1
        return Slot(self)


_LIMIT: AdmissionLimit | None = None
_LIMIT_LOCK = threading.Lock()


def admission_limit(limits: ServingLimits) -> AdmissionLimit:
    """The process's one `AdmissionLimit`, made from the first `limits` given (every wrapper shares the backend)."""
    global _LIMIT
    with _LIMIT_LOCK:
        if _LIMIT is None:
            _LIMIT = AdmissionLimit(
                max_in_flight=limits.max_in_flight,
                max_waiting=limits.max_waiting,
                queue_timeout=limits.queue_timeout,
            )
        return _LIMIT
