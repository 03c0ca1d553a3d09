"""
The HTTP clients inside the ChatGenerators our fan-out calls: the requests each call causes, the event loop an
async client belongs to, and what a client's exception says about its backend.

Haystack's OpenAI-based generators (`OpenAIChatGenerator` and its subclasses) and ollama-haystack's
`OllamaChatGenerator` hold a sync client (`client` / `_client`) and an async client (`async_client` /
`_async_client`), created by `warm_up()` / `warm_up_async()`, each over an httpx client. The openai client retries a
failed request by itself (the generator's `max_retries`), so one call can cost several HTTP requests; this module
counts them with an httpx request hook (it fires once per request sent, retries included) and attributes each to
the call under way in its context (`counting_requests`). Nothing here retries or sends anything.

An httpx async client keeps its connections on the event loop that opened them. Haystack's generators keep their
async client across runs, so under a new event loop per question (`asyncio.run(component.run_async(...))` each
time) the next question's requests go out on connections of a closed loop and fail ("Event loop is closed"), after
the server has received them, or are retried by the client. `bind_async_client` gives the fan-out's async path a
client of the running loop instead; it refuses, with a `RuntimeError` that says what to do, when the generator's
async client is in use on another loop that is still running (one generator shared by threads that each run a loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import weakref
from collections.abc import Iterator
from typing import Any

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


SYNC_CLIENT_ATTRIBUTES = ("client", "_client")
"""Where generators keep their sync client: Haystack's OpenAI generators (`client`), ollama-haystack (`_client`)."""

ASYNC_CLIENT_ATTRIBUTES = ("async_client", "_async_client")
"""Where generators keep their async client: Haystack's OpenAI generators, ollama-haystack."""

_REQUESTS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("haystack_fusion_requests", default=None)
"""The request counter of the call under way in this context (one mutable cell), or None outside a counted call."""

_LOCK = threading.Lock()
_CLIENT_LOOPS: weakref.WeakKeyDictionary[Any, weakref.ReferenceType[asyncio.AbstractEventLoop]] = (
    weakref.WeakKeyDictionary()
)
"""Each async client `bind_async_client` made, and the loop it made it on."""


def _count_request(request: Any) -> None:
    """httpx request hook (sync clients): one more request for the call under way in this context."""
    counter = _REQUESTS.get()
    if counter is not None:
        counter[0] += 1


async def _count_request_async(request: Any) -> None:
    """httpx request hook (async clients, which await their hooks): as `_count_request`."""
    _count_request(request)


@contextlib.contextmanager
def counting_requests() -> Iterator[list[int]]:
    """
    Count the HTTP requests that observed clients (`observe_requests`) send in this context, as one call's.

    Tasks and threads started from this context with a copy of it (asyncio tasks; the fan-out's worker threads)
    count into the same cell.

    :returns: A one-element list: the requests counted so far.
    """
    counter = [0]
    token = _REQUESTS.set(counter)
    try:
        yield counter
    finally:
        _REQUESTS.reset(token)


def _http_client(client: Any) -> Any | None:
    """The httpx (or httpx2) client under an openai or ollama client: its `_client`, when it has event hooks."""
    http = getattr(client, "_client", None)
    return http if http is not None and hasattr(http, "event_hooks") else None


def _client_attribute(chat_generator: Any, names: tuple[str, ...]) -> str | None:
    """The first of `names` the generator has as an attribute (its client may still be None), or None."""
    return next((name for name in names if hasattr(chat_generator, name)), None)


def observe_requests(chat_generator: Any, *, async_client: bool) -> bool:
    """
    Count the requests of the generator's sync or async client from now on (idempotent, thread-safe).

    The sync client is created first (`warm_up()`, which Haystack's generators make idempotent) when the generator
    has none yet, so the fan-out's threads share one client rather than each making its own. The async client is
    only observed when it exists (`bind_async_client` creates it).

    :param chat_generator: Any ChatGenerator.
    :param async_client: Observe its async client (the `run_async` path) rather than its sync one.
    :returns: Whether its requests are now counted: False for a generator without an observable HTTP client (the
        embedded model, mocks, clients that are not httpx-based).
    """
    names = ASYNC_CLIENT_ATTRIBUTES if async_client else SYNC_CLIENT_ATTRIBUTES
    attribute = _client_attribute(chat_generator, names)
    if attribute is None:
        return False
    if not async_client and getattr(chat_generator, attribute) is None and hasattr(chat_generator, "warm_up"):
        chat_generator.warm_up()
    http = _http_client(getattr(chat_generator, attribute))
    if http is None:
        return False
    hook = _count_request_async if async_client else _count_request
    with _LOCK:
        hooks = http.event_hooks
        if hook not in hooks["request"]:
            http.event_hooks = {**hooks, "request": [*hooks["request"], hook]}
    return True


async def bind_async_client(chat_generator: Any) -> None:
    """
    Make the generator's async client one that belongs to the running event loop, before a fan-out's `run_async`
    calls.

    A client this function made on the running loop is kept. Any other (none yet, made on a loop that has finished,
    or made outside our fan-out, on a loop it cannot tell) is replaced by a new one from the generator's own
    `warm_up_async()`, with the generator's settings (`http_client_kwargs`, timeout, `max_retries`). The old client
    is not used again: one this function made on a loop that has finished is marked closed (its connections went
    with their loop); any other is only dropped, since calls under way on it (a Haystack component that shares the
    generator, on this loop) keep their reference and must be able to finish. Generators without an async client
    attribute (the embedded model, mocks) are left alone.

    :param chat_generator: Any ChatGenerator.
    :raises RuntimeError: If its async client was made on another event loop that is still running: one generator
        is being used from two event loops at once (threads that each run a loop). Give each loop its own generator
        (a copy: `type(g).from_dict(g.to_dict())`), or use the sync `run`, whose client is not bound to a loop.
    """
    attribute = _client_attribute(chat_generator, ASYNC_CLIENT_ATTRIBUTES)
    warm_up_async = getattr(chat_generator, "warm_up_async", None)
    if attribute is None or warm_up_async is None:
        return
    loop = asyncio.get_running_loop()
    with _LOCK:
        client = getattr(chat_generator, attribute)
        owner = _CLIENT_LOOPS.get(client) if client is not None else None
        owner_loop = owner() if owner is not None else None
        if owner_loop is loop:
            return
        if owner_loop is not None and owner_loop.is_running() and not owner_loop.is_closed():
            raise RuntimeError(
                f"{type(chat_generator).__name__}'s async client is in use on another running event loop: one "
                "generator cannot serve two event loops at once. Give each thread or loop its own generator "
                "(`type(g).from_dict(g.to_dict())`), or call the component's sync `run`."
            )
        setattr(chat_generator, attribute, None)
    await warm_up_async()
    new_client = getattr(chat_generator, attribute)
    if new_client is not None:
        with _LOCK:
            _CLIENT_LOOPS[new_client] = weakref.ref(loop)
    if owner is not None and hasattr(client, "close"):
        # Ours, and its loop has finished: mark it closed, so that it does not try to close itself on this loop
        # when it is garbage-collected (openai's does), which fails with "Event loop is closed". Closing its
        # connections fails the same way, and is skipped: they went with their loop.
        with contextlib.suppress(Exception):
            await client.close()
