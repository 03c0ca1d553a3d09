"""The ASGI middleware in front of Hayhooks' apps: a server on 127.0.0.1 is still reachable from web pages (DNS
rebinding), so `Host` (`allowed_hosts`), `Origin` and body size are checked."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

from fastapi import HTTPException
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocketClose

from haystack_fusion.serving.logs import note_refusal
from haystack_fusion.settings import DEFAULT_MAX_BODY_BYTES

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")  # the `Host` names every served app answers
OPENAI_PATHS = ("/v1/", "/chat/completions", "/models")  # the OpenAI-compatible routes, whose errors take its shape


class ServingError(HTTPException):
    """An error answer, in OpenAI's shape on its routes: `message` (what failed and what to change, never a secret nor
    the user's text), a short `code` ("server_busy", ...), the request field it is about (`param`) and, for the server
    log only, its `cause` (URL, variable, flag)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str,
        headers: dict[str, str] | None = None,
        param: str | None = None,
        cause: str | None = None,
    ) -> None:
        super().__init__(status_code=status, detail=" ".join(message.split()), headers=headers)
        self.code, self.param, self.cause = code, param, cause

    @property
    def logged(self) -> str:
        """The message, and the `cause` when there is one."""
        return f"{self.detail} (cause: {self.cause})" if self.cause else str(self.detail)


def openai_error(message: str, *, status: int, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """`{"error": {"message", "type", "code", "param"}}`, OpenAI's shape; `code` None: "http_<status>"."""
    kind = {401: "authentication_error", 429: "rate_limit_error"}.get(status)
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    one_line = " ".join(str(message).split())
    return {"error": {"message": one_line, "type": kind, "code": code or f"http_{status}", "param": param}}


def is_openai_path(path: str) -> bool:
    """Whether a path (without the root path) is one of the OpenAI-compatible routes."""
    return any(path == prefix.rstrip("/") or path.startswith(prefix) for prefix in OPENAI_PATHS)


def route_path(scope: Scope) -> str:
    """The request's path without the app's root path."""
    path, root = scope.get("path", "/"), scope.get("root_path", "")
    return (path[len(root) :] or "/") if root and path.startswith(root) else path


async def refuse(
    scope: Scope, receive: Receive, send: Send, status: int, message: str, *, code: str, **kwargs: Any
) -> None:
    """Close a WebSocket; answer HTTP with `status` and `{"detail": message}` (`openai_error` on the OpenAI-compatible
    routes; `kwargs` to `JSONResponse`), noted for the refusal log line (`logs.note_refusal`)."""
    note_refusal(scope, code, message)
    if scope["type"] == "websocket":
        await WebSocketClose(code=1008)(scope, receive, send)
        return
    body = openai_error(message, status=status, code=code) if is_openai_path(route_path(scope)) else {"detail": message}
    await JSONResponse(body, status_code=status, **kwargs)(scope, receive, send)


def allowed_hosts(bind_host: str | None, extra: Sequence[str] = ()) -> list[str]:
    """The `Host` names a served app answers, lower-cased, once each: `LOOPBACK_HOSTS`, the bound address (unless a
    wildcard) and `extra`."""
    candidates = [*LOOPBACK_HOSTS, *extra]
    if bind_host:
        try:
            address = ipaddress.ip_address(bind_host.strip("[]"))
        except ValueError:
            candidates.append(bind_host)
        else:
            if not address.is_unspecified:
                candidates.append(f"[{address}]" if address.version == 6 else str(address))
    return list(dict.fromkeys(host.strip().lower() for host in candidates if host.strip()))


class OriginMiddleware:
    """ASGI middleware: a request whose `Origin` is neither its own (its `Host`) nor in `allowed_origins` gets HTTP 403
    (a CORS preflight too), a WebSocket is closed (1008). No `Origin` (an API client) passes, `Origin: null` does not:
    browsers send `Origin` with every cross-origin request, so another origin's page can neither read nor drive the
    app."""

    def __init__(self, app: ASGIApp, *, allowed_origins: Iterable[str] = ()) -> None:
        self.app = app
        self.allowed_origins = frozenset(origin.rstrip("/").lower() for origin in allowed_origins)

    def allows(self, origin: str, host: str) -> bool:
        """Whether a request to `host` (`Host` header) from `origin` (`Origin` header) is let in."""
        origin = origin.strip().rstrip("/").lower()
        if origin in self.allowed_origins:
            return True
        try:
            netloc = urlsplit(origin).netloc
        except ValueError:
            return False
        return bool(netloc) and netloc == host.strip().lower()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            headers = Headers(scope=scope)
            host = headers.get("host", "")
            if not all(self.allows(origin, host) for origin in headers.getlist("origin")):
                message = "Forbidden: requests from other web origins are refused"
                await refuse(scope, receive, send, 403, message, code="bad_origin")
                return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """ASGI middleware: a body over `max_bytes` gets HTTP 413 (ValueError for `max_bytes` below 1); a client that
    disconnects while the app works (a chat client's Stop) cancels the app's task, so pending LLM calls are not made."""

    def __init__(self, app: ASGIApp, *, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"`max_bytes` must be at least 1, got {max_bytes}")
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length", "")
        chunks: list[bytes] = []
        size, more = int(length) if length.isdigit() else 0, True  # a length over the limit: refused unread
        size = size if size > self.max_bytes else 0
        while more and size <= self.max_bytes:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size, more = size + len(chunks[-1]), message.get("more_body", False)
        if size > self.max_bytes:
            too_large = f"Request body too large: this server takes at most {self.max_bytes} bytes"
            await refuse(scope, receive, send, 413, too_large, code="request_too_large")
            return
        pending: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
        disconnected = asyncio.Event()

        async def replay() -> Message:
            if pending:
                return pending.pop()
            await disconnected.wait()
            return {"type": "http.disconnect"}

        app_task = asyncio.ensure_future(self.app(scope, replay, send))

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected.set()
            app_task.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await app_task
        except asyncio.CancelledError:
            if not disconnected.is_set():
                raise  # the server itself is cancelling this request
        finally:
            watcher.cancel()


class StreamEndMiddleware:
    """ASGI middleware: an event stream of the OpenAI-compatible routes ends with `data: [DONE]`, as clients expect."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_openai_path(route_path(scope)):
            await self.app(scope, receive, send)
            return
        streaming = False

        async def send_with_end(message: Message) -> None:
            nonlocal streaming
            if message["type"] == "http.response.start":
                content_type = Headers(raw=message.get("headers", [])).get("content-type", "")
                streaming = content_type.startswith("text/event-stream")
            elif streaming and message["type"] == "http.response.body" and not message.get("more_body", False):
                await send({"type": "http.response.body", "body": message.get("body", b""), "more_body": True})
                message = {"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False}
            await send(message)

        await self.app(scope, receive, send_with_end)
