"""A circuit breaker for one LLM backend: after a run of failed calls, calls fail at once for a cool-down, then one
probe call finds out whether the server answers again (no PyPI breaker library probes with one call)."""

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

# the server refused only this request (a prompt over the context, a content filter): not the backend's failure
_ANSWERED_STATUSES = frozenset(range(400, 500)) - {401, 403, 408, 429}


def counts_as_backend_failure(error: BaseException) -> bool:
    """Whether a failed call counts against its backend: not a 4xx refusing only this request nor a
    `CircuitOpenError`."""
    if isinstance(error, CircuitOpenError):
        return False
    return error_status(error) not in _ANSWERED_STATUSES


def describe_failure(error: BaseException) -> str:
    """A failure as an operator log names it: "InternalServerError (HTTP 500)", "APIConnectionError"."""
    status = error_status(error)
    return type(error).__name__ + (f" (HTTP {status})" if status is not None else "")


class CircuitOpenError(RuntimeError):
    """A call its backend's breaker refused unsent: `retry_after` seconds (> 0) until a probe may go, after
    `failures` failed calls in a row, the last raising `last_error`."""

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
        """The HTTP status of the last failed call, or None."""
        return None if self.last_error is None else error_status(self.last_error)


class CircuitBreaker:
    """
    Closed: calls go through; `failure_threshold` failed calls in a row (`counts_as_backend_failure`) open it.
    Open: calls fail at once with `CircuitOpenError` for `cooldown` seconds, never sent. Then half-open: the next
    call is the one probe (the calls arriving while it runs fail at once too); its success closes the breaker, its
    failure opens it for another `cooldown` (seconds, > 0); a cancelled probe lets the next call probe. The lock is
    never held during a call: one breaker serves threads and event loops (`with breaker.calling(): await ...`).

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
        """The process's one breaker of this name and settings. :raises ValueError: As the constructor."""
        key = (name, failure_threshold, float(cooldown))
        with cls._SHARED_LOCK:
            if key not in cls._SHARED:
                cls._SHARED[key] = cls(name, failure_threshold=failure_threshold, cooldown=cooldown)
            return cls._SHARED[key]

    def to_dict(self) -> dict[str, Any]:
        """What `shared` takes (the state is not saved)."""
        return {"name": self.name, "failure_threshold": self.failure_threshold, "cooldown": self.cooldown}

    @property
    def state(self) -> BreakerState:
        """ "closed", "open" or "half_open" (the cool-down is over)."""
        with self._lock:
            if self._state == "open" and self._clock() >= self._opened_at + self.cooldown:
                return "half_open"
            return self._state

    def retry_after(self) -> float:
        """Seconds until a call may go again (0: now; the cool-down while a probe is under way)."""
        with self._lock:
            return self._wait()

    def _wait(self) -> float:
        if self._state == "closed" or (self._state == "half_open" and not self._probing):
            return 0.0
        if self._state == "half_open":
            return self.cooldown
        return max(0.0, self._opened_at + self.cooldown - self._clock())

    def admit(self) -> bool:
        """:returns: Whether the call is the probe. :raises CircuitOpenError: If the breaker refuses it."""
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
        with self._lock:
            if self._state == "closed":
                self._failures = 0
            elif probe and self._probing:
                self._state, self._probing, self._failures, self._last_error = "closed", False, 0, None

    def failed(self, probe: bool, error: BaseException) -> None:
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
        with self._lock:
            if probe and self._probing:
                self._probing = False

    @contextlib.contextmanager
    def calling(self) -> Iterator[None]:
        """Run a call (the block) through the breaker. :raises CircuitOpenError: If it refuses the call."""
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
