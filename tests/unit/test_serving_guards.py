"""What a served app lets in (`serving.guards`): Host, Origin, body size, the client's disconnect, OpenAI's stream end
and error shape. Driven through Starlette's TestClient and raw ASGI calls."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("hayhooks", reason="the `serve` extra")
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect

from haystack_fusion.serving.guards import (
    BodyLimitMiddleware,
    OriginMiddleware,
    ServingError,
    StreamEndMiddleware,
    allowed_hosts,
    is_openai_path,
    openai_error,
)


async def _echo_body(request: Request) -> PlainTextResponse:
    return PlainTextResponse(str(len(await request.body())))


async def _events(_: Request) -> StreamingResponse:
    async def chunks():
        yield 'data: {"x": 1}\n\n'

    return StreamingResponse(chunks(), media_type="text/event-stream")


async def _socket(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.send_text("hello")
    await websocket.close()


def app() -> Starlette:
    return Starlette(
        routes=[
            Route("/v1/chat/completions", _events, methods=["POST"]),
            Route("/other", _events, methods=["POST"]),
            Route("/echo", _echo_body, methods=["POST"]),
            WebSocketRoute("/ws", _socket),
        ]
    )


class TestOpenAiError:
    @pytest.mark.parametrize(
        ("status", "kind"),
        [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (429, "rate_limit_error"),
            (503, "server_error"),
        ],
    )
    def test_shape(self, status, kind):
        assert openai_error("bad\nthing", status=status, code="x") == {
            "error": {"message": "bad thing", "type": kind, "code": "x", "param": None}
        }

    def test_paths(self):
        assert is_openai_path("/v1/chat/completions")
        assert is_openai_path("/chat/completions")
        assert is_openai_path("/models")
        assert not is_openai_path("/concatenation/run")

    def test_a_serving_error_is_one_line(self):
        assert ServingError(503, "the server\nis down", code="x").detail == "the server is down"


class TestHosts:
    def test_loopback_and_the_bound_address(self):
        assert allowed_hosts("127.0.0.1") == ["127.0.0.1", "localhost", "[::1]"]
        assert allowed_hosts("10.1.2.3", ["Fusion.Example.com"]) == [
            "127.0.0.1",
            "localhost",
            "[::1]",
            "fusion.example.com",
            "10.1.2.3",
        ]
        assert allowed_hosts("::") == ["127.0.0.1", "localhost", "[::1]"]  # a wildcard names no host
        assert allowed_hosts("0.0.0.0") == ["127.0.0.1", "localhost", "[::1]"]
        assert "[2001:db8::1]" in allowed_hosts("2001:db8::1")

    @pytest.mark.parametrize(
        ("host", "status"),
        [
            ("127.0.0.1:1416", 200),
            ("localhost", 200),
            ("[::1]:1416", 200),
            ("evil.example", 400),
            ("evil.example:1416", 400),
            ("127.0.0.1.evil.example", 400),
        ],
    )
    def test_a_foreign_host_is_refused(self, host, status):
        client = TestClient(TrustedHostMiddleware(app(), allowed_hosts=allowed_hosts("127.0.0.1")))
        assert client.post("/echo", content=b"x", headers={"Host": host}).status_code == status


FOREIGN_ORIGINS = [
    "http://evil.example",
    "null",  # a sandboxed page, a file, a redirect
    "",
    "http://testserver:8080",  # another port of the same host
    "http://testserver.evil.example",
    "http://user@testserver",
    "https://app.example.com.evil.example",
    "not an origin",
]


class TestOrigin:
    ALLOWED = "https://app.example.com"
    REFUSED = "Forbidden: requests from other web origins are refused"

    def client(self) -> TestClient:
        return TestClient(OriginMiddleware(app(), allowed_origins=[self.ALLOWED]))

    def cors_client(self) -> TestClient:
        """The rule in front of Starlette's CORS, as the served app has it."""
        cors = Middleware(CORSMiddleware, allow_origins=[self.ALLOWED], allow_methods=["GET", "POST"])
        inner = Starlette(routes=[Route("/echo", _echo_body, methods=["POST"])], middleware=[cors])
        return TestClient(OriginMiddleware(inner, allowed_origins=[self.ALLOWED]))

    @pytest.mark.parametrize("origin", FOREIGN_ORIGINS)
    def test_a_websocket_from_another_origin_is_closed_before_it_opens(self, origin):
        with (
            pytest.raises(WebSocketDisconnect) as closed,
            self.client().websocket_connect("/ws", headers={"Origin": origin}),
        ):
            pass
        assert closed.value.code == 1008

    @pytest.mark.parametrize("origin", FOREIGN_ORIGINS)
    def test_http_from_another_origin_is_refused_in_the_routes_shape(self, origin):
        refused = self.client().post("/echo", content=b"x", headers={"Origin": origin})
        assert refused.status_code == 403
        assert refused.json() == {"detail": self.REFUSED}
        assert "access-control-allow-origin" not in refused.headers
        refused = self.client().post("/v1/chat/completions", headers={"Origin": origin})
        assert refused.status_code == 403
        assert refused.json()["error"] == {
            "message": self.REFUSED,
            "type": "invalid_request_error",
            "code": "bad_origin",
            "param": None,
        }

    @pytest.mark.parametrize("origin", [None, "http://testserver", "HTTP://TestServer/", ALLOWED, f"{ALLOWED}/"])
    def test_the_own_origin_an_allowed_one_or_none_passes(self, origin):
        headers = {"Origin": origin} if origin else {}
        with self.client().websocket_connect("/ws", headers=headers) as websocket:
            assert websocket.receive_text() == "hello"
        assert self.client().post("/echo", content=b"x", headers=headers).text == "1"

    def test_the_own_origin_is_the_host_the_request_was_sent_to(self):
        headers = {"Host": "127.0.0.1:1416", "Origin": "http://127.0.0.1:1416"}
        assert self.client().post("/echo", content=b"x", headers=headers).status_code == 200
        headers = {"Host": "127.0.0.1:1416", "Origin": "http://localhost:1416"}
        assert self.client().post("/echo", content=b"x", headers=headers).status_code == 403

    def test_every_origin_header_must_pass(self):
        headers = [("origin", self.ALLOWED), ("origin", "http://evil.example")]
        assert self.client().post("/echo", content=b"x", headers=headers).status_code == 403

    def test_a_preflight_of_an_allowed_origin_is_answered_by_cors_a_foreign_one_refused(self):
        asked = {"Access-Control-Request-Method": "POST"}
        allowed = self.cors_client().options("/echo", headers={**asked, "Origin": self.ALLOWED})
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == self.ALLOWED
        refused = self.cors_client().options("/echo", headers={**asked, "Origin": "http://evil.example"})
        assert refused.status_code == 403
        assert "access-control-allow-origin" not in refused.headers


class TestBodyLimit:
    def client(self) -> TestClient:
        return TestClient(BodyLimitMiddleware(app(), max_bytes=100))

    def test_within_the_limit(self):
        assert self.client().post("/echo", content=b"x" * 100).text == "100"

    def test_over_the_limit_by_its_length(self):
        response = self.client().post("/v1/chat/completions", content=b"x" * 101)
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"
        assert self.client().post("/echo", content=b"x" * 101).json() == {
            "detail": "Request body too large: this server takes at most 100 bytes"
        }

    def test_over_the_limit_as_it_streams(self):
        def chunks():
            for _ in range(50):
                yield b"x" * 10

        assert self.client().post("/echo", content=chunks()).status_code == 413

    def test_the_limit_must_be_positive(self):
        with pytest.raises(ValueError, match="`max_bytes` must be at least 1"):
            BodyLimitMiddleware(app(), max_bytes=0)

    def test_a_disconnect_cancels_the_work(self):
        started, cancelled = asyncio.Event(), asyncio.Event()

        async def slow(scope, receive, send):
            await receive()
            started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        async def scenario() -> None:
            messages: asyncio.Queue = asyncio.Queue()
            await messages.put({"type": "http.request", "body": b"{}", "more_body": False})

            async def send(_):
                pass

            scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
            task = asyncio.create_task(BodyLimitMiddleware(slow)(scope, messages.get, send))
            await asyncio.wait_for(started.wait(), 10)
            await messages.put({"type": "http.disconnect"})
            await asyncio.wait_for(task, 10)

        asyncio.run(scenario())
        assert cancelled.is_set()


class TestStreamEnd:
    def test_an_openai_stream_ends_with_done(self):
        client = TestClient(StreamEndMiddleware(app()))
        assert client.post("/v1/chat/completions").text == 'data: {"x": 1}\n\ndata: [DONE]\n\n'

    def test_other_routes_are_left_alone(self):
        client = TestClient(StreamEndMiddleware(app()))
        assert client.post("/other").text == 'data: {"x": 1}\n\n'
        assert client.post("/echo", content=b"ab").text == "2"
