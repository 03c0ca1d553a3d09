"""
Every setting the environment gives (the one place that reads `HAYSTACK_FUSION_*`, `ELASTICSEARCH_URL`,
`OPENAI_BASE_URL` and `OLLAMA_HOST`), and the defaults that depend on the LLM; the variables are listed in
docs/reference/settings.md.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

API_KEY_VARIABLE = "HAYSTACK_FUSION_API_KEY"
CORS_ORIGINS_VARIABLE = "HAYSTACK_FUSION_CORS_ORIGINS"
ALLOWED_HOSTS_VARIABLE = "HAYSTACK_FUSION_ALLOWED_HOSTS"
MAX_BODY_BYTES_VARIABLE = "HAYSTACK_FUSION_MAX_BODY_BYTES"
LLM_VARIABLE = "HAYSTACK_FUSION_LLM"
DOCUMENT_STORE_VARIABLE = "HAYSTACK_FUSION_DOCUMENT_STORE"
STORE_VARIABLE = "HAYSTACK_FUSION_STORE"
SQUAD_VARIABLE = "HAYSTACK_FUSION_SQUAD"
CHAT_CLIENT_VARIABLE = "HAYSTACK_FUSION_CHAT_CLIENT"
LOG_LEVEL_VARIABLE = "HAYHOOKS_LOG_LEVEL"
SPECULATIVE_VARIABLE = "HAYSTACK_FUSION_SPECULATIVE"

CACHE_DIR = Path("~/.cache/haystack_fusion")  # downloads and the default index
DEFAULT_INDEX_PATH = "~/.cache/haystack_fusion/index.json"

BACKEND_VARIABLES = {
    "store": DOCUMENT_STORE_VARIABLE,
    "index_path": STORE_VARIABLE,
    "elasticsearch_url": "ELASTICSEARCH_URL",
    "api_base_url": "OPENAI_BASE_URL",
    "ollama_url": "OLLAMA_HOST",
}
"""`BackendConfig` fields with variables of their own; any other field `f` is read from `HAYSTACK_FUSION_<F>`."""


def _is_on(value: str) -> bool:
    return value.lower() in ("1", "true", "yes", "on")


_BACKEND_CASTS: dict[str, Callable[[str], Any]] = {
    "top_k": int,
    "max_retries": int,
    "max_tokens": int,
    "timeout": float,
    "logprobs": _is_on,
    "llama_log": _is_on,
}

SERVING_LIMIT_VARIABLES = {
    "max_requests": "HAYSTACK_FUSION_MAX_REQUESTS",
    "max_waiting": "HAYSTACK_FUSION_MAX_WAITING",
    "queue_timeout": "HAYSTACK_FUSION_QUEUE_TIMEOUT",
    "max_question_chars": "HAYSTACK_FUSION_MAX_QUESTION_CHARS",
}
"""`serving.hayhooks.ServingLimits` fields and the variables that set them."""

DEPRECATED_VARIABLES = {"HAYSTACK_FUSION_MAX_IN_FLIGHT": "HAYSTACK_FUSION_MAX_REQUESTS"}
"""Deprecated variable -> its new name: read when that one is unset, with a warning."""


def warn_deprecated(old: str, new: str) -> None:
    """Warn (a `FutureWarning`, shown to users) that `old` is a deprecated name of `new`."""
    warnings.warn(f"{old} is deprecated: it is an old name of {new}", FutureWarning, stacklevel=3)


def _variable(env: Mapping[str, str], variable: str) -> str:
    """`variable`, or its deprecated name when only that one is set (with a warning)."""
    for old, new in DEPRECATED_VARIABLES.items():
        if new == variable and not env.get(new, "").strip() and env.get(old, "").strip():
            warn_deprecated(old, new)
            return old
    return variable


def backend_values(fields: Iterable[str], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The `BackendConfig` fields the environment (default `os.environ`) sets (`BACKEND_VARIABLES`, else
    `HAYSTACK_FUSION_<FIELD>`), cast: numbers, bools (1, true, yes, on), str; ValueError for a number that is none."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for field_name in fields:
        variable = BACKEND_VARIABLES.get(field_name, f"HAYSTACK_FUSION_{field_name.upper()}")
        if env.get(variable):
            values[field_name] = _BACKEND_CASTS.get(field_name, str)(env[variable])
    return values


def serving_limit_values(env: Mapping[str, str] | None = None) -> dict[str, float | int]:
    """The `SERVING_LIMIT_VARIABLES` the environment sets: `queue_timeout` in seconds, the rest int; ValueError."""
    env = os.environ if env is None else env
    values: dict[str, float | int] = {}
    for name, variable in SERVING_LIMIT_VARIABLES.items():
        value = _number(env, _variable(env, variable), float if name == "queue_timeout" else int)
        if value is not None:
            values[name] = value
    return values


def _number(env: Mapping[str, str], variable: str, cast: Callable[[str], float | int]) -> float | int | None:
    """`variable`'s value cast; None when unset or empty; ValueError naming it when no number."""
    raw = env.get(variable, "").strip()
    if not raw:
        return None
    try:
        return cast(raw)
    except ValueError:
        raise ValueError(f"{variable} must be a number, got {raw!r}") from None


def log_level(env: Mapping[str, str] | None = None) -> str:
    """The lowest level `haystack-fusion serve` logs: `HAYHOOKS_LOG_LEVEL`, else "INFO"."""
    env = os.environ if env is None else env
    return (env.get(LOG_LEVEL_VARIABLE) or "INFO").strip().upper()


def index_path(value: str | None = None, env: Mapping[str, str] | None = None) -> Path:
    """The saved in-memory index: `value` (`--store`), else `HAYSTACK_FUSION_STORE`, else `DEFAULT_INDEX_PATH`."""
    env = os.environ if env is None else env
    return Path(value or env.get(STORE_VARIABLE) or DEFAULT_INDEX_PATH).expanduser()


def squad_file(env: Mapping[str, str] | None = None) -> str | None:
    """The SQuAD JSON file `HAYSTACK_FUSION_SQUAD` names, or None when it is unset."""
    return (os.environ if env is None else env).get(SQUAD_VARIABLE) or None


def strategy_defaults(llm: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`StrategyConfig` fields that depend on the LLM: the embedded base model gets SuRe's few-shot prompt (Kim et al.,
    Listing 13) and 400 tokens for Chain-of-Note's notes; `speculative` from `env`'s `HAYSTACK_FUSION_SPECULATIVE`."""
    on = _is_on((os.environ if env is None else env).get(SPECULATIVE_VARIABLE, ""))
    defaults = {"few_shot": True, "note_generation_kwargs": {"max_tokens": 400}} if llm == "local" else {}
    return {**defaults, "speculative": True} if on else defaults


_ORIGIN = re.compile(r"https?://[^/\s*]+")  # scheme, host and optional port; no path, no wildcard
DEFAULT_MAX_BODY_BYTES = 1024 * 1024  # the largest request body a served app reads by default, in bytes
_HOST = re.compile(r"(?:\*\.)?[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]")  # a name (`*.` allowed), IPv4 or [IPv6]; no port


@dataclass(frozen=True)
class AccessSettings:
    """
    Who may reach a served app, and what a request may hold.

    :param api_key: The key every route but `GET /status` requires (`Authorization: Bearer <key>`); None: no key.
    :param cors_origins: Web origins (`scheme://host[:port]`) whose pages may call the app from a browser (CORS).
    :param allowed_hosts: `Host` names answered besides the loopback names and the bound address.
    :param max_body_bytes: The largest request body, in bytes (>= 1); larger ones get HTTP 413 unread.
    :raises ValueError: For an empty key or one with whitespace, a malformed origin or host, or a limit below 1.
    """

    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    def __post_init__(self) -> None:
        if self.api_key is not None and (not self.api_key or any(char.isspace() for char in self.api_key)):
            raise ValueError("The API key must be a non-empty string without whitespace")
        for origin in self.cors_origins:
            if not _ORIGIN.fullmatch(origin):
                raise ValueError(
                    f"{origin!r} is not a web origin: give scheme, host and optional port, e.g. "
                    "https://app.example.com (no path, no wildcard)"
                )
        for host in self.allowed_hosts:
            if not _HOST.fullmatch(host):
                raise ValueError(
                    f"{host!r} is not a host name: give a name or address without port or path, e.g. "
                    "fusion.example.com, *.example.com or [2001:db8::1]"
                )
        if self.max_body_bytes < 1:
            raise ValueError(f"The body limit must be at least 1 byte, got {self.max_body_bytes}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AccessSettings:
        """The settings the environment's variables give (lists comma-separated); ValueError naming the variable."""
        env = os.environ if env is None else env
        key = env.get(API_KEY_VARIABLE, "").strip() or None
        origins = tuple(
            origin.strip().rstrip("/") for origin in env.get(CORS_ORIGINS_VARIABLE, "").split(",") if origin.strip()
        )
        hosts = tuple(host.strip() for host in env.get(ALLOWED_HOSTS_VARIABLE, "").split(",") if host.strip())
        raw_limit = env.get(MAX_BODY_BYTES_VARIABLE, "").strip()
        if raw_limit and not raw_limit.isdigit():
            raise ValueError(f"{MAX_BODY_BYTES_VARIABLE} must be a whole number of bytes, got {raw_limit!r}")
        limit = int(raw_limit) if raw_limit else DEFAULT_MAX_BODY_BYTES
        names = ("api_key", "cors_origins", "allowed_hosts", "max_body_bytes")
        variables = (API_KEY_VARIABLE, CORS_ORIGINS_VARIABLE, ALLOWED_HOSTS_VARIABLE, MAX_BODY_BYTES_VARIABLE)
        for name, variable, value in zip(names, variables, (key, origins, hosts, limit), strict=True):
            try:
                cls(**{name: value})  # type: ignore[arg-type]
            except ValueError as error:
                raise ValueError(f"{variable}: {error}") from None
        return cls(api_key=key, cors_origins=origins, allowed_hosts=hosts, max_body_bytes=limit)


MAX_CALLS_IN_FLIGHT_ENV = "HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT"  # read at every call (`llm.max_calls_in_flight`)


def calls_in_flight_limit_from_env(env: Mapping[str, str] | None = None) -> int | None:
    """`HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT`, else None (no limit); ValueError for anything but an integer >= 1."""
    value = (os.environ if env is None else env).get(MAX_CALLS_IN_FLIGHT_ENV, "").strip()
    try:
        number = int(value) if value else None
    except ValueError:
        number = 0
    if number is not None and number < 1:
        raise ValueError(f"`{MAX_CALLS_IN_FLIGHT_ENV}` must be an integer >= 1 (LLM calls in flight), got {value!r}")
    return number


CHAT_CLIENTS = ("auto", "open-webui", "openai")  # the served chat's dialects (`serving.protocol.dialect`)


def chat_client_from_env(env: Mapping[str, str] | None = None) -> str:
    """`HAYSTACK_FUSION_CHAT_CLIENT`, lower-cased, one of `CHAT_CLIENTS` (unset: "auto"); else ValueError."""
    value = (os.environ if env is None else env).get(CHAT_CLIENT_VARIABLE, "").strip().lower() or "auto"
    if value not in CHAT_CLIENTS:
        raise ValueError(f"{CHAT_CLIENT_VARIABLE} must be one of {', '.join(CHAT_CLIENTS)}, got {value!r}")
    return value


BREAKER_FAILURES_VARIABLE = "HAYSTACK_FUSION_BREAKER_FAILURES"
BREAKER_COOLDOWN_VARIABLE = "HAYSTACK_FUSION_BREAKER_COOLDOWN"
DEFAULT_BREAKER_FAILURES = 5  # `BreakerSettings.failure_threshold`
DEFAULT_BREAKER_COOLDOWN = 30.0  # `BreakerSettings.cooldown`, seconds


@dataclass(frozen=True)
class BreakerSettings:
    """
    The circuit breaker of each LLM server a served process calls (`breaker.CircuitBreaker`).

    :param failure_threshold: Consecutive failed calls that open a server's breaker (>= 1), or 0: no breaker.
    :param cooldown: Seconds an open breaker fails calls at once before it lets one probe call through (> 0).
    """

    failure_threshold: int = DEFAULT_BREAKER_FAILURES
    cooldown: float = DEFAULT_BREAKER_COOLDOWN

    def __post_init__(self) -> None:
        if isinstance(self.failure_threshold, bool) or not isinstance(self.failure_threshold, int):
            raise ValueError(f"`failure_threshold` must be a whole number of calls, got {self.failure_threshold!r}")
        if self.failure_threshold < 0:
            raise ValueError(f"`failure_threshold` must be at least 0 (0: no breaker), got {self.failure_threshold}")
        if not 0 < self.cooldown < float("inf"):
            raise ValueError(f"`cooldown` must be a positive number of seconds, got {self.cooldown}")

    @property
    def enabled(self) -> bool:
        return self.failure_threshold > 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BreakerSettings:
        """The settings the environment's variables give; ValueError naming a variable out of range or no number."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for name, variable, cast in (
            ("failure_threshold", BREAKER_FAILURES_VARIABLE, int),
            ("cooldown", BREAKER_COOLDOWN_VARIABLE, float),
        ):
            if (value := _number(env, variable, cast)) is not None:
                values[name] = value
                try:
                    cls(**{name: values[name]})
                except ValueError as error:
                    raise ValueError(f"{variable}: {error}") from None
        return cls(**values)
