"""
One-line messages for a backend that cannot be reached or refuses: what the served wrappers answer with HTTP 503.

A pipeline run fails with the integration's own exception somewhere in its cause chain (`openai.APIConnectionError`
under Haystack's `PipelineRuntimeError`, `elastic_transport.ConnectionError`, Ollama's `ConnectionError`, ...).
`backend_error_message` finds it and says, in one line, which backend failed, the URL and the environment variable
that configure it, and why (connection refused, timed out, HTTP status). URLs lose any user and password, and no
text of the backend's own error is copied (an OpenAI 401 quotes part of the key), so the line holds no secret.
Anything else (a bug) is not a backend error: the caller lets it through.

Needs no extra: classes are recognized by module and name, so the integrations need not be installed.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from haystack_fusion.backends import DEFAULT_MODELS, BackendConfig

OPENAI_DEFAULT_URL = "https://api.openai.com/v1"


def redact_url(url: str) -> str:
    """
    A URL without its user and password (`http://user:pw@host:9200` -> `http://host:9200`); comma-separated lists
    of URLs are redacted one by one.
    """
    redacted = []
    for part in url.split(","):
        part = part.strip()
        try:
            split = urlsplit(part)
        except ValueError:
            redacted.append("<an invalid URL>")
            continue
        if split.username is not None or split.password is not None:
            host = split.hostname or ""
            netloc = f"{host}:{split.port}" if split.port else host
            part = urlunsplit((split.scheme, netloc, split.path, split.query, split.fragment))
        redacted.append(part)
    return ",".join(redacted)


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _reason(error: BaseException) -> str:
    """Why a connection failed, from the innermost cause: never the text of the error (it may quote a URL or key)."""
    innermost = list(_chain(error))
    for cause in reversed(innermost):
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, ConnectionResetError):
            return "connection reset"
        if isinstance(cause, socket.gaierror):
            return "host name not resolved"
        if isinstance(cause, TimeoutError) or "Timeout" in type(cause).__name__:
            return "timed out"
    return "connection failed"


def _status(error: BaseException) -> int | None:
    status = getattr(error, "status_code", None)
    if status is None:
        status = getattr(getattr(error, "meta", None), "status", None)
    return status if isinstance(status, int) else None


def _llm_where(config: BackendConfig) -> str:
    if config.llm == "ollama":
        return f"OLLAMA_HOST={redact_url(config.ollama_url)}"
    if config.api_base_url:
        return f"OPENAI_BASE_URL={redact_url(config.api_base_url)}"
    return f"{OPENAI_DEFAULT_URL} (OPENAI_BASE_URL is unset)"


def _openai_message(name: str, status: int | None, reason: str, config: BackendConfig) -> str:
    where = _llm_where(config)
    model = config.model or DEFAULT_MODELS.get(config.llm, "")
    if name in ("APIConnectionError", "APITimeoutError"):
        return f"The LLM server could not be reached at {where} ({reason})"
    if name in ("AuthenticationError", "PermissionDeniedError"):
        return f"The LLM server at {where} refused the API key in OPENAI_API_KEY (HTTP {status})"
    if name == "NotFoundError":
        return f"The LLM server at {where} has no model {model!r} (HAYSTACK_FUSION_MODEL; HTTP 404)"
    if name == "RateLimitError":
        return (
            f"The LLM server at {where} is rate-limiting requests (HTTP 429) beyond the client's retries "
            "(HAYSTACK_FUSION_MAX_RETRIES)"
        )
    return f"The LLM server at {where} answered HTTP {status}" if status else f"The LLM server at {where} failed"


def _elasticsearch_message(error: BaseException, reason: str, config: BackendConfig) -> str:
    url = f"ELASTICSEARCH_URL={redact_url(config.elasticsearch_url)}"
    status = _status(error)
    if status is None:
        return f"Elasticsearch could not be reached at {url} ({reason})"
    if status == 404:
        return (
            f"Elasticsearch at {url} has no index {config.elasticsearch_index!r} "
            "(HAYSTACK_FUSION_ELASTICSEARCH_INDEX): index passages first "
            "(`haystack-fusion index PASSAGES --document-store elasticsearch`)"
        )
    if status in (401, 403):
        return f"Elasticsearch at {url} refused the credentials in ELASTIC_API_KEY (HTTP {status})"
    return f"Elasticsearch at {url} answered HTTP {status}"


def _ollama_message(status: int | None, reason: str, config: BackendConfig) -> str:
    where = _llm_where(config)
    model = config.model or DEFAULT_MODELS["ollama"]
    if status is None:
        return f"Ollama could not be reached at {where} ({reason})"
    if status == 404:
        return f"Ollama at {where} has no model {model!r}: `ollama pull {model}`, or set HAYSTACK_FUSION_MODEL"
    return f"Ollama at {where} answered HTTP {status}"


def backend_error_message(error: BaseException, config: BackendConfig) -> str | None:
    """
    The one-line message for a failure of the backend `config` names, or None when `error` is not one.

    Recognized anywhere in the cause chain, outermost first: the `openai` client's connection, timeout and HTTP
    status errors (`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `HAYSTACK_FUSION_MODEL`), Elasticsearch's transport and API
    errors (`ELASTICSEARCH_URL`, `HAYSTACK_FUSION_ELASTICSEARCH_INDEX`, `ELASTIC_API_KEY`), and Ollama's connection
    and response errors (`OLLAMA_HOST`, `HAYSTACK_FUSION_MODEL`).

    ### Usage example
    ```python
    import httpx
    import openai

    from haystack_fusion.backends import BackendConfig
    from haystack_fusion.serving.backend_errors import backend_error_message

    config = BackendConfig(llm="openai", api_base_url="http://127.0.0.1:9/v1")
    error = openai.APIConnectionError(request=httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions"))
    print(backend_error_message(error, config))
    # The LLM server could not be reached at OPENAI_BASE_URL=http://127.0.0.1:9/v1 (connection failed)
    ```

    :param error: What the pipeline run raised.
    :param config: The backend the wrapper was built on (its URLs and variables are named).
    :returns: One line naming the backend's URL (without credentials) and environment variable, and the reason
        (connection refused, timed out, HTTP status); None for any other error.
    """
    reason = _reason(error)
    for cause in _chain(error):
        module = type(cause).__module__.split(".")[0]
        name = type(cause).__name__
        if module == "openai" and config.llm == "openai":
            return _openai_message(name, _status(cause), reason, config)
        if module in ("elastic_transport", "elasticsearch") and config.store == "elasticsearch":
            return _elasticsearch_message(cause, reason, config)
        if config.llm == "ollama" and (
            (module == "ollama" and name == "ResponseError")
            or type(cause) is ConnectionError  # the ollama client's own, raised "from None"
            or (module.startswith("httpx") and ("Connect" in name or "Timeout" in name))
        ):
            return _ollama_message(_status(cause) if module == "ollama" else None, reason, config)
    return None


def failed_calls_message(usage: dict[str, Any], failures: list[dict[str, Any]], config: BackendConfig) -> str | None:
    """
    The one-line message when every LLM call of a run failed (each recorded as an abstention, so the run itself
    answered "unknown"), or None when at least one call succeeded.

    :param usage: The run's usage (`calls`, `failed_calls`).
    :param failures: The recorded failures, `{"index": i, "error": "ExceptionType: message"}` (`FanOutResult`).
    :param config: The backend the wrapper was built on.
    :returns: As `backend_error_message` for the first failure's exception type, else a line naming the LLM's URL and
        the failed calls' count.
    """
    calls = int(usage.get("calls", 0) or 0)
    if calls == 0 or int(usage.get("failed_calls", 0) or 0) < calls:
        return None
    name = str((failures[0] if failures else {}).get("error") or "").split(":", 1)[0].strip()
    if config.llm == "openai" and name in _OPENAI_STATUS:
        reason = "timed out" if name == "APITimeoutError" else "connection failed"
        return _openai_message(name, _OPENAI_STATUS[name], reason, config)
    if config.llm == "ollama" and name in ("ConnectionError", "ConnectError"):
        return _ollama_message(None, "connection failed", config)
    return f"Every LLM call failed ({calls} of {calls}; the first: {name or 'no reply'}) at {_llm_where(config)}"


_OPENAI_STATUS: dict[str, int | None] = {
    "APIConnectionError": None,
    "APITimeoutError": None,
    "AuthenticationError": 401,
    "PermissionDeniedError": 403,
    "NotFoundError": 404,
    "RateLimitError": 429,
}
"""The `openai` client's errors whose recorded name alone says what failed (`failed_calls_message`)."""
