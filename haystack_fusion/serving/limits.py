"""
What a served wrapper admits: a bound on the question's length and one process-wide admission limit with a bounded
queue, so overload is refused at once (`ServerBusyError`, HTTP 503 with `Retry-After`) instead of piling up.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from haystack import logging

from haystack_fusion.settings import SERVING_LIMIT_VARIABLES, serving_limit_values

logger = logging.getLogger(__name__)

# Per LLM kind: requests run at once (the embedded model answers one call at a time) and seconds a request waits for
# a slot (an embedded-model question takes 30-140 s), by default
DEFAULT_MAX_IN_FLIGHT = {"local": 1, "openai": 32, "ollama": 4}
DEFAULT_QUEUE_TIMEOUT = {"local": 300.0, "openai": 30.0, "ollama": 120.0}


class ServerBusyError(RuntimeError):
    """A request the admission limit refused; `retry_after`: seconds (>= 1) for the `Retry-After` header."""

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
    :param max_question_chars: The longest question served, in characters after stripping (>= 1; SQuAD 2.0 dev
        questions have at most a few hundred).
    :raises ValueError: If a value is out of its range, naming the parameter.
    """

    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT["openai"]
    max_waiting: int = 64
    queue_timeout: float = DEFAULT_QUEUE_TIMEOUT["openai"]
    max_question_chars: int = 2000

    def __post_init__(self) -> None:
        for name, low in (("max_in_flight", 1), ("max_waiting", 0), ("max_question_chars", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"`{name}` must be at least {low}, got {getattr(self, name)}")
        if not self.queue_timeout > 0:
            raise ValueError(f"`queue_timeout` must be a positive number of seconds, got {self.queue_timeout}")

    @classmethod
    def from_env(cls, llm: str, env: Mapping[str, str] | None = None) -> ServingLimits:
        """
        The limits `SERVING_LIMIT_VARIABLES` set in `env` (default `os.environ`), else the defaults for the LLM kind
        (`BackendConfig.llm`).

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
        """:raises ValueError: If the stripped question is too long, giving both lengths (not the question)."""
        if (length := len(question.strip())) > self.max_question_chars:
            raise ValueError(
                f"The question has {length} characters; this server answers questions of at most "
                f"{self.max_question_chars} characters"
            )


class AdmissionLimit:
    """
    At most `max_in_flight` requests at once; up to `max_waiting` more wait in arrival order, each at most
    `queue_timeout` seconds; the others are refused with `ServerBusyError`. Used from the server's one event loop.

    :raises ValueError: If a value is out of its range (as `ServingLimits`).
    """

    def __init__(self, *, max_in_flight: int, max_waiting: int, queue_timeout: float) -> None:
        ServingLimits(max_in_flight=max_in_flight, max_waiting=max_waiting, queue_timeout=queue_timeout)
        self.max_in_flight, self.max_waiting, self.queue_timeout = max_in_flight, max_waiting, queue_timeout
        self.in_flight = self.waiting = 0  # requests holding a slot, waiting for one
        self._semaphore = asyncio.Semaphore(max_in_flight)

    @property
    def busy(self) -> bool:
        """Whether a request that arrives now has to wait: every slot is taken, or others wait already."""
        return self.in_flight >= self.max_in_flight or self.waiting > 0

    def check_room(self) -> None:
        """:raises ServerBusyError: If a request arriving now would be refused at once (`max_waiting` wait)."""
        if self.busy and self.waiting >= self.max_waiting:
            raise self._busy(
                f"The server is busy: {self.in_flight} requests are running and {self.waiting} waiting (the limits: "
                f"{self.max_in_flight} and {self.max_waiting}); retry later"
            )

    def _busy(self, message: str) -> ServerBusyError:
        logger.warning("Refused a request (503): {reason}", reason=message)
        return ServerBusyError(message, retry_after=max(1, math.ceil(self.queue_timeout)))

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """
        Hold a slot for the block, waiting for one at most `queue_timeout` seconds.

        :raises ServerBusyError: If `max_waiting` requests already wait, or no slot came within `queue_timeout`.
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
        try:
            yield
        finally:
            self.in_flight -= 1
            self._semaphore.release()


_LIMITS: list[AdmissionLimit] = []


def admission_limit(limits: ServingLimits) -> AdmissionLimit:
    """The process's one `AdmissionLimit`, made from the first `limits` given (every wrapper shares the backend)."""
    if not _LIMITS:  # wrappers are set up one at a time (`hayhooks._SETUP_LOCK`)
        _LIMITS.append(
            AdmissionLimit(
                max_in_flight=limits.max_in_flight, max_waiting=limits.max_waiting, queue_timeout=limits.queue_timeout
            )
        )
    return _LIMITS[0]
