"""
One-line messages, printed instead of a traceback, for backends that cannot be used (a server that refuses the
connection or does not answer, a key it refuses, a missing Elasticsearch index). Each names the URL and the option or
variable to fix and never a secret: built from the configuration and the exception's class and HTTP status, never
from a server's text, with URLs stripped of user name, password and query.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from haystack_fusion.backends.config import BackendConfig
from haystack_fusion.llm import ERROR_KINDS, exception_chain

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
    chain = exception_chain(error)
    names = ((cls.__module__.split(".")[0], cls.__name__) for link in chain for cls in type(link).__mro__)
    kind = _kind(names, config)
    return None if kind is None else _message(kind, config, error)


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
