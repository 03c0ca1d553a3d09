"""
The one failure taxonomy: `failure_kind` of an exception chain, `CallFailure` (one failed LLM call), and
`LLMCallsFailedError`, raised when every LLM call of a round failed (failures are never answers).

### Usage example
```python
try:
    voter.run(query="Who wrote Hamlet?", documents=documents)
except LLMCallsFailedError as error:
    for failure in error.failures:  # one per failed call
        print(failure.kind, failure.status, failure)  # "timeout None APITimeoutError: Request timed out."
```
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

LLM = "llm"
DOCUMENT_STORE = "document_store"

_KINDS: dict[tuple[str, str], tuple[str, str]] = {
    ("openai", "AuthenticationError"): (LLM, "key"),
    ("openai", "PermissionDeniedError"): (LLM, "key"),
    ("openai", "NotFoundError"): (LLM, "not_found"),
    ("openai", "APITimeoutError"): (LLM, "timeout"),
    ("openai", "APIConnectionError"): (LLM, "unreachable"),
    ("httpx", "TimeoutException"): (LLM, "timeout"),
    ("httpx", "ConnectError"): (LLM, "unreachable"),
    ("builtins", "TimeoutError"): (LLM, "timeout"),
    ("builtins", "ConnectionError"): (LLM, "unreachable"),
    ("haystack_fusion", "CircuitOpenError"): (LLM, "circuit_open"),
    ("elastic_transport", "ConnectionTimeout"): (DOCUMENT_STORE, "unreachable"),
    ("elastic_transport", "ConnectionError"): (DOCUMENT_STORE, "unreachable"),
    ("elasticsearch", "AuthenticationException"): (DOCUMENT_STORE, "key"),
    ("elasticsearch", "AuthorizationException"): (DOCUMENT_STORE, "key"),
    ("elasticsearch", "NotFoundError"): (DOCUMENT_STORE, "not_found"),
}
"""(top-level module, class name) of an exception or a base -> (service, kind); the first match along the bases
wins. The builtin `ConnectionError` is ollama's refused call."""

KINDS = ("key", "not_found", "timeout", "unreachable", "circuit_open", "failing")
"""Refused key (401/403), missing model or index (404), timeout, no connection, open breaker, anything else."""

CONFIGURATION_KINDS = frozenset({"key", "not_found"})
"""The kinds no retry fixes."""

UNUSABLE_KINDS = frozenset({"key", "unreachable", "circuit_open"})
"""The kinds that make an LLM backend unusable for every call."""


def exception_chain(error: BaseException) -> Iterator[BaseException]:
    """`error`, then its causes and contexts, depth first, each once."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [error]
    while stack:
        current = stack.pop()
        if current is not None and id(current) not in seen:
            seen.add(id(current))
            yield current
            stack.extend([current.__context__, current.__cause__])


def error_status(error: BaseException) -> int | None:
    """The HTTP status an exception or one it was raised from carries (`status_code`, or `status`), else None."""
    for link in exception_chain(error):
        status = getattr(link, "status_code", None) or getattr(link, "status", None)
        if isinstance(status, int) and not isinstance(status, bool):
            return status
    return None


def classify(error: BaseException, service: str | None = None, *, skip: Collection[str] = ()) -> tuple[str, str] | None:
    """(service, kind) of the first `_KINDS` entry along the exception chain and each link's bases (only `service`'s,
    none of `skip`'s modules), else None."""
    for link in exception_chain(error):
        for cls in type(link).__mro__:
            module = cls.__module__.split(".")[0]
            found = _KINDS.get((module, cls.__name__))
            if found is not None and (service is None or found[0] == service) and module not in skip:
                return found
    return None


def failure_kind(error: BaseException) -> str:
    """The `KINDS` entry of an LLM call's exception: by class (`_KINDS`), else by HTTP status, else "failing"."""
    found = classify(error, LLM)
    if found is not None:
        return found[1]
    return {401: "key", 403: "key", 404: "not_found", 408: "timeout", 504: "timeout"}.get(
        error_status(error) or 0, "failing"
    )


@dataclass(frozen=True)
class CallFailure:
    """One failed LLM call: its `KINDS` kind, exception class and text (for the operator, not a chat user), HTTP
    status (None: no answer), component and place in its round (post-fusion: the passage's rank; None: one call)."""

    kind: str
    error_type: str
    message: str
    status: int | None = None
    component: str = ""
    index: int | None = None

    @classmethod
    def of(cls, error: BaseException, *, component: str = "", index: int | None = None) -> CallFailure:
        return cls(failure_kind(error), type(error).__name__, str(error), error_status(error), component, index)

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON values."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CallFailure:
        """The record `to_dict` wrote (unknown keys left out)."""
        status, index = data.get("status"), data.get("index")
        return cls(
            str(data["kind"]),
            str(data["error_type"]),
            str(data.get("message") or ""),
            status if isinstance(status, int) else None,
            str(data.get("component") or ""),
            index if isinstance(index, int) else None,
        )

    def __str__(self) -> str:
        return f"{self.error_type}: {self.message}"


class LLMCallsFailedError(RuntimeError):
    """Every LLM call of a component or strategy failed: `failures` in call order; `what` failed, e.g.
    "PostFusionVoter 'voter'"."""

    def __init__(self, failures: Iterable[CallFailure], what: str = "a run") -> None:
        self.failures, self.what = list(failures), what
        first = f": {self.failures[0]}" if self.failures else ""
        super().__init__(f"every LLM call of {what} failed ({_calls(len(self.failures))}){first}")


def _calls(count: int) -> str:
    return f"{count} failed call{'s' * (count != 1)}"


def calls_failed(error: BaseException) -> LLMCallsFailedError | None:
    """The `LLMCallsFailedError` in an exception's chain, else None."""
    return next((link for link in exception_chain(error) if isinstance(link, LLMCallsFailedError)), None)


_RECORDED: contextvars.ContextVar[list[CallFailure] | None] = contextvars.ContextVar("failed_calls", default=None)


def record(failure: CallFailure) -> None:
    """Add a failed call to the run under way (`failed_run`), if any."""
    recorded = _RECORDED.get()
    if recorded is not None:
        recorded.append(failure)


@contextlib.contextmanager
def failed_run(what: str = "a run", *, reader: str | None = None) -> Iterator[list[CallFailure]]:
    """
    Gather every failed LLM call `record`ed in the block (its threads and tasks too) in the yielded list and the
    outer run's; `reader`: the component of a strategy's only LLM call.

    :raises LLMCallsFailedError: If every call of a round failed, or `reader` raised: with every failed call.
    """
    recorded: list[CallFailure] = []
    token = _RECORDED.set(recorded)
    try:
        yield recorded
    except Exception as error:
        failed = calls_failed(error)
        cause = error.__cause__
        if failed is None and reader is not None and getattr(error, "component_name", None) == reader and cause:
            recorded.append(CallFailure.of(cause, component=reader))
            failed = LLMCallsFailedError(recorded[-1:], what)
        if failed is None:
            raise
        earlier = len(recorded) - len(failed.failures)
        what = f"{failed.what} (after {_calls(earlier)} of earlier rounds)" if earlier > 0 else failed.what
        raise LLMCallsFailedError(recorded or failed.failures, what) from error
    finally:
        _RECORDED.reset(token)
        outer = _RECORDED.get()
        if outer is not None:
            outer.extend(recorded)
