"""
A circuit breaker for one LLM backend: after a run of failed calls, calls fail at once for a cool-down instead of
being sent to a server that is failing, then one probe call finds out whether it answers again. A state machine of
its own: none of four circuit-breaker libraries on PyPI probes with one call.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Literal

from haystack_fusion.failures import error_status
from haystack_fusion.settings import DEFAULT_BREAKER_COOLDOWN, DEFAULT_BREAKER_FAILURES

BreakerState = Literal["closed", "open", "half_open"]

_ANSWERED_STATUSES = frozenset(range(400, 500)) - {401, 403, 408, 429}
"""HTTP statuses that say the server answered and refused this one request (a prompt over the context, a content
filter): such a failure does not count against the backend. 401 / 403 (a refused key), 408 and 429 do."""


def counts_as_backend_failure(error: BaseException) -> bool:
    """Whether a failed call counts against its backend: any exception but an HTTP 4xx answer that refuses only this
    request (`_ANSWERED_STATUSES`) and the breaker's own `CircuitOpenError` (the call was never sent)."""
    if isinstance(error, CircuitOpenError):
        return False
    return error_status(error) not in _ANSWERED_STATUSES


def describe_failure(error: BaseException) -> str:
    """A failure as an operator log names it: "InternalServerError (HTTP 500)", "APIConnectionError"."""
    status = error_status(error)
    return type(error).__name__ + (f" (HTTP {status})" if status is not None else "")


class CircuitOpenError(RuntimeError):
    """
    A call the breaker of its backend refused without sending it: the backend failed its last calls, and the
    cool-down is not over (or the one probe call is under way).

    :param backend: The breaker's name (which backend; for the server log).
    :param retry_after: Seconds until a probe call may go (> 0; the cool-down while a probe is under way).
    :param failures: The consecutive failed calls that opened the breaker.
    :param last_error: The exception of the last failed call (its class and HTTP status tell what failed), or None.
    """

    def __init__(
        self, backend: str, *, retry_after: float, failures: int, last_error: BaseException | None = None
    ) -> None:
        self.backend, self.retry_after, self.failures, self.last_error = backend, retry_after, failures, last_error
        last = f" (the last: {describe_failure(last_error)})" if last_error is not None else ""
        super().__init__(
            f"the LLM server failed {failures} calls in a row{last}; calls fail at once for "
            f"{math.ceil(retry_after)} s more, then one probe call goes"
        )

    @property
    def status(self) -> int | None:
        """The HTTP status of the last failed call, or None (no answer: refused connection, timeout)."""
        return None if self.last_error is None else error_status(self.last_error)


class CircuitBreaker:
    """
    Closed: calls go through; `failure_threshold` failed calls in a row (`counts_as_backend_failure`) open it.
    Open: calls fail at once with `CircuitOpenError` for `cooldown` seconds, never sent. Then half-open: the next
    call is the one probe (the calls arriving while it runs fail at once too); its success closes the breaker, its
    failure opens it for another `cooldown`. A probe that ends otherwise (cancelled) lets the next call probe.

    The state is guarded by a lock held only to read and change it, never during a call, so one breaker serves
    threads and event loops together (`calling` is a plain context manager: `with breaker.calling(): await ...`).
    A call that was already under way when the breaker opened changes nothing when it ends.

    :param name: Which backend (for the server log and `shared`).
    :param failure_threshold: Consecutive failed calls that open it (>= 1).
    :param cooldown: Seconds it stays open before the probe (> 0).
    :param clock: Seconds, monotonic (`time.monotonic`; a test's clock).
    :raises ValueError: If `failure_threshold` is below 1 or `cooldown` is not a positive number.
    """

    _SHARED: ClassVar[dict[tuple[str, int, float], CircuitBreaker]] = {}
    _SHARED_LOCK: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        name: str,
        *,
        failure_threshold: int = DEFAULT_BREAKER_FAILURES,
        cooldown: float = DEFAULT_BREAKER_COOLDOWN,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(failure_threshold, bool) or not isinstance(failure_threshold, int) or failure_threshold < 1:
            raise ValueError(f"`failure_threshold` must be an integer >= 1 (calls), got {failure_threshold!r}")
        if isinstance(cooldown, bool) or not isinstance(cooldown, (int, float)) or not 0 < cooldown < math.inf:
            raise ValueError(f"`cooldown` must be a positive number of seconds, got {cooldown!r}")
        self.name, self.failure_threshold, self.cooldown, self._clock = name, failure_threshold, float(cooldown), clock
        self._lock = threading.Lock()
        self._state: BreakerState = "closed"
        self._failures = 0  # consecutive, while closed; the run that opened it, while open
        self._opened_at = 0.0
        self._probing = False
        self._last_error: BaseException | None = None

    @classmethod
    def shared(
        cls, name: str, *, failure_threshold: int = DEFAULT_BREAKER_FAILURES, cooldown: float = DEFAULT_BREAKER_COOLDOWN
    ) -> CircuitBreaker:
        """The process's one breaker of this name and settings (made on first use): the wrappers of every served
        strategy, and a pipeline loaded from YAML, share their backend's.

        :raises ValueError: As the constructor."""
        key = (name, failure_threshold, float(cooldown))
        with cls._SHARED_LOCK:
            if key not in cls._SHARED:
                cls._SHARED[key] = cls(name, failure_threshold=failure_threshold, cooldown=cooldown)
            return cls._SHARED[key]

    def to_dict(self) -> dict[str, Any]:
        """`name`, `failure_threshold` and `cooldown`, what `shared` takes (the state is the process's, not saved)."""
        return {"name": self.name, "failure_threshold": self.failure_threshold, "cooldown": self.cooldown}

    @property
    def state(self) -> BreakerState:
        """ "closed", "open" (failing calls at once) or "half_open" (the cool-down is over: a probe is under way, or
        the next call is one)."""
        with self._lock:
            if self._state == "open" and self._clock() >= self._opened_at + self.cooldown:
                return "half_open"
            return self._state

    def retry_after(self) -> float:
        """Seconds until a call may go again: 0 while closed or when the next call may probe; the cool-down while a
        probe is under way (its outcome decides)."""
        with self._lock:
            return self._wait()

    def _wait(self) -> float:
        if self._state == "closed" or (self._state == "half_open" and not self._probing):
            return 0.0
        if self._state == "half_open":
            return self.cooldown
        return max(0.0, self._opened_at + self.cooldown - self._clock())

    def admit(self) -> bool:
        """
        Let a call go, or refuse it.

        :returns: Whether the call is the probe (then `succeeded`, `failed` or `abandoned` must follow).
        :raises CircuitOpenError: While open, or half-open with the probe under way.
        """
        with self._lock:
            if self._state == "closed":
                return False
            if self._state == "open" and self._clock() >= self._opened_at + self.cooldown:
                self._state = "half_open"
            if self._state == "half_open" and not self._probing:
                self._probing = True
                return True
            raise CircuitOpenError(
                self.name, retry_after=max(self._wait(), 1e-3), failures=self._failures, last_error=self._last_error
            )

    def succeeded(self, probe: bool) -> None:
        """A call answered: a closed breaker's count starts afresh; the probe's success closes it."""
        with self._lock:
            if self._state == "closed":
                self._failures = 0
            elif probe and self._probing:
                self._state, self._probing, self._failures, self._last_error = "closed", False, 0, None

    def failed(self, probe: bool, error: BaseException) -> None:
        """A call failed (`counts_as_backend_failure`; other errors count as `succeeded`): the threshold's failure
        in a row opens a closed breaker; the probe's failure opens it again."""
        if not counts_as_backend_failure(error):
            self.succeeded(probe)
            return
        with self._lock:
            if self._state == "closed":
                self._failures += 1
                self._last_error = error
                if self._failures >= self.failure_threshold:
                    self._state, self._opened_at = "open", self._clock()
            elif probe and self._probing:
                self._state, self._probing, self._opened_at, self._last_error = "open", False, self._clock(), error

    def abandoned(self, probe: bool) -> None:
        """A call ended with neither an answer nor a failure (cancelled): the probe's turn goes to the next call."""
        with self._lock:
            if probe and self._probing:
                self._probing = False

    @contextlib.contextmanager
    def calling(self) -> Iterator[None]:
        """
        Run a call (the block) through the breaker: `admit` first, then its outcome: an `Exception` is `failed` (and
        raised), another `BaseException` (cancellation) `abandoned`, else `succeeded`.

        :raises CircuitOpenError: Instead of running the block, while the breaker refuses calls.
        """
        probe = self.admit()
        try:
            yield
        except Exception as error:
            self.failed(probe, error)
            raise
        except BaseException:
            self.abandoned(probe)
            raise
        self.succeeded(probe)

    def __repr__(self) -> str:
        return (
            f"CircuitBreaker({self.name!r}, failure_threshold={self.failure_threshold}, cooldown={self.cooldown:g}, "
            f"state={self.state!r})"
        )
