"""
A small OpenAI-compatible chat-completions server for tests, on 127.0.0.1, with server-side counters.

Tests point the real client at it (Haystack's `OpenAIChatGenerator(api_base_url=server.base_url,
api_key=Secret.from_token("x"))`) and assert on what the server saw: how many requests arrived, how many were
retries (the openai client's `x-stainless-retry-count` header), how many were under way at once. It needs no
model: each reply is a fixed text or what a callable returns for the request.

One module for every test that needs such a server; later work (fault injection, peer benchmarks) extends it here.

- `POST /v1/chat/completions` with `stream: false` (the default) answers a `chat.completion` object; `stream: true`
  is refused with HTTP 400 (not supported yet).
- A reply function that raises gets HTTP 500 with its message (the openai client retries it, up to its
  `max_retries`).
- `latency` seconds pass before each reply (an `asyncio.sleep`, so concurrent requests overlap as they would on a
  hosted API).
- `usage` counts whitespace-separated words of the messages and the reply, not tokens: enough for tests that check
  the sums.
- `api_key`, when set: a request whose `Authorization: Bearer ...` differs gets HTTP 401 in OpenAI's error shape
  ("Incorrect API key provided: ..."), as api.openai.com answers a wrong key (the openai client does not retry it).
- Bounded: after `max_requests` requests it answers HTTP 503 and stops, and it stops by itself after `lifetime`
  seconds, so a test that goes wrong cannot leave a server behind.

### Usage
```python
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.dataclasses import ChatMessage
from haystack.utils import Secret
from tests.openai_server import OpenAIServer

with OpenAIServer(reply="Paris", latency=0.05) as server:
    llm = OpenAIChatGenerator(api_base_url=server.base_url, api_key=Secret.from_token("x"), model="test")
    llm.run([ChatMessage.from_user("Capital of France?")])
    assert server.stats.requests == 1
```
The `openai_server` fixture of `tests/conftest.py` starts one with the defaults; `start_openai_server` starts one
with other settings. Both are stopped when the test ends.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

Reply = str | Callable[[dict[str, Any]], str]
"""A fixed reply text, or a function of the request body (the parsed JSON) that returns the reply text."""


@dataclass
class ServerStats:
    """
    What the server saw, updated as requests arrive (read it after the client's calls have returned).

    :param requests: Requests received on the chat-completions route, refused ones included.
    :param retries: Those the openai client marked as a retry (`x-stainless-retry-count` > 0).
    :param in_flight: Requests being answered now.
    :param max_in_flight: The most requests that were being answered at once.
    :param refused: Requests answered with an error status (over `max_requests`, a wrong API key, `stream: true`, or
        a reply function that raised).
    """

    requests: int = 0
    retries: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    refused: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class OpenAIServer:
    """
    An OpenAI-compatible chat-completions server in a background thread (uvicorn serving a FastAPI app).

    :param reply: The reply text, or a function of the request body that returns it.
    :param latency: Seconds to wait before each reply (>= 0).
    :param max_requests: Requests it answers; the next ones get HTTP 503 and the server stops.
    :param lifetime: Seconds after `start` when the server stops by itself.
    :param model: The model name its replies report.
    :param api_key: The key requests must send (`Authorization: Bearer <api_key>`); others get HTTP 401. `None`
        (the default) accepts any key.
    """

    def __init__(
        self,
        *,
        reply: Reply = "Paris",
        latency: float = 0.0,
        max_requests: int = 1000,
        lifetime: float = 120.0,
        model: str = "test-model",
        api_key: str | None = None,
    ) -> None:
        if latency < 0:
            raise ValueError(f"`latency` must be >= 0, got {latency}")
        if max_requests < 1 or lifetime <= 0:
            raise ValueError("`max_requests` must be at least 1 and `lifetime` positive")
        self.reply = reply
        self.latency = latency
        self.max_requests = max_requests
        self.lifetime = lifetime
        self.model = model
        self.api_key = api_key
        self.stats = ServerStats()
        self._ids = itertools.count(1)
        self._socket: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None

    @property
    def port(self) -> int:
        """The port it listens on (a free one, chosen by the system at `start`)."""
        if self._socket is None:
            raise RuntimeError("the server is not started")
        return int(self._socket.getsockname()[1])

    @property
    def base_url(self) -> str:
        """The API base URL to give the client, e.g. `http://127.0.0.1:40123/v1`."""
        return f"http://127.0.0.1:{self.port}/v1"

    def app(self) -> FastAPI:
        """The FastAPI app: `POST /v1/chat/completions`."""
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request) -> JSONResponse:
            body = await request.json()
            stats = self.stats
            with stats._lock:
                stats.requests += 1
                stats.retries += int(request.headers.get("x-stainless-retry-count", "0") or 0) > 0
                over = stats.requests > self.max_requests
                stats.refused += over or bool(body.get("stream"))
                stats.in_flight += 1
                stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
            try:
                if over:
                    self.stop_soon()
                    return _error(503, f"this test server answers at most {self.max_requests} requests")
                if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
                    with stats._lock:
                        stats.refused += 1
                    return _wrong_api_key(request.headers.get("authorization", ""))
                if body.get("stream"):
                    return _error(400, "stream=true is not supported by this test server")
                if self.latency:
                    await asyncio.sleep(self.latency)
                try:
                    completion = self._completion(body)
                except Exception as error:  # a reply function that raises stands for a server error
                    with stats._lock:
                        stats.refused += 1
                    return _error(500, f"{type(error).__name__}: {error}")
                return JSONResponse(completion)
            finally:
                with stats._lock:
                    stats.in_flight -= 1

        return app

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        text = self.reply(body) if callable(self.reply) else self.reply
        prompt_words = sum(len(str(message.get("content") or "").split()) for message in body.get("messages", []))
        completion_words = len(text.split())
        return {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_words,
                "completion_tokens": completion_words,
                "total_tokens": prompt_words + completion_words,
            },
        }

    def start(self) -> OpenAIServer:
        """
        Bind 127.0.0.1 on a free port and serve from a daemon thread; returns once the server accepts requests.

        :returns: The server.
        :raises RuntimeError: If it is already started, or does not start within 10 seconds.
        """
        if self._thread is not None:
            raise RuntimeError("the server is already started")
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        config = uvicorn.Config(self.app(), log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="openai-test-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                self.stop()
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        self._timer = threading.Timer(self.lifetime, self.stop_soon)
        self._timer.daemon = True
        self._timer.start()
        return self

    def reset(self) -> ServerStats:
        """
        Start counting afresh (between runs measured one after another, as `benchmarks/peers.py` does).

        Requests still under way stay counted in `in_flight`, and `max_in_flight` starts from them; `max_requests`
        counts afresh too (`lifetime` still bounds the server).

        :returns: The counters as they were before the reset (a copy).
        """
        stats = self.stats
        with stats._lock:
            before = ServerStats(stats.requests, stats.retries, stats.in_flight, stats.max_in_flight, stats.refused)
            stats.requests = stats.retries = stats.refused = 0
            stats.max_in_flight = stats.in_flight
        return before

    def stop_soon(self) -> None:
        """Ask the server to stop (it finishes the requests under way); returns at once."""
        if self._server is not None:
            self._server.should_exit = True

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server and wait (up to `timeout` seconds) for its thread; safe to call more than once."""
        if self._timer is not None:
            self._timer.cancel()
        self.stop_soon()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._socket is not None:
            self._socket.close()

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _error(status: int, message: str) -> JSONResponse:
    """An error in the OpenAI API's shape."""
    return JSONResponse(
        {"error": {"message": message, "type": "test_server_error", "code": status}}, status_code=status
    )


def _wrong_api_key(authorization: str) -> JSONResponse:
    """HTTP 401 as api.openai.com answers a wrong key: the key masked but for its last four characters."""
    key = authorization.removeprefix("Bearer ").strip()
    masked = f"{key[:3]}{'*' * max(len(key) - 7, 0)}{key[-4:]}" if len(key) > 7 else "*" * len(key)
    return JSONResponse(
        {
            "error": {
                "message": f"Incorrect API key provided: {masked}. You can find your API key at "
                "https://platform.openai.com/account/api-keys.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
        },
        status_code=401,
    )
