"""The served apps (`serve` extra): Hayhooks' HTTP and MCP apps with a fixed set of strategies, behind the guards."""

from __future__ import annotations

import hmac
import importlib.util
import ipaddress
import json
import re
import secrets
import tempfile
from base64 import b64decode, b64encode
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

try:
    import uvicorn
    from fastapi import FastAPI
    from fastapi.encoders import jsonable_encoder
    from fastapi.exception_handlers import http_exception_handler
    from fastapi.exceptions import RequestValidationError
    from hayhooks.server.app import create_app as create_hayhooks_app
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
    from starlette.types import ASGIApp, Receive, Scope, Send
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("Serving with Hayhooks needs the `serve` extra: pip install 'haystack-fusion[serve]'") from error

from haystack import logging

from haystack_fusion.backends.checks import check_backend
from haystack_fusion.backends.pinned import (
    hayhooks_mcp_app,
    patch_hayhooks_run_log,
    request_ids_outermost,
    set_hayhooks_settings,
    with_request_ids,
)
from haystack_fusion.serving.chat import digest
from haystack_fusion.serving.guards import (
    BodyLimitMiddleware,
    OriginMiddleware,
    ServingError,
    StreamEndMiddleware,
    allowed_hosts,
    is_openai_path,
    openai_error,
    refuse,
    route_path,
)
from haystack_fusion.serving.hayhooks import CHAINLIT_ELEMENTS_DIR
from haystack_fusion.serving.logs import (
    RefusalLogMiddleware,
    configure_serve_logging,
    kept_stdlib_logging,
    note_refusal,
)
from haystack_fusion.serving.protocol import CHAT_UI_CLIENT, CHAT_UI_HEADER
from haystack_fusion.serving.yaml import WRAPPER_FILE, wrapper_source
from haystack_fusion.settings import API_KEY_VARIABLE, AccessSettings
from haystack_fusion.strategies import STRATEGIES

logger = logging.getLogger(__name__)

UNAUTHORIZED = "Unauthorized: send the API key as Authorization: Bearer <key>"  # every 401's message


class ApiKeyMiddleware:
    """ASGI middleware: `Bearer <key>`, Basic with the key as password, a CORS preflight and `/status` pass; else
    HTTP 401 (a `Basic` challenge under the `browser_paths` prefixes, else `Bearer`), a WebSocket is closed."""

    def __init__(self, app: ASGIApp, *, api_key: str, browser_paths: Iterable[str] = ()) -> None:
        self.app, self._api_key, self.browser_paths = app, api_key.encode(), tuple(browser_paths)

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, credentials = headers.get(b"authorization", b"").partition(b" ")
        credentials = credentials.strip()
        if scheme.lower() == b"basic":
            try:
                credentials = b64decode(credentials, validate=True).partition(b":")[2]
            except ValueError:
                return False
        return scheme.lower() in (b"bearer", b"basic") and hmac.compare_digest(credentials, self._api_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers, path = dict(scope["headers"]), route_path(scope)
        preflight = scope.get("method") == "OPTIONS" and {b"origin", b"access-control-request-method"} <= set(headers)
        if path == "/status" or preflight or self._authorized(headers):
            await self.app(scope, receive, send)
            return
        browser = any(path == prefix or path.startswith(f"{prefix}/") for prefix in self.browser_paths)
        challenge = 'Basic realm="haystack-fusion", charset="UTF-8"' if browser else "Bearer"
        await refuse(
            scope, receive, send, 401, UNAUTHORIZED, code="invalid_api_key", headers={"www-authenticate": challenge}
        )


# Hayhooks' routes not served (404, not in the spec): each path and below it, only below for an entry ending "/"
UNSERVED_PATHS = ("/responses", "/v1/responses", "/files", "/v1/files", "/traces", "/draw/", "/status/")

_STRING: dict[str, Any] = {"type": "string"}
_FIELDS = {"message": _STRING, "type": _STRING, "code": _STRING, "param": {**_STRING, "nullable": True}}
_ERROR = {"type": "object", "required": ["message", "type", "code"], "properties": _FIELDS}
_ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": _ERROR}}  # OpenAI's error shape
_DETAIL_SCHEMA = {"type": "object", "required": ["detail"], "properties": {"detail": {}}}
_ERRORS = {
    "400": "The request cannot be answered as sent: no user message, content parts that are not text, an empty or too "
    "long question, or text that is not valid Unicode.",
    "401": "The API key is missing or wrong.",
    "404": "No strategy of that name is served.",
    "413": "The request body is over the server's limit (HAYSTACK_FUSION_MAX_BODY_BYTES).",
    "500": "An internal error; the server log has the details.",
    "502": "An LLM or document store server refused a call (e.g. a prompt over the model's context).",
    "503": "The server is busy (with Retry-After), a backend cannot be reached or refuses, or every LLM call failed.",
}


class UnservedPathsMiddleware:
    """ASGI middleware: HTTP 404 for the paths of `UNSERVED_PATHS` (without the app's root path)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = route_path(scope)
        if scope["type"] == "http" and _unserved(path):
            message = "No such route on this server" if is_openai_path(path) else "Not Found"
            await refuse(scope, receive, send, 404, message, code="not_found")
            return
        await self.app(scope, receive, send)


def _unserved(path: str) -> bool:
    return any(
        path.startswith(entry) if entry.endswith("/") else path == entry or path.startswith(f"{entry}/")
        for entry in UNSERVED_PATHS
    )


def served_openapi(schema: dict[str, Any], *, api_key: bool, models: Sequence[str] = ()) -> dict[str, Any]:
    """Hayhooks' spec (changed in place) without `UNSERVED_PATHS` and their schemas, `/status` as served, the chat
    request's `model` one of `models` (empty: any string), and each route's errors (OpenAI's shape on its routes)."""
    paths = schema.get("paths", {})
    chat_request = schema.get("components", {}).get("schemas", {}).get("ChatRequest", {})
    if models and "model" in chat_request.get("properties", {}):
        chat_request["properties"]["model"]["enum"] = sorted(models)
    for path in [path for path in paths if _unserved(path)]:
        del paths[path]
    for path, operations in paths.items():
        openai = is_openai_path(path)
        content = {"application/json": {"schema": _ERROR_SCHEMA if openai else _DETAIL_SCHEMA}}
        for method, responses in ((method, op.setdefault("responses", {})) for method, op in operations.items()):
            codes = ["401"] if api_key else []
            if method == "post":
                codes += ["400", "413", "500", "502", "503", *(["404"] if openai else [])]
                if openai:
                    responses.pop("422", None)
            responses.update({code: {"description": _ERRORS[code], "content": content} for code in codes})
    if "/status" in paths:
        up = {"type": "object", "required": ["status"], "properties": {"status": {"type": "string", "enum": ["Up!"]}}}
        ok = {"200": {"description": "The server is up.", "content": {"application/json": {"schema": up}}}}
        paths["/status"] = {"get": {"summary": "Whether the server is up", "operationId": "status", "responses": ok}}
    _drop_unused_schemas(schema)
    return schema


def _drop_unused_schemas(schema: dict[str, Any]) -> None:
    schemas = schema.get("components", {}).get("schemas") or {}
    used: set[str] = set()
    pending: list[Any] = [schema.get("paths", {})]
    while pending:
        for name in re.findall(r'"#/components/schemas/([^"]+)"', json.dumps(pending.pop())):
            if name not in used:
                used.add(name)
                pending.append(schemas.get(name, {}))
    for name in set(schemas) - used:
        del schemas[name]


def _wrappers_dir(strategies: Sequence[str] | None, pipelines_dir: str | Path | None) -> tuple[str, Any]:
    """The folder to load (given, or a temporary one of wrapper folders) and what keeps it alive; ValueError."""
    if pipelines_dir is not None:
        if strategies:
            raise ValueError("Give strategies or a pipelines folder, not both")
        return str(pipelines_dir), None
    folder = tempfile.TemporaryDirectory(prefix="haystack-fusion-wrappers-")
    for strategy in strategies or STRATEGIES:
        source = wrapper_source(strategy)
        (Path(folder.name) / strategy).mkdir()
        (Path(folder.name) / strategy / WRAPPER_FILE).write_text(source, encoding="utf-8")
    return folder.name, folder


def _pin_hayhooks_settings(pipelines_dir: str, access: AccessSettings, *, with_chainlit: bool) -> Any:
    """Hayhooks' settings for the next app it builds: fixed pipelines, pinned CORS, the chat UI and its elements."""
    from hayhooks.settings import settings

    return set_hayhooks_settings(
        host=settings.host.rpartition("@")[2],  # without an earlier app's chat UI user
        durable_mode=True,
        pipelines_dir=pipelines_dir,
        cors_allow_origins=list(access.cors_origins),
        cors_allow_origin_regex=None,
        cors_allow_methods=["GET", "POST"],
        cors_allow_headers=["Authorization", "Content-Type"],
        cors_allow_credentials=False,
        chainlit_enabled=with_chainlit,
        **({"chainlit_custom_elements_dir": str(CHAINLIT_ELEMENTS_DIR)} if with_chainlit else {}),
    )


class ChatUiMiddleware:
    """ASGI middleware: the chat UI sends `CHAT_UI_CLIENT:token` (in Hayhooks' `host`, `create_app`) as Basic
    credentials; a request with exactly those gets `CHAT_UI_HEADER` and, with a key, `Bearer <key>` instead."""

    def __init__(self, app: ASGIApp, *, token: str, api_key: str | None) -> None:
        self.app = app
        self._credentials = b"Basic " + b64encode(f"{CHAT_UI_CLIENT}:{token}".encode())
        self._headers = [(CHAT_UI_HEADER.lower().encode(), CHAT_UI_CLIENT.encode())]
        if api_key is not None:
            self._headers.append((b"authorization", f"Bearer {api_key}".encode()))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if hmac.compare_digest(given, self._credentials):
                others = [(name, value) for name, value in scope["headers"] if name != b"authorization"]
                scope = {**scope, "headers": [*others, *self._headers]}
        await self.app(scope, receive, send)


def create_app(
    strategies: Sequence[str] | None = None,
    *,
    pipelines_dir: str | Path | None = None,
    with_chainlit: bool = False,
    access: AccessSettings | None = None,
    host: str | None = None,
) -> FastAPI:
    """
    The served HTTP app: `/{name}/run` and `/v1/chat/completions` per strategy (`strategies`, None: all; or the wrapper
    folders and YAML of `pipelines_dir`), optionally Hayhooks' chat UI at `/chat`; no deploy routes, CORS pinned, the
    `serving.guards` checks for `access` (None: `AccessSettings.from_env()`) and the bound `host`, OpenAI-shaped errors
    on `/v1/...`, a log line per refused request (`serving.logs`). The process's logging is left as it is; the backend
    comes from the environment. Run it with uvicorn, one worker.

    :raises ValueError: For an unregistered strategy, both `strategies` and `pipelines_dir`, or invalid access settings.
    :raises ImportError: For `with_chainlit` without Chainlit.
    :raises hayhooks.server.exceptions.PipelineModuleLoadError: If a pipeline fails to load, saying why.
    """
    access = AccessSettings.from_env() if access is None else access
    if with_chainlit and importlib.util.find_spec("chainlit") is None:
        raise ImportError(
            "The chat UI needs Chainlit: pip install -c constraints/chainlit.txt 'haystack-fusion[chainlit]' "
            "(in the repository: make install-chat-ui)"
        )
    folder, keep_alive = _wrappers_dir(strategies, pipelines_dir)
    hayhooks_settings = _pin_hayhooks_settings(folder, access, with_chainlit=with_chainlit)
    with kept_stdlib_logging(hayhooks_settings.intercepted_loggers):  # Hayhooks points them at loguru
        app = create_hayhooks_app()
    # Hayhooks' /status lists the pipelines and the server's state: this one, matched first, says only "up"
    app.router.routes.insert(0, Route("/status", lambda _: JSONResponse({"status": "Up!"}), methods=["GET"]))
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    wrappers = {path.parent.name for path in Path(folder).glob(f"*/{WRAPPER_FILE}")}
    models = sorted(wrappers | {path.stem for pattern in ("*.yml", "*.yaml") for path in Path(folder).glob(pattern)})
    spec = app.openapi
    app.openapi = lambda: served_openapi(spec(), api_key=access.api_key is not None, models=models)  # type: ignore[method-assign]
    app.state.wrappers_dir = keep_alive
    # Added innermost first: a request meets the Host check, the Origin check, the key, the body limit, then the rest.
    app.add_middleware(StreamEndMiddleware)
    app.add_middleware(UnservedPathsMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=access.max_body_bytes)
    if access.api_key is not None:
        browser_paths = (hayhooks_settings.chainlit_path, "/public", "/docs", "/redoc") if with_chainlit else ()
        app.add_middleware(ApiKeyMiddleware, api_key=access.api_key, browser_paths=browser_paths)
    if with_chainlit:
        token = secrets.token_urlsafe(32)
        app.add_middleware(ChatUiMiddleware, token=token, api_key=access.api_key)
        # read by the chat UI at each call, after Hayhooks has logged the chat UI's address without it
        reached = "127.0.0.1" if hayhooks_settings.host in ("0.0.0.0", "::") else hayhooks_settings.host
        set_hayhooks_settings(host=f"{CHAT_UI_CLIENT}:{token}@{reached}")
    app.add_middleware(OriginMiddleware, allowed_origins=access.cors_origins)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts(host, access.allowed_hosts))
    app.add_middleware(RefusalLogMiddleware)
    request_ids_outermost(app)
    patch_hayhooks_run_log(_summarize_params)
    return app


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, StarletteHTTPException)
    code = getattr(error, "code", None) or {404: "model_not_found"}.get(error.status_code)
    cause = error.__context__ if error.status_code == 500 else None  # a wrapper's failure, for its traceback
    reason = error.logged if isinstance(error, ServingError) else str(error.detail)
    note_refusal(request.scope, code or f"http_{error.status_code}", reason, cause)
    if not is_openai_path(route_path(request.scope)):
        return await http_exception_handler(request, error)
    body = openai_error(str(error.detail), status=error.status_code, code=code, param=getattr(error, "param", None))
    return JSONResponse(body, status_code=error.status_code, headers=getattr(error, "headers", None))


async def _validation_error(request: Request, error: Exception) -> Response:
    """OpenAI's 400 on its routes (naming the first bad field), else FastAPI's 422 without `input` and `ctx`."""
    assert isinstance(error, RequestValidationError)
    first = (error.errors() or [{}])[0]
    if first.get("type") == "json_invalid":
        message = f"Invalid request body: not valid JSON ({first.get('msg', 'JSON decode error')})"
    else:
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body") or "body"
        message = f"Invalid request body: {where}: {first.get('msg', 'invalid')}"
    note_refusal(request.scope, "invalid_request", message)  # the `msg`, never the `input`: it may be the question
    if not is_openai_path(route_path(request.scope)):
        errors = [{key: item[key] for key in ("type", "loc", "msg") if key in item} for item in error.errors()]
        return JSONResponse({"detail": jsonable_encoder(errors)}, status_code=422)
    return JSONResponse(openai_error(message, status=400, code="invalid_request"), status_code=400)


def _summarize_params(record: dict[str, Any]) -> None:
    """Hayhooks' run log record with `params` by length and hash, and no `<` (loguru colour markup)."""
    extra = record["extra"]
    for key, value in list(extra.items()):
        if key == "params" and isinstance(value, dict):
            extra[key] = {name: digest(str(item)) for name, item in value.items()}
        elif not isinstance(value, (int, float, bool)) and value is not None:
            extra[key] = str(value).replace("<", "‹")[:200]


def create_mcp_app(
    strategies: Sequence[str] | None = None,
    *,
    pipelines_dir: str | Path | None = None,
    access: AccessSettings | None = None,
    host: str | None = None,
) -> ASGIApp:
    """The served MCP app (Hayhooks' `mcp` extra): a tool per strategy at `/mcp` and `/sse`, no deploy tool; the
    parameters, checks and errors of `create_app`. Returns the Starlette app."""
    access = AccessSettings.from_env() if access is None else access
    folder, keep_alive = _wrappers_dir(strategies, pipelines_dir)
    _pin_hayhooks_settings(folder, access, with_chainlit=False)
    app = hayhooks_mcp_app(folder)
    app.state.wrappers_dir = keep_alive
    patch_hayhooks_run_log(_summarize_params)
    guarded: ASGIApp = BodyLimitMiddleware(app, max_bytes=access.max_body_bytes)
    if access.api_key is not None:
        guarded = ApiKeyMiddleware(guarded, api_key=access.api_key)
    guarded = OriginMiddleware(guarded, allowed_origins=access.cors_origins)
    guarded = TrustedHostMiddleware(guarded, allowed_hosts=allowed_hosts(host, access.allowed_hosts))
    return with_request_ids(RefusalLogMiddleware(guarded))


def serve(
    strategies: Sequence[str] | None = None,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    pipelines_dir: str | Path | None = None,
    with_chainlit: bool = False,
    mcp: bool = False,
) -> None:
    """
    Run the served app with uvicorn until interrupted (`haystack-fusion serve`), its log lines in one format
    (`serving.logs.configure_serve_logging`); `port` None: 1416, or 1417 for the MCP app (`mcp`). A non-loopback `host`
    without an API key is logged as a warning.

    :raises ValueError: As `create_app`, for `with_chainlit` with `mcp`, or a `HAYHOOKS_LOG_LEVEL` that is no level.
    :raises BackendSetupError: If the environment configures no backend, listing what is missing.
    """
    if mcp and with_chainlit:
        raise ValueError("The chat UI is part of the HTTP app, not of the MCP one")
    access = AccessSettings.from_env()
    check_backend(probe=False)
    configure_serve_logging()  # once the command's checks passed: this process is the server's
    port = port or (1417 if mcp else 1416)  # Hayhooks' ports
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if access.api_key is None and not loopback:
        warning = "Serving on {host} without {variable}: anyone who reaches port {port} can run questions"
        logger.warning(warning, host=host, variable=API_KEY_VARIABLE, port=port)
    settings = set_hayhooks_settings(host=host, port=port)  # where the chat UI reaches the app
    if mcp:
        app: ASGIApp = create_mcp_app(strategies, pipelines_dir=pipelines_dir, access=access, host=host)
    else:
        app = create_app(strategies, pipelines_dir=pipelines_dir, with_chainlit=with_chainlit, access=access, host=host)
    # Hayhooks' `run_app` without its loguru handler on uvicorn's loggers: their records reach the process's one format
    uvicorn.run(
        app, host=host, port=port, log_config=None, timeout_graceful_shutdown=settings.graceful_shutdown_timeout
    )
