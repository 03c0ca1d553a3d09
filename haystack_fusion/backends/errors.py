"""
One-line messages for a backend that cannot be used or a question whose every LLM call failed: the operator's name
the URL and what to fix; a chat user's name no URL, flag or variable. Never a secret (URLs stripped of credentials).
"""

from __future__ import annotations

import http
import math
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

from haystack_fusion.backends.config import BackendConfig
from haystack_fusion.breaker import CircuitOpenError, describe_failure
from haystack_fusion.failures import (
    DOCUMENT_STORE,
    LLM,
    CallFailure,
    calls_failed,
    classify,
    error_status,
    exception_chain,
    failure_kind,
)
from haystack_fusion.settings import BREAKER_COOLDOWN_VARIABLE, BREAKER_FAILURES_VARIABLE

OPENAI_DEFAULT_URL = "https://api.openai.com/v1"


class BackendError(RuntimeError):
    """A configured backend cannot be used; the message is one line that names the URL and what to fix."""


def safe_url(url: str) -> str:
    """`https://elastic:secret@host:9200/?api_key=x` -> `https://host:9200/`; unchanged without a host."""
    parts = urlsplit(url)
    if not parts.hostname:
        return url
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _reason(error: BaseException) -> str:
    for link in exception_chain(error):
        if isinstance(link, OSError) and link.strerror:
            return f" ({link.strerror})"
    return ""


_BREAKER_SETTINGS = f"${BREAKER_FAILURES_VARIABLE} and ${BREAKER_COOLDOWN_VARIABLE} set the breaker"

_MESSAGES = {
    ("openai", "unreachable"): "cannot connect to the OpenAI-compatible server at {openai}{reason}: check "
    "--api-base-url or $OPENAI_BASE_URL, and that the server is running",
    ("openai", "timeout"): "the OpenAI-compatible server at {openai} did not answer within {limit}: check the server, "
    "or raise --timeout",
    ("openai", "key"): "the OpenAI-compatible server at {openai} refused the API key in $OPENAI_API_KEY{status}: set "
    "$OPENAI_API_KEY to a valid key",
    ("ollama", "unreachable"): "cannot connect to Ollama at {ollama}: check $OLLAMA_HOST, and that `ollama serve` is "
    "running",
    ("ollama", "timeout"): "Ollama at {ollama} did not answer in time: check the server, or raise --timeout",
    (DOCUMENT_STORE, "unreachable"): "cannot connect to Elasticsearch at {es}{reason}: check $ELASTICSEARCH_URL, and "
    "that the server is running",
    (DOCUMENT_STORE, "key"): "Elasticsearch at {es} refused the credentials in $ELASTIC_API_KEY / "
    "$ELASTIC_API_KEY_ID{status}",
}


def _classify(error: BaseException, config: BackendConfig) -> tuple[str, str] | None:
    return classify(error, skip=() if config.llm == "ollama" else ("builtins", "httpx"))


def _circuit_open(error: BaseException | None) -> CircuitOpenError | None:
    links = exception_chain(error) if error is not None else ()
    return next((link for link in links if isinstance(link, CircuitOpenError)), None)


def _message(
    service: str, kind: str, config: BackendConfig, status: int | None, error: BaseException | None
) -> str | None:
    if service == LLM and kind == "circuit_open":
        refusal = _circuit_open(error)
        if refusal is None:
            return f"the LLM server's circuit breaker refused the calls: check the server ({_BREAKER_SETTINGS})"
        last = f" (the last: {describe_failure(refusal.last_error)})" if refusal.last_error is not None else ""
        return (
            f"the LLM server {refusal.backend} failed {refusal.failures} calls in a row{last}: its circuit breaker "
            f"fails calls at once for {math.ceil(refusal.retry_after)} s more, then lets one probe call through; check "
            f"the server ({_BREAKER_SETTINGS})"
        )
    if service == DOCUMENT_STORE and kind == "not_found":
        return missing_index_message(config)
    client = ("ollama" if config.llm == "ollama" else "openai") if service == LLM else service
    if (template := _MESSAGES.get((client, kind))) is None:
        return None
    return template.format(
        openai=safe_url(config.api_base_url or OPENAI_DEFAULT_URL),
        ollama=safe_url(config.ollama_url),
        es=safe_url(config.elasticsearch_url),
        reason=_reason(error) if error is not None else "",
        status=f" (HTTP {status})" if status is not None else "",
        limit=f"{config.timeout:g} s" if config.timeout is not None else "the client's default timeout",
    )


def missing_index_message(config: BackendConfig) -> str:
    """The message for a missing or empty Elasticsearch index."""
    return (
        f"Elasticsearch at {safe_url(config.elasticsearch_url)} has no index {config.elasticsearch_index!r} (or it "
        f"is empty): check --es-index, or create it with `haystack-fusion index SOURCE --document-store "
        f"elasticsearch --es-index {config.elasticsearch_index}"
        + (f" --retriever {config.retriever}`" if config.retriever != "bm25" else "`")
    )


def backend_error_message(error: BaseException, config: BackendConfig) -> str | None:
    """The operator's line naming the failed backend and the fix (no trailing period), or None when the error is not
    a backend's."""
    if isinstance(error, BackendError):
        return str(error)
    if (failed := calls_failed(error)) is not None:
        return failed_calls_message(failed.failures, len(failed.failures), config)
    found = _classify(error, config)
    return None if found is None else _message(*found, config, error_status(error), error)


QUEUED_TIMEOUT_ADVICE = (
    "a call that timed out while other calls of its round were under way may have spent its time waiting in the "
    "server's queue (a server that answers one call at a time, like llama.cpp's or llama-cpp-python's with one slot): "
    "set --max-calls-in-flight 1 ($HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT=1 when serving) so the calls go one at a time, "
    "and a --timeout ($HAYSTACK_FUSION_TIMEOUT) that covers one call"
)


def queued_timeout_advice(
    failures: Iterable[CallFailure], *, calls: int, rounds: int, max_calls_in_flight: int | None
) -> str | None:
    """`QUEUED_TIMEOUT_ADVICE` when a failed call timed out while calls went out together, else None."""
    timed_out = any(failure.kind == "timeout" for failure in failures)
    return QUEUED_TIMEOUT_ADVICE if timed_out and calls > rounds and max_calls_in_flight != 1 else None


def failed_calls_message(failures: Iterable[CallFailure], calls: int, config: BackendConfig) -> str:
    """The operator's line for a question whose every one of `calls` LLM calls failed."""
    for failure in failures:
        if (line := _message(LLM, failure.kind, config, failure.status, None)) is not None:
            return line
    openai = safe_url(config.api_base_url or OPENAI_DEFAULT_URL)
    settings = {
        "openai": f"--api-base-url or $OPENAI_BASE_URL ({openai}) and $OPENAI_API_KEY",
        "ollama": f"$OLLAMA_HOST ({safe_url(config.ollama_url)})",
    }.get(config.llm, "--model")
    return (
        f"every LLM call failed ({calls} of {calls}) on the {config.llm} LLM: check {settings}; the warnings above "
        "give each call's error"
    )


_USER_PHRASES = {
    "unreachable": "cannot be reached",
    "timeout": "did not answer in time",
    "failing": "is failing",
    "key": "refused this service's access{status}; its operator has to fix it",
    "not_found": "holds no passages to search; this service's operator has to fix it",
}


_REASONS = {status.value: f" {status.phrase}" for status in http.HTTPStatus}


def _user_line(kind: str, *, store: bool = False, status: int | None = None, retry_after: float | None = None) -> str:
    """E.g. "The language model server is failing: HTTP 500 Internal Server Error; try again in 30 s"."""
    status_text = "" if status is None else f"HTTP {status}{_REASONS.get(status, '')}"
    phrase = _USER_PHRASES.get(kind, _USER_PHRASES["failing"])
    line = ("The document store " if store else "The language model server ") + phrase
    if kind in ("key", "not_found"):
        return line.format(status=f" ({status_text})" if status_text else "")
    line += f": {status_text}" if kind == "failing" and status_text else ""
    return f"{line}; try again {f'in {math.ceil(retry_after)} s' if retry_after and retry_after > 0 else 'later'}"


def user_error_message(error: BaseException, config: BackendConfig, *, retry_after: float | None = None) -> str | None:
    """The chat user's line for a backend's exception ("The language model server cannot be reached; try again
    later"; `retry_after` seconds when known); None when the error is not a backend's."""
    if (failed := calls_failed(error)) is not None:
        return failed_calls_user_message(failed.failures, retry_after=retry_after)
    found = (DOCUMENT_STORE, "not_found") if isinstance(error, BackendError) else _classify(error, config)
    if found is None or found == (LLM, "not_found"):
        return None
    if found[0] == DOCUMENT_STORE:
        return _user_line(found[1], store=True, status=error_status(error))
    if found[1] == "circuit_open" and (refusal := _circuit_open(error)) is not None:
        last = refusal.last_error
        kind = failure_kind(last) if last is not None else "failing"
        wait = retry_after if retry_after is not None else refusal.retry_after
        return _user_line(
            kind if kind in ("unreachable", "timeout") else "failing", status=refusal.status, retry_after=wait
        )
    return failed_calls_user_message([CallFailure.of(error)], retry_after=retry_after)


def failed_calls_user_message(failures: Iterable[CallFailure], *, retry_after: float | None = None) -> str:
    """The chat user's line when every LLM call failed, from the first failure that tells what went wrong."""
    for failure in failures:
        if failure.kind in ("key", "timeout", "unreachable") or failure.status is not None:
            kind = failure.kind if failure.kind in ("key", "timeout", "unreachable") else "failing"
            return _user_line(kind, status=failure.status, retry_after=retry_after)
    return _user_line("failing", retry_after=retry_after)


def llm_server_name(config: BackendConfig) -> str | None:
    """The LLM server's breaker name ("ollama http://localhost:11434"); None for the embedded model."""
    if config.llm == "openai":
        return f"openai {safe_url(config.api_base_url or OPENAI_DEFAULT_URL)}"
    if config.llm == "ollama":
        return f"ollama {safe_url(config.ollama_url)}"
    return None
