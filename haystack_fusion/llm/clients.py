"""What an LLM client's exception says about its backend: `ERROR_KINDS`, `exception_chain`, `backend_unusable`."""

from __future__ import annotations

from collections.abc import Iterator

ERROR_KINDS: dict[tuple[str, str], str] = {
    ("openai", "AuthenticationError"): "openai_key",
    ("openai", "PermissionDeniedError"): "openai_key",
    ("openai", "APITimeoutError"): "openai_timeout",
    ("openai", "APIConnectionError"): "openai_unreachable",
    ("elastic_transport", "ConnectionTimeout"): "es_unreachable",
    ("elastic_transport", "ConnectionError"): "es_unreachable",
    ("elasticsearch", "AuthenticationException"): "es_key",
    ("elasticsearch", "AuthorizationException"): "es_key",
    ("elasticsearch", "NotFoundError"): "es_index",
    ("httpx", "TimeoutException"): "ollama_timeout",
    ("builtins", "ConnectionError"): "ollama_unreachable",
}
"""(top-level module, class name) of an exception or one of its bases -> what went wrong. `ConnectionError` and
httpx's timeouts are the ollama client's (it turns `httpx.ConnectError` into a builtin `ConnectionError`). The openai
client raises `APITimeoutError` (a subclass of `APIConnectionError`): the first match along the class's bases wins,
so a timeout is not taken for a refused connection."""

UNUSABLE_BACKEND_KINDS = frozenset({"openai_key", "openai_unreachable", "ollama_unreachable"})
"""The `ERROR_KINDS` of an LLM call that say the backend itself cannot be used (it refuses the connection or the
key), so that every other call to it fails the same way; a timeout or an error status is one call's failure."""


def exception_chain(error: BaseException) -> Iterator[BaseException]:
    """`error`, then the exceptions it was raised from (causes and contexts), depth first, each once."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [error]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        stack.extend([current.__context__, current.__cause__])


def error_kinds(error: BaseException) -> Iterator[str]:
    """The `ERROR_KINDS` an exception and its causes match, along each link's class and its bases, in order."""
    for link in exception_chain(error):
        for cls in type(link).__mro__:
            kind = ERROR_KINDS.get((cls.__module__.split(".")[0], cls.__name__))
            if kind is not None:
                yield kind


def backend_unusable(error: BaseException) -> bool:
    """
    Whether an LLM call's exception says its backend cannot be used at all (`UNUSABLE_BACKEND_KINDS`: a refused
    connection or key), rather than that this one call failed (a timeout, a 5xx, a malformed reply).

    :param error: What the ChatGenerator raised.
    :returns: True when the first LLM-client kind the exception matches is an unusable backend's.
    """
    kind = next((kind for kind in error_kinds(error) if not kind.startswith("es_")), None)
    return kind in UNUSABLE_BACKEND_KINDS
