"""
The served apps' log (`serve` extra): one line per refused or failed request (`RefusalLogMiddleware`), and the one
line format of the `haystack-fusion serve` process (`configure_serve_logging`).

Hayhooks logs with loguru, Haystack, this package and uvicorn with the standard library's `logging`. The `serve`
process routes `logging` into loguru and writes every record through one sink, so each line reads

```text
2026-05-04T13:45:01.234+00:00 | INFO     | haystack_fusion.serving.logs | 3f2a9c1b | Refused POST /v1/models: ...
```

time (ISO 8601, milliseconds), level, logger name, the request's id (`-` outside a request) and the message (a
multi-line message or traceback: one such line per line). The request id is Hayhooks' (`X-Request-ID` in the
response), bound to loguru's context, which `asyncio.to_thread` and Starlette's thread pool copy into the threads
they run. Only that process is configured: `create_app` and `create_mcp_app` leave the logging of an application
that mounts them as it is.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import traceback
from collections.abc import Iterable, Iterator, MutableMapping
from http import HTTPStatus
from typing import Any

from haystack import logging as haystack_logging
from loguru import logger as loguru_logger
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from haystack_fusion.settings import LOG_LEVEL_VARIABLE, log_level

logger = haystack_logging.getLogger(__name__)

LINE_PATTERN = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d \| "
    r"(?P<level>TRACE|DEBUG|INFO|SUCCESS|WARNING|ERROR|CRITICAL) *\| "
    r"(?P<logger>\S+) \| (?P<request_id>-|[0-9a-f]{8}) \| (?P<message>.*)$"
)
"""Every line `haystack-fusion serve` writes (`configure_serve_logging`): time, level, logger, request id, message."""

_REFUSAL = "haystack_fusion.refusal"  # the key of `scope["state"]` where a refusal leaves its code and reason
_BODY_PEEK = 2048  # bytes of an error response's body read for its reason when the refusal left none
_TRACEBACK_LEVEL = logging.ERROR  # the lowest level whose exception is logged with its traceback
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def note_refusal(scope: Scope, code: str, reason: str, error: BaseException | None = None) -> None:
    """
    Leave a refusal's code, reason (one line, never the user's text) and, for a 500, the error behind it in the
    request's `scope`, for `RefusalLogMiddleware`'s line.
    """
    state: MutableMapping[str, Any] = scope.setdefault("state", {})
    state[_REFUSAL] = (code, " ".join(str(reason).split()), error)


class RefusalLogMiddleware:
    """
    ASGI middleware: one log line for each HTTP request answered with a status of 400 or more, naming the method, path,
    status, code and reason (`note_refusal`'s, else read from the error body: OpenAI's `error` or FastAPI's `detail`,
    never a validation error's `input`); INFO for a 4xx, WARNING for a 5xx, ERROR with the traceback for a 500. And one
    line for each WebSocket a guard closed before it opened (`guards.refuse`).

    An exception no handler answered gets Starlette's plain 500 here, logged with its traceback inside the request
    (uvicorn would log it outside, without the request id); one raised after the response started is re-raised. A
    streamed reply that fails after it started has answered 200: its wrapper logs that failure itself.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        if scope["type"] == "websocket":  # a refused one is closed before it opens
            await self.app(scope, receive, send)
            if _REFUSAL in state:
                code, reason, _ = state[_REFUSAL]
                logger.info(
                    "Refused a WebSocket to {path}: {code}: {reason}", path=_path(scope), code=code, reason=reason
                )
            return
        status, body = 0, bytearray()

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and status >= 400 and len(body) < _BODY_PEEK:
                body.extend(message.get("body", b"")[: _BODY_PEEK - len(body)])
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as error:
            if status:
                raise
            note_refusal(scope, "internal_error", f"unhandled {type(error).__name__}", error)
            await PlainTextResponse("Internal Server Error", status_code=500)(scope, receive, watch)
        finally:
            if status >= 400:
                _log_refusal(scope, status, bytes(body))


def _log_refusal(scope: Scope, status: int, body: bytes) -> None:
    code, reason, error = scope["state"].get(_REFUSAL) or (*_read_error_body(body), None)
    reason = reason or _phrase(status)
    line = "{verb} {method} {path}: HTTP {status} {code}: {reason}"
    values = {
        "verb": "Failed" if status >= 500 else "Refused",
        "method": scope.get("method", "-"),
        "path": _path(scope),
        "status": status,
        "code": code or f"http_{status}",
        "reason": reason[:500],
    }
    if status == 500:
        logger.error(line, exc_info=error, **values)
    elif status > 500:
        logger.warning(line, **values)
    else:
        logger.info(line, **values)


def _path(scope: Scope) -> str:
    return str(scope.get("path", "/"))[:200]


def _read_error_body(body: bytes) -> tuple[str | None, str]:
    """An error body's code and one-line reason: OpenAI's `error`, FastAPI's `detail` (a validation error's `loc` and
    `msg` only: its `input` may hold the user's text), else the text itself."""
    try:
        data = json.loads(body)
    except ValueError:
        return None, " ".join(body.decode("utf-8", "replace").split())
    if not isinstance(data, dict):
        return None, ""
    if isinstance(error := data.get("error"), dict):
        code = error.get("code")
        return (str(code) if code else None), " ".join(str(error.get("message", "")).split())
    detail = data.get("detail")
    if isinstance(detail, list):
        problems = [
            f"{'.'.join(str(part) for part in item.get('loc', ()))}: {item.get('msg', 'invalid')}"
            for item in detail
            if isinstance(item, dict)
        ]
        return None, "Invalid request body: " + "; ".join(problems)
    return None, " ".join(str(detail).split()) if isinstance(detail, str) else ""


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "error"


@contextlib.contextmanager
def kept_stdlib_logging(names: Iterable[str] = ()) -> Iterator[None]:
    """
    Restore, after the block, the handlers, level, `propagate` and `disabled` of the root logger, of every logger that
    exists when it starts and of the loggers `names` (Hayhooks' `create_app` points uvicorn's and FastAPI's loggers at
    loguru).
    """
    named = [logging.getLogger(name) for name in names]
    existing = [item for item in logging.Logger.manager.loggerDict.values() if isinstance(item, logging.Logger)]
    saved = [
        (item, list(item.handlers), item.level, item.propagate, item.disabled)
        for item in dict.fromkeys([logging.getLogger(), *named, *existing])
    ]
    try:
        yield
    finally:
        for item, handlers, level, propagate, disabled in saved:
            item.handlers = handlers
            item.setLevel(level)
            item.propagate, item.disabled = propagate, disabled


class InterceptHandler(logging.Handler):
    """A `logging` handler that hands each record to loguru under its logger's name (loguru's documented pattern)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level: str | int = loguru_logger.level(record.levelname).name
        except ValueError:
            level = record.levelno

        def named(entry: Any) -> None:
            entry["name"] = record.name

        try:
            message = record.getMessage()
        except Exception:  # a call whose arguments do not fit its message: `logging`'s own report
            self.handleError(record)
            return
        loguru_logger.patch(named).opt(exception=record.exc_info or None).log(level, message)


def format_record(record: Any) -> str:
    """
    A loguru record as the `serve` process writes it: one `LINE_PATTERN` line per line of its message and traceback,
    each with the record's time, level, logger and request id; its other `extra` values after the first line. Control
    characters are escaped. An ERROR or CRITICAL record's exception is shown with Python's traceback (no variable
    values), a lower one's as its last line only (libraries log retried connection failures as warnings).
    """
    extra = dict(record["extra"])
    request_id = str(extra.pop("request_id", None) or "-")
    head = (
        f"{record['time'].isoformat(timespec='milliseconds')} | {record['level'].name:<8} | "
        f"{record['name'] or '-'} | {request_id} | "
    )
    lines = str(record["message"]).rstrip().split("\n") or [""]
    if extra:
        lines[0] += " | " + ", ".join(f"{key}={value!r}" for key, value in extra.items())
    exception = record["exception"]
    if exception is not None and exception.type is not None and record["level"].no >= _TRACEBACK_LEVEL:
        text = "".join(traceback.format_exception(exception.type, exception.value, exception.traceback))
        lines += text.rstrip().split("\n")
    elif exception is not None and exception.type is not None:  # a warning: its exception in one line
        lines += traceback.format_exception_only(exception.type, exception.value)[-1].rstrip().split("\n")
    return "".join(head + _CONTROL.sub(lambda match: repr(match.group())[1:-1], line) + "\n" for line in lines)


def _write(message: Any) -> None:
    sys.stderr.write(format_record(message.record))
    sys.stderr.flush()


def configure_serve_logging(level: str | None = None) -> None:
    """
    Make every log line of this process one `format_record` line on stderr: loguru's handlers replaced by one sink,
    the standard library's records (Haystack, this package, uvicorn, `warnings`) routed into loguru. For the
    `haystack-fusion serve` process only: it changes process-wide configuration.

    :param level: The lowest level written (None: `HAYHOOKS_LOG_LEVEL`, else INFO). At INFO and above no line holds
        the user's text; DEBUG and TRACE let libraries log request bodies (the OpenAI client, Hayhooks' MCP tools).
    :raises ValueError: If the level is not one of loguru's, naming the variable.
    """
    name = (level or log_level()).upper()
    try:
        number = loguru_logger.level(name).no
    except ValueError:
        raise ValueError(
            f"{LOG_LEVEL_VARIABLE}: {name!r} is not a log level (TRACE, DEBUG, INFO, SUCCESS, WARNING, ERROR, CRITICAL)"
        ) from None
    loguru_logger.remove()
    loguru_logger.add(_write, level=number, format="{message}", colorize=False, backtrace=False, diagnose=False)
    root = logging.getLogger()
    root.handlers = [InterceptHandler()]
    root.setLevel(number)
    for item in [*logging.Logger.manager.loggerDict.values()]:
        if isinstance(item, logging.Logger):  # every record goes to the root's one handler
            item.handlers, item.propagate = [], True
    logging.captureWarnings(True)
