"""
The served apps' log: a line per refused or failed request (`RefusalLogMiddleware`), and the one line format of the
`haystack-fusion serve` process (`configure_serve_logging`), the request id being Hayhooks' `X-Request-ID`:

```text
2026-05-04T13:45:01.234+00:00 | INFO     | haystack_fusion.serving.logs | 3f2a9c1b | Refused POST /v1/models: ...
```
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import traceback
from collections.abc import Iterable, Iterator
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

_REFUSAL = "haystack_fusion.refusal"  # the key of `scope["state"]` of a refusal's code and reason
_BODY_PEEK = 2048  # bytes of an error body read for its reason
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def note_refusal(scope: Scope, code: str, reason: str, error: BaseException | None = None) -> None:
    """Leave a refusal's code, reason (never the user's text) and, for a 500, its error in `scope`, for the log line."""
    scope.setdefault("state", {})[_REFUSAL] = (code, " ".join(str(reason).split()), error)


class RefusalLogMiddleware:
    """ASGI middleware: a log line per HTTP answer of status 400 or more (`note_refusal`'s reason, else the error
    body's): INFO for a 4xx, WARNING for a 5xx, ERROR with the traceback for a 500; one per WebSocket a guard closed. An
    unhandled exception gets a plain 500 here, logged with the request id; one raised after the response started is
    re-raised."""

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
    log = logger.error if status == 500 else logger.warning if status > 500 else logger.info
    log(
        "{verb} {method} {path}: HTTP {status} {code}: {reason}",
        exc_info=error,  # set for a 500 only
        verb="Failed" if status >= 500 else "Refused",
        method=scope.get("method", "-"),
        path=_path(scope),
        status=status,
        code=code or f"http_{status}",
        reason=(reason or next((item.phrase for item in HTTPStatus if item == status), "error"))[:500],
    )


def _path(scope: Scope) -> str:
    return str(scope.get("path", "/"))[:200]


def _read_error_body(body: bytes) -> tuple[str | None, str]:
    """An error body's code and reason: OpenAI's `error`, FastAPI's `detail` (`loc` and `msg` only), else the text."""
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
        items = [item for item in detail if isinstance(item, dict)]
        problems = [f"{'.'.join(map(str, item.get('loc', ())))}: {item.get('msg', 'invalid')}" for item in items]
        return None, "Invalid request body: " + "; ".join(problems)
    return None, " ".join(str(detail).split()) if isinstance(detail, str) else ""


@contextlib.contextmanager
def kept_stdlib_logging(names: Iterable[str] = ()) -> Iterator[None]:
    """Restore, after the block, the handlers, level, `propagate` and `disabled` of the root logger, of every existing
    logger and of the loggers `names` (Hayhooks' `create_app` points uvicorn's and FastAPI's at loguru)."""
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
    """Hands each `logging` record to loguru under its logger's name (loguru's documented pattern)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level: str | int = loguru_logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        try:
            message = record.getMessage()
        except Exception:  # a call whose arguments do not fit its message: `logging`'s own report
            self.handleError(record)
            return
        loguru_logger.patch(lambda entry: entry.update({"name": record.name})).opt(
            exception=record.exc_info or None
        ).log(level, message)


def format_record(record: Any) -> str:
    """A loguru record as `LINE_PATTERN` lines, one per line of its message and traceback, `extra` values after the
    first, control characters escaped; below ERROR an exception's last line only (retried calls log warnings)."""
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
    if exception is not None and exception.type is not None and record["level"].no >= logging.ERROR:
        text = "".join(traceback.format_exception(exception.type, exception.value, exception.traceback))
        lines += text.rstrip().split("\n")
    elif exception is not None and exception.type is not None:  # a warning: its exception in one line
        lines += traceback.format_exception_only(exception.type, exception.value)[-1].rstrip().split("\n")
    return "".join(head + _CONTROL.sub(lambda match: repr(match.group())[1:-1], line) + "\n" for line in lines)


def _write(message: Any) -> None:
    sys.stderr.write(format_record(message.record))
    sys.stderr.flush()


def configure_serve_logging(level: str | None = None) -> None:
    """Every log line of this process (loguru's, `logging`'s, `warnings`) as `format_record` on stderr, from `level`
    (None: `HAYHOOKS_LOG_LEVEL`, else INFO; below INFO libraries may log the user's text; ValueError for no level).
    Process-wide: for `haystack-fusion serve` only."""
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
