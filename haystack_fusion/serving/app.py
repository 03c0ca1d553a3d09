"""
The served app: Hayhooks' app with a fixed set of strategies, CORS pinned and an optional API key (`serve` extra).

`haystack-fusion serve` runs it (`serve`); `create_app` and `create_mcp_app` build it for a process of your own
(`uvicorn --factory haystack_fusion.serving.app:create_app`). Either way:

- **Nothing deploys at run time.** The app is built in Hayhooks' durable mode, which loads the pipeline set once at
  startup: there are no `/deploy_files`, `/deploy-yaml` or `/undeploy/{name}` routes and no `deploy_pipeline` or
  `undeploy_pipeline` MCP tools, with or without Redis (the shipped wrappers are not durable ones, so none is used).
  A strategy wrapper that cannot set up (no backend configured) stops the server with its message.
- **CORS pinned.** Only the origins of `HAYSTACK_FUSION_CORS_ORIGINS` (none by default) may call the app from a web
  page, with GET and POST and the `Authorization` and `Content-Type` headers; the embedded chat UI is the app's own
  origin and needs none.
- **A key when asked.** With `HAYSTACK_FUSION_API_KEY` set, every HTTP route and WebSocket but `GET /status` (and CORS
  preflights, which browsers send without credentials) needs `Authorization: Bearer <key>`: the run routes, the
  OpenAI-compatible `/v1/...` routes, the MCP endpoints, the chat UI, the OpenAPI pages and Hayhooks' traces. The chat
  UI also takes the key as the password of HTTP Basic authentication (any user name), so a browser asks for it.
  Anything else gets HTTP 401 with one line (`ApiKeyMiddleware`).
- **A chat UI that shows the answer and its sources.** With `with_chainlit`, Hayhooks' Chainlit app gets this
  package's custom elements (`CHAINLIT_ELEMENTS_DIR` as `HAYHOOKS_CHAINLIT_CUSTOM_ELEMENTS_DIR`) and its requests
  carry `CHAT_UI_HEADER`: the wrappers answer it with the answer as the message and the sources, stages and usage in
  a custom element, where Open WebUI gets source events and a `<details>` block (`serving.hayhooks.chat_events`).
- **A status that says only that the server is up**: `GET /status` answers `{"status": "Up!"}` (the strategies are
  listed by `GET /v1/models`, behind the key).

Hayhooks' own `hayhooks run` (developer mode) serves the deploy routes and tools beside the strategies and allows
every origin: see docs/serving.md before using it anywhere but on your own machine.
"""

from __future__ import annotations

import hmac
import importlib.util
import ipaddress
import sys
import tempfile
from base64 import b64decode
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

try:
    import httpx
    from fastapi import FastAPI
    from hayhooks.server.app import create_app as create_hayhooks_app
    from hayhooks.server.app import run_app
    from hayhooks.server.pipelines.loader import build_immutable_host
    from hayhooks.settings import settings as hayhooks_settings
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.types import ASGIApp, Receive, Scope, Send
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("Serving with Hayhooks needs the `serve` extra: pip install 'haystack-fusion[serve]'") from error

from haystack import logging

from haystack_fusion.backends.checks import check_backend
from haystack_fusion.serving.hayhooks import CHAINLIT_ELEMENTS_DIR, CHAT_UI_CLIENT, CHAT_UI_HEADER
from haystack_fusion.serving.yaml import wrapper_source
from haystack_fusion.settings import API_KEY_VARIABLE, AccessSettings
from haystack_fusion.strategies import STRATEGIES, get_strategy

logger = logging.getLogger(__name__)

DEFAULT_PORT = 1416
"""The HTTP app's port by default (Hayhooks')."""

DEFAULT_MCP_PORT = 1417
"""The MCP app's port by default (Hayhooks')."""

UNAUTHORIZED = b'{"detail":"Unauthorized: send the API key as Authorization: Bearer <key>"}'
"""The body of every 401: one line that says what to send and nothing about the server."""


class ApiKeyMiddleware:
    """
    ASGI middleware: a request needs the API key unless its path is open.

    A request is let through when it carries `Authorization: Bearer <key>`, or `Authorization: Basic` with the key as
    the password (any user name, for browsers), or is a CORS preflight (`OPTIONS` with `Origin` and
    `Access-Control-Request-Method`; the CORS middleware behind this one answers it), or its path (without the app's
    root path) is one of `open_paths`. Anything else gets HTTP 401 with the one-line `UNAUTHORIZED` body and a
    `WWW-Authenticate` challenge: `Basic` under `browser_paths` (so a browser asks for the key), `Bearer` elsewhere;
    a WebSocket is closed before it opens (code 1008, which the server sends as HTTP 403). Keys are compared in
    constant time.

    :param app: The ASGI app to protect.
    :param api_key: The key.
    :param open_paths: Paths served without the key (exact match).
    :param browser_paths: Path prefixes a browser opens (the chat UI): their 401 asks for Basic credentials.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_key: str,
        open_paths: Iterable[str] = ("/status",),
        browser_paths: Iterable[str] = (),
    ) -> None:
        self.app = app
        self._api_key = api_key.encode()
        self.open_paths = frozenset(open_paths)
        self.browser_paths = tuple(browser_paths)

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        value = headers.get(b"authorization", b"")
        scheme, _, credentials = value.partition(b" ")
        if scheme.lower() == b"bearer":
            return hmac.compare_digest(credentials.strip(), self._api_key)
        if scheme.lower() == b"basic":
            try:
                _, _, password = b64decode(credentials.strip(), validate=True).partition(b":")
            except ValueError:
                return False
            return hmac.compare_digest(password, self._api_key)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        path = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        preflight = (
            scope["type"] == "http"
            and scope["method"] == "OPTIONS"
            and b"origin" in headers
            and b"access-control-request-method" in headers
        )
        if path in self.open_paths or preflight or self._authorized(headers):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        browser = any(path == prefix or path.startswith(f"{prefix}/") for prefix in self.browser_paths)
        challenge = b'Basic realm="haystack-fusion", charset="UTF-8"' if browser else b"Bearer"
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(UNAUTHORIZED)).encode()),
                    (b"www-authenticate", challenge),
                ],
            }
        )
        await send({"type": "http.response.body", "body": UNAUTHORIZED})


async def _status(_: Request) -> JSONResponse:
    return JSONResponse({"status": "Up!"})


def write_wrappers(strategies: Sequence[str], out_dir: str | Path) -> Path:
    """
    Write a Hayhooks wrapper folder per strategy into `out_dir` (as `haystack-fusion pipelines` does, without YAML).

    :param strategies: Registered strategy names.
    :returns: `out_dir`.
    :raises ValueError: If a name is not a registered strategy.
    """
    out = Path(out_dir)
    for strategy in strategies:
        get_strategy(strategy)
        (out / strategy).mkdir(parents=True, exist_ok=True)
        (out / strategy / "pipeline_wrapper.py").write_text(wrapper_source(strategy), encoding="utf-8")
    return out


def _wrappers_dir(strategies: Sequence[str] | None, pipelines_dir: str | Path | None) -> tuple[str, Any]:
    """The folder to load (given, or a temporary one with the strategies' wrappers) and what keeps it alive."""
    if pipelines_dir is not None:
        if strategies:
            raise ValueError("Give strategies or a pipelines folder, not both")
        return str(pipelines_dir), None
    folder = tempfile.TemporaryDirectory(prefix="haystack-fusion-wrappers-")
    write_wrappers(list(strategies or STRATEGIES), folder.name)
    return folder.name, folder


def _pin_hayhooks_settings(pipelines_dir: str, access: AccessSettings, *, with_chainlit: bool) -> None:
    """
    Hayhooks reads its settings when it builds an app: fixed pipelines, the pinned CORS policy, the chat UI and its
    custom elements (this package's, in place of any `HAYHOOKS_CHAINLIT_CUSTOM_ELEMENTS_DIR` of the environment).
    """
    hayhooks_settings.durable_mode = True
    hayhooks_settings.pipelines_dir = pipelines_dir
    hayhooks_settings.cors_allow_origins = list(access.cors_origins)
    hayhooks_settings.cors_allow_origin_regex = None
    hayhooks_settings.cors_allow_methods = ["GET", "POST"]
    hayhooks_settings.cors_allow_headers = ["Authorization", "Content-Type"]
    hayhooks_settings.cors_allow_credentials = False
    hayhooks_settings.chainlit_enabled = with_chainlit
    if with_chainlit:
        hayhooks_settings.chainlit_custom_elements_dir = str(CHAINLIT_ELEMENTS_DIR)


class _ChatUiHttpx:
    """
    `httpx` for the chat UI's calls to its own server: every `AsyncClient` it makes sends `headers`.

    :param headers: Sent on every request: `CHAT_UI_HEADER`, and the API key as `Authorization` when one is set.
    """

    def __init__(self, headers: dict[str, str]) -> None:
        self._headers = headers

    def __getattr__(self, name: str) -> Any:
        return getattr(httpx, name)

    def AsyncClient(self, *args: Any, **kwargs: Any) -> httpx.AsyncClient:  # noqa: N802 - httpx's name
        kwargs["headers"] = {**(kwargs.get("headers") or {}), **self._headers}
        return httpx.AsyncClient(*args, **kwargs)


def _equip_chat_ui(api_key: str | None) -> None:
    """
    Hayhooks' Chainlit app calls this server's `/status`, `/v1/models` and `/v1/chat/completions` with clients it
    makes from its modules' `httpx`; those modules get `_ChatUiHttpx` instead, so the UI's calls say they are the
    chat UI's (`CHAT_UI_HEADER`) and carry the key when one is set.

    :param api_key: The server's API key, None when it has none.
    :raises RuntimeError: If the chat UI's modules are not loaded (a Hayhooks version that builds it otherwise) and an
        API key is set. Without a key the UI still works, logged as a warning, showing Open WebUI's reply form.
    """
    from hayhooks.server.utils.chainlit_utils import DEFAULT_CHAINLIT_APP

    modules = [sys.modules.get(str(DEFAULT_CHAINLIT_APP)), sys.modules.get("hayhooks.server.chainlit_app.utils")]
    if any(module is None or not hasattr(module, "httpx") for module in modules):
        if api_key is not None:
            raise RuntimeError(
                f"The chat UI cannot be served with {API_KEY_VARIABLE} set: Hayhooks' Chainlit app was not found "
                "where this package expects it"
            )
        logger.warning("Hayhooks' Chainlit app was not found where expected: the chat UI gets Open WebUI's replies")
        return
    headers = {CHAT_UI_HEADER: CHAT_UI_CLIENT}
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    for module in modules:
        module.httpx = _ChatUiHttpx(headers)  # type: ignore[union-attr]


def create_app(
    strategies: Sequence[str] | None = None,
    *,
    pipelines_dir: str | Path | None = None,
    with_chainlit: bool = False,
    access: AccessSettings | None = None,
) -> FastAPI:
    """
    Build the served HTTP app: `/{name}/run` and the OpenAI-compatible `/v1/chat/completions` for each strategy,
    optionally Hayhooks' chat UI at `/chat`, with no deploy routes, CORS pinned and the API key when one is set.

    The backend comes from the environment (`HAYSTACK_FUSION_LLM`, `HAYSTACK_FUSION_DOCUMENT_STORE`, ...;
    docs/serving.md). The chat UI reaches the app at Hayhooks' `HAYHOOKS_HOST` and `HAYHOOKS_PORT` (`serve` sets
    them); Hayhooks' other settings (root path, tracing) apply as usual.

    :param strategies: Registered strategy names to serve (None: all of them); their wrappers are written to a
        temporary folder that lives as long as the app.
    :param pipelines_dir: Instead of `strategies`, a folder of your own wrapper folders (each with a
        `pipeline_wrapper.py`) and YAML pipelines, loaded once.
    :param with_chainlit: Mount Hayhooks' Chainlit chat UI at `/chat` (the `chainlit` extra), with this package's
        custom elements.
    :param access: The API key and CORS origins (None: `AccessSettings.from_env()`).
    :returns: The FastAPI app; run it with uvicorn (one worker: the embedded model is loaded per process).
    :raises ValueError: If a strategy is not registered, both `strategies` and `pipelines_dir` are given, or the
        environment's access settings are invalid (naming the variable).
    :raises ImportError: For `with_chainlit` without Chainlit installed.
    :raises hayhooks.server.exceptions.PipelineModuleLoadError: If a pipeline fails to load or set up (its message says
        why, e.g. the backend variable that is missing, or a folder without `pipeline_wrapper.py`).

    ### Usage example
    ```python
    import uvicorn

    from haystack_fusion.serving.app import create_app

    # HAYSTACK_FUSION_LLM=local HAYSTACK_FUSION_DOCUMENT_STORE=memory HAYSTACK_FUSION_STORE=index.json
    app = create_app(["cascade", "sure"])
    uvicorn.run(app, host="127.0.0.1", port=1416)
    ```
    """
    access = AccessSettings.from_env() if access is None else access
    if with_chainlit and importlib.util.find_spec("chainlit") is None:
        raise ImportError(
            "The chat UI needs Chainlit: pip install -c constraints/chainlit.txt 'haystack-fusion[chainlit]' "
            "(in the repository: make install-chat-ui)"
        )
    folder, keep_alive = _wrappers_dir(strategies, pipelines_dir)
    _pin_hayhooks_settings(folder, access, with_chainlit=with_chainlit)
    app = create_hayhooks_app()
    app.state.wrappers_dir = keep_alive
    # Hayhooks' /status lists the pipelines and the server's state: this one, matched first, says only "up"
    app.router.routes.insert(0, Route("/status", _status, methods=["GET"]))
    if with_chainlit:
        _equip_chat_ui(access.api_key)
    if access.api_key is not None:
        app.add_middleware(
            ApiKeyMiddleware,
            api_key=access.api_key,
            browser_paths=(hayhooks_settings.chainlit_path, "/public", "/docs", "/redoc") if with_chainlit else (),
        )
    return app


def create_mcp_app(
    strategies: Sequence[str] | None = None,
    *,
    pipelines_dir: str | Path | None = None,
    access: AccessSettings | None = None,
) -> ASGIApp:
    """
    Build the served MCP app (Hayhooks' MCP server, `mcp` extra of Hayhooks): one tool per strategy, named after it
    and described by `Strategy.description`, over Streamable HTTP at `/mcp` and SSE at `/sse`, plus Hayhooks' two
    read-only status tools; no deploy or undeploy tool. With an API key set, every route but `GET /status` needs it.

    :param strategies: As `create_app`.
    :param pipelines_dir: As `create_app`.
    :param access: As `create_app` (CORS does not apply: MCP clients are not web pages).
    :returns: The Starlette app; run it with uvicorn.
    :raises ValueError: As `create_app`.
    :raises hayhooks.server.exceptions.PipelineModuleLoadError: As `create_app`.
    """
    from hayhooks.server.utils.mcp_utils import create_mcp_server, create_starlette_app

    access = AccessSettings.from_env() if access is None else access
    folder, keep_alive = _wrappers_dir(strategies, pipelines_dir)
    _pin_hayhooks_settings(folder, access, with_chainlit=False)
    app = build_immutable_host(folder, lambda registry: create_starlette_app(create_mcp_server(registry=registry)))
    app.state.wrappers_dir = keep_alive
    if access.api_key is None:
        return app
    return ApiKeyMiddleware(app, api_key=access.api_key)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    Run the served app with uvicorn until interrupted (`haystack-fusion serve`).

    :param strategies: As `create_app`.
    :param host: The address to bind; a non-loopback address without `HAYSTACK_FUSION_API_KEY` is logged as a
        warning (anyone who reaches the port can spend the LLM budget).
    :param port: The port (None: `DEFAULT_PORT`, or `DEFAULT_MCP_PORT` with `mcp`).
    :param pipelines_dir: As `create_app`.
    :param with_chainlit: As `create_app` (not with `mcp`).
    :param mcp: Serve the MCP app instead of the HTTP one.
    :raises ValueError: As `create_app`, or for `with_chainlit` with `mcp`.
    :raises BackendSetupError: If the environment configures no backend (before anything loads), listing what is
        missing.
    """
    if mcp and with_chainlit:
        raise ValueError("The chat UI is part of the HTTP app, not of the MCP one")
    access = AccessSettings.from_env()
    check_backend(probe=False)
    port = port or (DEFAULT_MCP_PORT if mcp else DEFAULT_PORT)
    if access.api_key is None and not _is_loopback(host):
        logger.warning(
            "Serving on {host} without {variable}: anyone who reaches port {port} can run questions",
            host=host,
            variable=API_KEY_VARIABLE,
            port=port,
        )
    hayhooks_settings.host, hayhooks_settings.port = host, port  # where the chat UI reaches the app
    if mcp:
        run_app(create_mcp_app(strategies, pipelines_dir=pipelines_dir, access=access), host=host, port=port)  # type: ignore[arg-type]
    else:
        app = create_app(strategies, pipelines_dir=pipelines_dir, with_chainlit=with_chainlit, access=access)
        run_app(app, host=host, port=port)
