"""
The served apps' log (`serving.logs`): the one line format, the request id in every line a request causes (threads
included), one line per refused request, and `create_app` leaving the process's logging configuration as it found it.

The lines are caught by a loguru sink added for the test and a `logging` handler on the test's own logger, both
removed after it: the test process's configuration is never replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sys
from collections.abc import Iterator

import pytest

pytest.importorskip("hayhooks", reason="the `serve` extra")
import hayhooks.server.logger  # noqa: F401  (its import replaces loguru's handlers: before `caught` adds one)
from haystack import Document, Pipeline, component
from loguru import logger as loguru_logger
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from haystack_fusion.backends import save_store
from haystack_fusion.backends.pinned import with_request_ids
from haystack_fusion.serving.guards import refuse
from haystack_fusion.serving.logs import (
    LINE_PATTERN,
    InterceptHandler,
    RefusalLogMiddleware,
    configure_serve_logging,
    format_record,
    note_refusal,
)
from haystack_fusion.settings import AccessSettings, log_level

QUESTION = "Which zebra-q7 crossed the road?"


@contextlib.contextmanager
def caught(*names: str) -> Iterator[list[str]]:
    """The lines the `serve` process would write: loguru's, and this package's and `names`' `logging` records."""
    lines: list[str] = []
    sink = loguru_logger.add(lambda message: lines.extend(format_record(message.record).splitlines()), level="DEBUG")
    handler = InterceptHandler()
    saved = [(logging.getLogger(name), logging.getLogger(name).level) for name in ("haystack_fusion", *names)]
    for item, _ in saved:
        item.addHandler(handler)
        item.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        loguru_logger.remove(sink)
        for item, level in saved:
            item.removeHandler(handler)
            item.setLevel(level)


def fields(line: str) -> dict[str, str]:
    match = LINE_PATTERN.match(line)
    assert match, f"not in the log format: {line!r}"
    return match.groupdict()


@component
class LoggingStep:
    """A sync-only component: the async pipeline runs it in a worker thread (`asyncio.to_thread`)."""

    @component.output_types(text=str)
    def run(self, text: str) -> dict[str, str]:
        logging.getLogger("tests.logs.worker").warning("component step in a worker thread")
        return {"text": text}


async def _in_threads(request: Request) -> JSONResponse:
    pipeline = Pipeline()
    pipeline.add_component("step", LoggingStep())
    await pipeline.run_async({"step": {"text": "x"}})
    await asyncio.to_thread(logging.getLogger("tests.logs.worker").warning, "to_thread")
    return JSONResponse({"ok": True})


def _sync_endpoint(request: Request) -> PlainTextResponse:  # Starlette runs it in its thread pool
    logging.getLogger("tests.logs.worker").warning("sync endpoint in the thread pool")
    return PlainTextResponse("ok")


class _Refused:
    """An ASGI app that refuses as the guards do."""

    async def __call__(self, scope, receive, send) -> None:
        await refuse(scope, receive, send, 403, "Forbidden: not you", code="bad_origin")


async def _validation(request: Request) -> JSONResponse:
    detail = [
        {"type": "string_type", "loc": ["body", "query"], "msg": "Input should be a valid string", "input": [QUESTION]}
    ]
    return JSONResponse({"detail": detail}, status_code=422)


async def _noted(request: Request) -> JSONResponse:
    note_refusal(request.scope, "server_busy", "The server is busy: retry later")
    return JSONResponse({"detail": "The server is busy: retry later"}, status_code=503)


async def _broken(request: Request) -> None:
    raise RuntimeError("a bug")


def client() -> TestClient:
    """The app as `create_app` layers it: Starlette's error middleware, the request ids, the refusal lines, routes."""
    app = Starlette(
        middleware=[Middleware(with_request_ids), Middleware(RefusalLogMiddleware)],
        routes=[
            Route("/threads", _in_threads),
            Route("/sync", _sync_endpoint),
            Route("/refused", _Refused()),
            Route("/v1/validation", _validation, methods=["POST"]),
            Route("/noted", _noted),
            Route("/broken", _broken),
        ],
    )
    return TestClient(app, raise_server_exceptions=False)


class TestRequestIds:
    @pytest.mark.parametrize("path", ["/threads", "/sync"])
    def test_lines_from_worker_threads_carry_the_requests_id(self, path):
        with caught("tests.logs.worker") as lines:
            response = client().get(path)
        request_id = response.headers["x-request-id"]
        assert re.fullmatch(r"[0-9a-f]{8}", request_id)
        worker = [fields(line) for line in lines if "thread" in line]
        assert len(worker) == (2 if path == "/threads" else 1)
        assert {line["request_id"] for line in worker} == {request_id}
        assert {line["logger"] for line in worker} == {"tests.logs.worker"}

    def test_each_request_has_its_own_id(self):
        test_client = client()
        ids = {test_client.get("/sync").headers["x-request-id"] for _ in range(3)}
        assert len(ids) == 3


class TestRefusalLines:
    def test_one_line_with_status_code_and_reason(self):
        with caught() as lines:
            response = client().get("/refused")
        assert response.status_code == 403
        refusals = [fields(line) for line in lines if "Refused" in line]
        assert len(refusals) == 1
        assert refusals[0]["level"] == "INFO"
        assert refusals[0]["request_id"] == response.headers["x-request-id"]
        assert refusals[0]["message"] == "Refused GET /refused: HTTP 403 bad_origin: Forbidden: not you"

    def test_a_validation_errors_input_is_never_logged(self):
        with caught() as lines:
            response = client().post("/v1/validation", json={"query": [QUESTION]})
        assert QUESTION in response.text  # FastAPI's 422 echoes the input: the line must not
        assert [fields(line)["message"] for line in lines] == [
            "Refused POST /v1/validation: HTTP 422 http_422: Invalid request body: body.query: Input should be a "
            "valid string"
        ]
        assert "zebra" not in "\n".join(lines)

    def test_a_noted_refusal_is_logged_as_noted_at_warning_for_a_5xx(self):
        with caught() as lines:
            client().get("/noted")
        assert [(fields(line)["level"], fields(line)["message"]) for line in lines] == [
            ("WARNING", "Failed GET /noted: HTTP 503 server_busy: The server is busy: retry later")
        ]

    def test_an_unhandled_error_is_a_plain_500_logged_once_with_its_traceback_inside_the_request(self):
        with caught() as lines:
            response = client().get("/broken")
        assert (response.status_code, response.text) == (500, "Internal Server Error")
        parsed = [fields(line) for line in lines]
        assert parsed[0]["message"] == "Failed GET /broken: HTTP 500 internal_error: unhandled RuntimeError"
        assert parsed[0]["level"] == "ERROR"
        assert parsed[-1]["message"] == "RuntimeError: a bug"
        assert {line["request_id"] for line in parsed} == {response.headers["x-request-id"]}
        assert sum(line["message"].startswith("Failed") for line in parsed) == 1


class TestFormat:
    def test_every_line_of_a_multi_line_record_and_its_traceback_is_one_format_line(self):
        with caught("tests.logs.format") as lines:
            try:
                raise ValueError("boom")
            except ValueError:
                logging.getLogger("tests.logs.format").exception("first\nsecond\r\x1b[31mred")
        parsed = [fields(line) for line in lines]
        assert [line["message"] for line in parsed[:3]] == [
            "first",
            "second\\r\\x1b[31mred",
            "Traceback (most recent call last):",
        ]
        assert parsed[-1]["message"] == "ValueError: boom"
        assert {(line["level"], line["logger"], line["request_id"]) for line in parsed} == {
            ("ERROR", "tests.logs.format", "-")
        }

    def test_a_warnings_exception_is_one_line(self):
        with caught("tests.logs.format") as lines:
            try:
                raise ConnectionError("refused")
            except ConnectionError as error:
                logging.getLogger("tests.logs.format").warning("retrying", exc_info=error)
        assert [fields(line)["message"] for line in lines] == ["retrying", "ConnectionError: refused"]

    def test_extra_values_follow_the_message(self):
        with caught() as lines:
            loguru_logger.bind(pipeline_name="cascade").info("Deployed")
        assert fields(lines[0])["message"] == "Deployed | pipeline_name='cascade'"


def test_an_unknown_level_names_the_variable(monkeypatch):
    monkeypatch.setenv("HAYHOOKS_LOG_LEVEL", "chatty")
    assert log_level() == "CHATTY"
    with pytest.raises(ValueError, match=r"HAYHOOKS_LOG_LEVEL: 'CHATTY' is not a log level"):
        configure_serve_logging()


def _logging_configuration() -> dict[str, object]:
    """What a host application set up: loguru's handlers, levels and patcher; each `logging` logger's handlers, level,
    `propagate` and `disabled`."""
    core = loguru_logger._core  # type: ignore[attr-defined]
    loggers = {"": logging.getLogger()} | {
        name: item for name, item in logging.Logger.manager.loggerDict.items() if isinstance(item, logging.Logger)
    }
    return {
        "loguru handlers": {key: (handler.levelno, str(handler)) for key, handler in core.handlers.items()},
        "loguru patcher": core.patcher,
        "loguru extra": dict(core.extra),
        "loguru levels": sorted(core.levels),
        "logging": {
            name: (list(item.handlers), item.level, item.propagate, item.disabled) for name, item in loggers.items()
        },
    }


def test_create_app_leaves_the_processs_logging_as_it_found_it(monkeypatch, tmp_path):
    from hayhooks.settings import settings

    from haystack_fusion.serving.app import UNAUTHORIZED, create_app

    for name in ("durable_mode", "pipelines_dir", "cors_allow_origins", "cors_allow_origin_regex", "host"):
        monkeypatch.setattr(settings, name, getattr(settings, name))
    for name in ("cors_allow_methods", "cors_allow_headers", "cors_allow_credentials", "chainlit_enabled"):
        monkeypatch.setattr(settings, name, getattr(settings, name))
    save_store([Document(content="Paris is the capital of France.")], tmp_path / "index.json")
    backend = {"HAYSTACK_FUSION_LLM": "openai", "OPENAI_API_KEY": "x", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    backend |= {"HAYSTACK_FUSION_DOCUMENT_STORE": "memory", "HAYSTACK_FUSION_STORE": str(tmp_path / "index.json")}
    for name, value in backend.items():
        monkeypatch.setenv(name, value)
    host_sink = loguru_logger.add(sys.stderr, level="INFO")  # the host application's own handlers
    host_handler = logging.StreamHandler()
    logging.getLogger("uvicorn.access").addHandler(host_handler)
    try:
        create_app(["concatenation"], access=AccessSettings())  # once: the uvicorn loggers exist
        before = _logging_configuration()
        app = create_app(["concatenation"], access=AccessSettings(api_key="k"))
        assert _logging_configuration() == before
    finally:
        loguru_logger.remove(host_sink)
        logging.getLogger("uvicorn.access").removeHandler(host_handler)
    with caught() as lines:  # an id per request, one line per refusal
        response = TestClient(app, base_url="http://127.0.0.1").get("/v1/models")
    assert response.status_code == 401
    assert [(fields(line)["request_id"], fields(line)["message"]) for line in lines] == [
        (response.headers["x-request-id"], f"Refused GET /v1/models: HTTP 401 invalid_api_key: {UNAUTHORIZED}")
    ]


def test_hayhooks_run_lines_log_the_question_by_length_and_hash_only(monkeypatch):
    from hayhooks.server.utils import deploy_utils

    from haystack_fusion.backends.pinned import patch_hayhooks_run_log
    from haystack_fusion.serving.app import _summarize_params

    monkeypatch.setattr(deploy_utils, "log", deploy_utils.log)
    patch_hayhooks_run_log(_summarize_params)
    with caught() as lines:
        deploy_utils.log.bind(params={"query": QUESTION}).opt(colors=True).info(
            "Running pipeline '<bold>{}</bold>'", "x"
        )
        loguru_logger.bind(params={"query": QUESTION}).info("a host application's own line, untouched")
    assert re.fullmatch(
        rf"Running pipeline 'x' \| params={{'query': '{len(QUESTION)} characters, sha256 [0-9a-f]{{12}}'}}",
        fields(lines[0])["message"],
    )
    assert QUESTION in lines[1]
