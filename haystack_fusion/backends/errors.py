"""
One-line messages, printed instead of a traceback, for backends that cannot be used (a server that refuses the
connection or does not answer, a key it refuses, a missing Elasticsearch index, an LLM server whose circuit breaker
is open). For the operator (`backend_error_message`, `failed_calls_message`: the command line, the server log), each
names the URL and the option or variable to fix; for a served chat's user (`user_error_message`,
`failed_calls_user_message`), each says what happened in the user's terms and names no URL, flag or variable. Never a
secret: built from the configuration and the exception's class and HTTP status, never from a server's text, with
URLs stripped of user name, password and query.
"""

from __future__ import annotations

import http
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from haystack_fusion.backends.config import BackendConfig
from haystack_fusion.breaker import CircuitOpenError, describe_failure, error_status
from haystack_fusion.llm import ERROR_KINDS, exception_chain
from haystack_fusion.settings import BREAKER_COOLDOWN_VARIABLE, BREAKER_FAILURES_VARIABLE

OPENAI_DEFAULT_URL = "https://api.openai.com/v1"
"""Where the `openai` client goes when neither `--api-base-url` nor `$OPENAI_BASE_URL` is set."""


class BackendError(RuntimeError):
    """A configured backend cannot be used; the message is one line that names the URL and what to fix."""


def safe_url(url: str) -> str:
    """
    A URL fit for a message: `https://elastic:secret@host:9200/?api_key=x` -> `https://host:9200/` (no user name,
    password, query or fragment); the input unchanged when it has no host.
    """
    parts = urlsplit(url)
    if not parts.hostname:
        return url
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _kind(names: Iterable[tuple[str, str]], config: BackendConfig) -> str | None:
    for name in names:
        kind = ERROR_KINDS.get(name)
        if kind is None or (kind.startswith("ollama") and config.llm != "ollama"):
            continue
        return kind
    return None


def _reason(error: BaseException) -> str:
    """The operating system's words for a failed connection ("Connection refused"), when the chain has them."""
    for link in exception_chain(error):
        if isinstance(link, OSError) and link.strerror:
            return f" ({link.strerror})"
    return ""


_STATUS_OF_TYPE = {"AuthenticationError": 401, "PermissionDeniedError": 403}
"""The HTTP status of the openai client's errors by class name: what a failure recorded as text still tells."""


def _status(error: BaseException | str | None) -> str:
    """ " (HTTP 401)" from the exception chain, or from a recorded failure's exception type name; "" when unknown."""
    if isinstance(error, str):
        return f" (HTTP {_STATUS_OF_TYPE[error]})" if error in _STATUS_OF_TYPE else ""
    for link in exception_chain(error) if error is not None else ():
        status = getattr(link, "status_code", None) or getattr(link, "status", None)
        if isinstance(status, int):
            return f" (HTTP {status})"
    return ""


_BREAKER_SETTINGS = f"${BREAKER_FAILURES_VARIABLE} and ${BREAKER_COOLDOWN_VARIABLE} set the breaker"

_MESSAGES = {
    "openai_unreachable": "cannot connect to the OpenAI-compatible server at {openai}{reason}: check --api-base-url or "
    "$OPENAI_BASE_URL, and that the server is running",
    "openai_timeout": "the OpenAI-compatible server at {openai} did not answer within {limit}: check the server, or "
    "raise --timeout",
    "openai_key": "the OpenAI-compatible server at {openai} refused the API key in $OPENAI_API_KEY{status}: set "
    "$OPENAI_API_KEY to a valid key",
    "ollama_unreachable": "cannot connect to Ollama at {ollama}: check $OLLAMA_HOST, and that `ollama serve` is "
    "running",
    "ollama_timeout": "Ollama at {ollama} did not answer in time: check the server, or raise --timeout",
    "es_unreachable": "cannot connect to Elasticsearch at {es}{reason}: check $ELASTICSEARCH_URL, and that the server "
    "is running",
    "es_key": "Elasticsearch at {es} refused the credentials in $ELASTIC_API_KEY / $ELASTIC_API_KEY_ID{status}",
}
"""The line for each kind of backend failure (`llm.ERROR_KINDS`); any other kind is a missing index."""


def _message(kind: str, config: BackendConfig, error: BaseException | str | None) -> str:
    """The line for `kind`; `error` is the exception, or a recorded failure's exception type name."""
    if kind == "llm_circuit_open":
        refusal = _circuit_open(error)
        if refusal is None:  # a recorded failure: its type name only
            return f"the LLM server's circuit breaker refused the calls: check the server ({_BREAKER_SETTINGS})"
        last = f" (the last: {describe_failure(refusal.last_error)})" if refusal.last_error is not None else ""
        return (
            f"the LLM server {refusal.backend} failed {refusal.failures} calls in a row{last}: its circuit breaker "
            f"fails calls at once for {math.ceil(refusal.retry_after)} s more, then lets one probe call through; check "
            f"the server ({_BREAKER_SETTINGS})"
        )
    if kind not in _MESSAGES:
        return missing_index_message(config)
    return _MESSAGES[kind].format(
        openai=safe_url(config.api_base_url or OPENAI_DEFAULT_URL),
        ollama=safe_url(config.ollama_url),
        es=safe_url(config.elasticsearch_url),
        reason=_reason(error) if isinstance(error, BaseException) else "",
        status=_status(error),
        limit=f"{config.timeout:g} s" if config.timeout is not None else "the client's default timeout",
    )


def missing_index_message(config: BackendConfig) -> str:
    """The message for an Elasticsearch index that does not exist (or holds no passages)."""
    return (
        f"Elasticsearch at {safe_url(config.elasticsearch_url)} has no index {config.elasticsearch_index!r} (or it "
        f"is empty): check --es-index, or create it with `haystack-fusion index SOURCE --document-store "
        f"elasticsearch --es-index {config.elasticsearch_index}"
        + (f" --retriever {config.retriever}`" if config.retriever != "bm25" else "`")
    )


def backend_error_message(error: BaseException, config: BackendConfig) -> str | None:
    """
    One line that says which backend failed and how to fix it, read from the exception and its causes (the openai,
    ollama and Elasticsearch clients' connection, timeout, authentication and not-found errors).

    :param config: The backends the command used (for the URLs and the timeout).
    :returns: The message (no trailing period, no secret), or None when the error is not a backend's.
    """
    if isinstance(error, BackendError):
        return str(error)
    kind = _error_kind(error, config)
    return None if kind is None else _message(kind, config, error)


def _error_kind(error: BaseException, config: BackendConfig) -> str | None:
    """The first `ERROR_KINDS` kind along the exception's chain and each link's bases, or None."""
    chain = exception_chain(error)
    return _kind(((cls.__module__.split(".")[0], cls.__name__) for link in chain for cls in type(link).__mro__), config)


def every_call_failed_message(
    usage: Mapping[str, Any], evidence: Mapping[str, Any], config: BackendConfig
) -> str | None:
    """
    `failed_calls_message` for a run that made LLM calls and all failed (its "unknown" would hide the failure), from
    its `usage` (`calls`, `failed_calls`) and `evidence` (`failures`); else None.
    """
    calls = int(usage.get("calls") or 0)
    if calls and int(usage.get("failed_calls") or 0) >= calls:
        return failed_calls_message(evidence.get("failures") or [], calls, config)
    return None


TIMEOUT_ERRORS = frozenset({"APITimeoutError", "TimeoutException", "ReadTimeout", "ConnectTimeout", "TimeoutError"})
"""The exception class names of a recorded failed call (`{"error": "Name: ..."}`) that mean it timed out."""

QUEUED_TIMEOUT_ADVICE = (
    "a call that timed out while other calls of its round were under way may have spent its time waiting in the "
    "server's queue (a server that answers one call at a time, like llama.cpp's or llama-cpp-python's with one slot): "
    "set --max-calls-in-flight 1 ($HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT=1 when serving) so the calls go one at a time, "
    "and a --timeout ($HAYSTACK_FUSION_TIMEOUT) that covers one call"
)
"""What helps when a multi-call strategy's calls time out on a server that queues them: on llama-cpp-python's one-slot
server (`sure` and `cascade`, 10 SQuAD 2.0 questions, `--timeout 12`) 2 of 20 records failed, 0 of 20 with
`--max-calls-in-flight 1` (355 s wall against 344 s)."""


def queued_timeout_advice(
    failures: Iterable[Mapping[str, Any]], *, calls: int, rounds: int, max_calls_in_flight: int | None
) -> str | None:
    """
    `QUEUED_TIMEOUT_ADVICE` when a failed call timed out and calls went out together (more calls than rounds, and no
    limit of one call in flight).

    :param failures: The run's failed calls (`evidence["failures"]`: `{"error": "ExceptionType: message", ...}`).
    :param max_calls_in_flight: The process-wide bound on calls under way (None: none).
    :returns: The advice, or None.
    """
    timed_out = any(str(f.get("error") or "").split(":", 1)[0].strip() in TIMEOUT_ERRORS for f in failures)
    if not timed_out or calls <= rounds or max_calls_in_flight == 1:
        return None
    return QUEUED_TIMEOUT_ADVICE


def failed_calls_message(failures: Iterable[dict[str, Any]], calls: int, config: BackendConfig) -> str:
    """
    The message for a question whose every one of `calls` LLM calls failed.

    :param failures: The `meta["failures"]` entries of the run (`{"error": "ExceptionType: message", ...}`).
    :returns: `backend_error_message`'s line when a failure's exception type is a known backend error, else a line
        naming the LLM's URL and variables and pointing at the warnings logged for each call.
    """
    for failure in failures:
        error_type = str(failure.get("error") or "").split(":", 1)[0].strip()
        module = "builtins" if error_type == "ConnectionError" else "openai"
        kind = _kind([(module, error_type)], config)
        if kind is not None:
            return _message(kind, config, error_type)
    openai = safe_url(config.api_base_url or OPENAI_DEFAULT_URL)
    settings = {
        "openai": f"--api-base-url or $OPENAI_BASE_URL ({openai}) and $OPENAI_API_KEY",
        "ollama": f"$OLLAMA_HOST ({safe_url(config.ollama_url)})",
    }.get(config.llm, "--model")
    return (
        f"every LLM call failed ({calls} of {calls}) on the {config.llm} LLM: check {settings}; the warnings above "
        "give each call's error"
    )


def _circuit_open(error: BaseException | str | None) -> CircuitOpenError | None:
    """The `CircuitOpenError` in an exception's chain, or None."""
    links = exception_chain(error) if isinstance(error, BaseException) else ()
    return next((link for link in links if isinstance(link, CircuitOpenError)), None)


LLM_SERVER = "The language model server"
DOCUMENT_STORE = "The document store"

_USER_MESSAGES = {
    "unreachable": f"{LLM_SERVER} cannot be reached",
    "timeout": f"{LLM_SERVER} did not answer in time",
    "failing": f"{LLM_SERVER} is failing",
    "key": f"{LLM_SERVER} refused this service's access{{status}}; its operator has to fix it",
    "es_unreachable": f"{DOCUMENT_STORE} cannot be reached",
    "es_key": f"{DOCUMENT_STORE} refused this service's access{{status}}; its operator has to fix it",
    "es_index": f"{DOCUMENT_STORE} holds no passages to search; this service's operator has to fix it",
}
"""What a chat user reads for each kind of failure (`user_error_message`): no URL, flag or variable. The kinds whose
line does not tell the operator to act end with when to try again."""

_USER_KINDS = {
    "openai_unreachable": "unreachable",
    "ollama_unreachable": "unreachable",
    "openai_timeout": "timeout",
    "ollama_timeout": "timeout",
    "openai_key": "key",
    "llm_circuit_open": "failing",
    "es_unreachable": "es_unreachable",
    "es_key": "es_key",
}
"""`ERROR_KINDS` kinds -> `_USER_MESSAGES` keys; any other backend kind is a missing index ("es_index")."""


def _http_status(status: int | None) -> str:
    """ "HTTP 500 Internal Server Error" for a status (its reason phrase when it is a standard one); "" for None."""
    if status is None:
        return ""
    try:
        return f"HTTP {status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


def user_message(kind: str, *, status: int | None = None, retry_after: float | None = None) -> str:
    """
    The line a chat user reads for a failure of `kind` (`_USER_MESSAGES`: "unreachable", "timeout", "failing", "key",
    "es_unreachable", "es_key", "es_index"), e.g. "The language model server is failing: HTTP 500 Internal Server
    Error; try again later".

    :param status: The HTTP status the server answered with, if any (named after "failing", in brackets after "key").
    :param retry_after: Seconds until the server may be called again (an open circuit breaker): "try again in 30 s"
        instead of "try again later"; None or <= 0: "later".
    """
    status_text = _http_status(status)
    if kind in ("key", "es_key"):
        return _USER_MESSAGES[kind].format(status=f" ({status_text})" if status_text else "")
    line = _USER_MESSAGES.get(kind, _USER_MESSAGES["failing"])
    if kind == "es_index":
        return line
    if kind == "failing" and status_text:
        line += f": {status_text}"
    when = f"in {math.ceil(retry_after)} s" if retry_after is not None and retry_after > 0 else "later"
    return f"{line}; try again {when}"


def _user_kind(error: BaseException, config: BackendConfig) -> str | None:
    """The `_USER_MESSAGES` key of a backend exception (what `backend_error_message` reads), or None."""
    if isinstance(error, BackendError):
        return "es_index"
    kind = _error_kind(error, config)
    return None if kind is None else _USER_KINDS.get(kind, "es_index")


def user_error_message(error: BaseException, config: BackendConfig, *, retry_after: float | None = None) -> str | None:
    """
    The line a chat user reads for a backend's exception (one `backend_error_message` recognizes), in the user's
    terms: "The language model server cannot be reached; try again later", "... did not answer in time ...", "The
    language model server is failing: HTTP 500 Internal Server Error; try again in 30 s" (an open circuit breaker:
    the last failure's status, and the breaker's wait unless `retry_after` is given).

    :param retry_after: Seconds until the LLM server may be called again (its open circuit breaker), if known; not
        said of a document store's failure.
    :returns: The line (no URL, flag, variable or server text), or None when the error is not a backend's.
    """
    kind = _user_kind(error, config)
    if kind is None:
        return None
    refusal = _circuit_open(error)
    if kind == "failing" and refusal is not None:
        last = refusal.last_error
        last_kind = _user_kind(last, config) if last is not None else None
        kind = last_kind if last_kind in ("unreachable", "timeout") else "failing"
        wait = retry_after if retry_after is not None else refusal.retry_after
        return user_message(kind, status=refusal.status, retry_after=wait)
    return user_message(kind, status=error_status(error), retry_after=None if kind.startswith("es_") else retry_after)


_UNREACHABLE_ERRORS = frozenset({"APIConnectionError", "ConnectionError", "ConnectError", "ConnectionRefusedError"})
_KEY_ERRORS = frozenset({"AuthenticationError", "PermissionDeniedError"})
_RECORDED_STATUS = re.compile(r"\b(?:Error code:|HTTP) (\d{3})\b")
"""The HTTP status in a recorded failure's text: the `openai` client's "Error code: 500 - ..." or our "(HTTP 500)"."""


def failed_calls_user_message(failures: Iterable[Mapping[str, Any]], *, retry_after: float | None = None) -> str:
    """
    The line a chat user reads when every LLM call of a question failed, from the first of its recorded failures
    (`{"error": "ExceptionType: message"}`) whose type tells what went wrong: a timeout, a refused connection, a
    refused key, or an HTTP status ("The language model server is failing: HTTP 500 Internal Server Error; try again
    later"); "The language model server is failing; try again later" when none does.

    :param retry_after: Seconds until the LLM server may be called again (its open circuit breaker), if known.
    """
    for failure in failures:
        error_type, _, text = str(failure.get("error") or "").partition(":")
        error_type = error_type.strip()
        match = _RECORDED_STATUS.search(text)
        status = int(match.group(1)) if match else _STATUS_OF_TYPE.get(error_type)
        if error_type in _KEY_ERRORS:
            return user_message("key", status=status)
        if error_type in TIMEOUT_ERRORS:
            return user_message("timeout", retry_after=retry_after)
        if error_type in _UNREACHABLE_ERRORS:
            return user_message("unreachable", retry_after=retry_after)
        if status is not None:
            return user_message("failing", status=status, retry_after=retry_after)
    return user_message("failing", retry_after=retry_after)


def llm_server_name(config: BackendConfig) -> str | None:
    """Which LLM server `config` calls, as its circuit breaker is named (and shared): "openai http://host:8000/v1",
    "ollama http://localhost:11434"; None for the embedded model (no server)."""
    if config.llm == "openai":
        return f"openai {safe_url(config.api_base_url or OPENAI_DEFAULT_URL)}"
    if config.llm == "ollama":
        return f"ollama {safe_url(config.ollama_url)}"
    return None
