"""
A small OpenAI-compatible chat-completions server for tests, on 127.0.0.1, with latency, fault injection and counters.

Point the real client at it (Haystack's `OpenAIChatGenerator(api_base_url=server.base_url,
api_key=Secret.from_token("x"))`) and assert on what the server saw: how many requests arrived, how many were
retries (the openai client's `x-stainless-retry-count` header), how many were under way at once. It needs no
model: each reply is a fixed text or what a callable returns for the request; `PromptReplies`
(`tests.support`) answers each of our prompts in the form its parser reads, so every strategy runs end to
end against the server. It needs FastAPI and uvicorn (the `dev` extra).

- `POST /v1/chat/completions` with `stream: false` (the default) answers a `chat.completion` object; `stream: true`
  is refused with HTTP 400 (not supported).
- A request that offers `tools` (an Agent's) gets an agent's turn instead of the reply (`agent_turn`): one call of
  the first tool with the last user message as `query`, then, once a `tool` message is there, a text quoting it.
- A reply function that raises gets HTTP 500 with its message (the openai client retries it, up to its
  `max_retries`).
- `latency` seconds pass before each reply (`asyncio.sleep`s, so concurrent requests overlap as they would on a
  hosted API); a client that disconnects meanwhile gets no reply. `log` records each request in order of arrival
  (`RequestRecord`: its body, when it arrived and ended, whether its client disconnected first).
- `usage` counts whitespace-separated words of the messages and the reply, not tokens: enough for tests that check
  the sums.
- `api_key`, when set: a request whose `Authorization: Bearer ...` differs gets HTTP 401 in OpenAI's error shape
  ("Incorrect API key provided: ..."), as api.openai.com answers a wrong key (the openai client does not retry it).
- Injected faults (`fault_rate`, `faults`, `seed`): a share of the requests gets one of `FAULTS` instead of its reply:
  `rate_limit` (HTTP 429 with `Retry-After` / `retry-after-ms`), `server_error` (HTTP 500), `reset` (the TCP
  connection reset, no response), `hang` (HTTP 200 headers and the start of a body that never ends: the client's
  read timeout fires; the response is dropped after `hang_seconds`, or when the server stops), `malformed` (HTTP 200
  with a truncated JSON body), `garbage` (a well-formed completion whose text is noise) and `empty` (a completion
  whose text is ""). Which request gets which fault is a pure function of `seed`, the request body and how many
  times that same body arrived before (retries and repeats included), so a run is reproducible whatever order
  concurrent requests arrive in, and a retried request is drawn afresh. `stats.faults` counts each kind.
- `capacity`: requests beyond this many under way at once get HTTP 429 with `Retry-After` (a rate-limited API's
  storm); `stats.throttled` counts them.
- Bounded: after `max_requests` requests it answers HTTP 503 and stops, and it stops by itself after `lifetime`
  seconds, so a test that goes wrong cannot leave a server behind.

### Usage example
```python
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.dataclasses import ChatMessage
from haystack.utils import Secret
from haystack_fusion.testing import PromptReplies
from tests.support.openai_server import OpenAIServer

with OpenAIServer(reply="Paris", latency=0.05) as server:
    llm = OpenAIChatGenerator(api_base_url=server.base_url, api_key=Secret.from_token("x"), model="test")
    llm.run([ChatMessage.from_user("Capital of France?")])
    assert server.stats.requests == 1

# every strategy end to end, a fifth of the requests faulted, counted per kind
with OpenAIServer(reply=PromptReplies(), fault_rate=0.2, seed=0, hang_seconds=10) as server:
    ...
    print(server.stats.snapshot())  # requests, first_attempts, retries, max_in_flight, faults, ...
```
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import math
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

Reply = str | Callable[[dict[str, Any]], str]
"""A fixed reply text, or a function of the request body (the parsed JSON) that returns the reply text."""

FAULTS = ("rate_limit", "server_error", "reset", "hang", "malformed", "garbage", "empty")
"""The faults the server injects by default: 429 with Retry-After, 500, a connection reset, a response that never
ends, malformed JSON, a completion of noise, an empty completion."""

FAULT_KINDS = (*FAULTS, "bad_request")
"""Every fault the server can inject when asked (`faults`): `FAULTS` and `bad_request`, HTTP 400 as a server answers a
prompt over the model's context (no client retries it, and no message of this package names it)."""


@dataclass
class ServerStats:
    """
    What the server saw, updated as requests arrive (read it after the client's calls have returned).

    :param requests: Requests received on the chat-completions route, refused ones included.
    :param retries: Those the openai client marked as a retry (`x-stainless-retry-count` > 0).
    :param in_flight: Requests being answered now.
    :param max_in_flight: The most requests that were being answered at once.
    :param refused: Requests answered with an error status (over `max_requests`, a wrong API key, `stream: true`, or
        a reply function that raised); injected faults are counted in `faults` instead.
    :param first_attempts: Requests that were not retries: the client's calls (each call's first HTTP request).
    :param max_retry_count: The highest `x-stainless-retry-count` seen (a call's last retry).
    :param faults: Injected faults by kind (`FAULTS`), `rate_limit` and `server_error` included.
    :param throttled: Requests answered HTTP 429 because more than `capacity` were under way.
    """

    requests: int = 0
    retries: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    refused: int = 0
    first_attempts: int = 0
    max_retry_count: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    throttled: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def snapshot(self) -> dict[str, Any]:
        """The counters as a JSON-ready dict (a copy), `faults` by kind."""
        with self._lock:
            return {
                "requests": self.requests,
                "retries": self.retries,
                "first_attempts": self.first_attempts,
                "max_retry_count": self.max_retry_count,
                "in_flight": self.in_flight,
                "max_in_flight": self.max_in_flight,
                "refused": self.refused,
                "throttled": self.throttled,
                "faults": dict(sorted(self.faults.items())),
            }


@dataclass
class RequestRecord:
    """One request as the server saw it: its body, `time.monotonic()` when it arrived and when it was answered or
    dropped (None while under way), and whether its client disconnected before the reply."""

    body: dict[str, Any]
    arrived: float
    ended: float | None = None
    disconnected: bool = False


class OpenAIServer:
    """
    An OpenAI-compatible chat-completions server in a background thread (uvicorn serving a FastAPI app).

    :param reply: The reply text, or a function of the request body that returns it.
    :param latency: Seconds to wait before each reply (>= 0), or a function of the request body that returns them.
    :param max_requests: Requests it answers; the next ones get HTTP 503 and the server stops.
    :param lifetime: Seconds after `start` when the server stops by itself.
    :param model: The model name its replies report.
    :param api_key: The key requests must send (`Authorization: Bearer <api_key>`); others get HTTP 401. `None`
        (the default) accepts any key.
    :param fault_rate: Share of requests (0-1) that get an injected fault instead of their reply.
    :param faults: The kinds drawn from (uniformly), a subset of `FAULT_KINDS`.
    :param seed: Seeds the fault draws (see the module docstring: reproducible whatever the arrival order).
    :param retry_after: Seconds a 429 asks the client to wait (`Retry-After`, and `retry-after-ms` in milliseconds).
    :param hang_seconds: Seconds a `hang` response stays open before the connection is dropped; None: until the client
        goes away or the server stops (bounded by `lifetime`).
    :param capacity: Most requests under way at once; the ones beyond get HTTP 429 with `Retry-After`. None: no limit.
    :raises ValueError: For a negative latency, `max_requests` below 1, a `lifetime` not positive, a `fault_rate`
        outside [0, 1], an unknown fault kind, or a `capacity` below 1.
    """

    def __init__(
        self,
        *,
        reply: Reply = "Paris",
        latency: float | Callable[[dict[str, Any]], float] = 0.0,
        max_requests: int = 1000,
        lifetime: float = 120.0,
        model: str = "test-model",
        api_key: str | None = None,
        fault_rate: float = 0.0,
        faults: Sequence[str] = FAULTS,
        seed: int = 0,
        retry_after: float = 0.5,
        hang_seconds: float | None = None,
        capacity: int | None = None,
    ) -> None:
        if not callable(latency) and latency < 0:
            raise ValueError(f"`latency` must be >= 0, got {latency}")
        if max_requests < 1 or lifetime <= 0:
            raise ValueError("`max_requests` must be at least 1 and `lifetime` positive")
        if not 0.0 <= fault_rate <= 1.0:
            raise ValueError(f"`fault_rate` must be in [0, 1], got {fault_rate}")
        unknown = [kind for kind in faults if kind not in FAULT_KINDS]
        if unknown or (fault_rate > 0 and not faults):
            raise ValueError(f"`faults` must be kinds of {FAULT_KINDS}, got {list(faults)}")
        if capacity is not None and capacity < 1:
            raise ValueError(f"`capacity` must be None or at least 1, got {capacity}")
        self.reply = reply
        self.latency = latency
        self.max_requests = max_requests
        self.lifetime = lifetime
        self.model = model
        self.api_key = api_key
        self.fault_rate = fault_rate
        self.faults = tuple(faults)
        self.seed = seed
        self.retry_after = retry_after
        self.hang_seconds = hang_seconds
        self.capacity = capacity
        self.stats = ServerStats()
        self.log: list[RequestRecord] = []
        self._ids = itertools.count(1)
        self._seen: Counter[str] = Counter()
        self._stopping = threading.Event()
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
        async def chat_completions(request: Request) -> Response:
            try:
                raw = await request.body()
            except ClientDisconnect:  # cancelled while sending: nothing to answer
                return Response(status_code=499)
            body = json.loads(raw or b"{}")
            record = RequestRecord(body, time.monotonic())
            self.log.append(record)
            stats = self.stats
            retry_count = int(request.headers.get("x-stainless-retry-count", "0") or 0)
            with stats._lock:
                stats.requests += 1
                stats.retries += retry_count > 0
                stats.first_attempts += retry_count == 0
                stats.max_retry_count = max(stats.max_retry_count, retry_count)
                over = stats.requests > self.max_requests
                stats.refused += over or bool(body.get("stream"))
                stats.in_flight += 1
                stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
                throttled = self.capacity is not None and stats.in_flight > self.capacity
                stats.throttled += throttled and not over
                fault = None if over or throttled else self._draw_fault(raw)
                if fault is not None:
                    stats.faults[fault] += 1
            handed_off = False  # a `hang` response counts itself out of `in_flight` when it ends
            try:
                if over:
                    self.stop_soon()
                    return _error(503, f"this test server answers at most {self.max_requests} requests")
                if throttled:
                    return self._rate_limited("more requests under way than this test server's capacity")
                if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
                    with stats._lock:
                        stats.refused += 1
                    return _wrong_api_key(request.headers.get("authorization", ""))
                if body.get("stream"):
                    return _error(400, "stream=true is not supported by this test server")
                latency = self.latency(body) if callable(self.latency) else self.latency
                if latency and await _disconnected_within(request, latency):
                    record.disconnected = True
                    return Response(status_code=499)  # never read: the client is gone
                if fault == "rate_limit":
                    return self._rate_limited("injected fault: rate limit")
                if fault == "server_error":
                    return _error(500, "injected fault: server error")
                if fault == "bad_request":
                    return _error(400, "injected fault: this model's maximum context length is 2048 tokens")
                if fault == "reset":
                    _reset(request.scope)
                    return Response(status_code=500)  # never sent: the connection is gone
                if fault == "hang":
                    handed_off = True
                    return StreamingResponse(self._never_ends(request), media_type="application/json")
                if fault == "malformed":
                    return Response(b'{"id": "chatcmpl-x", "object": "chat.completion", "choices": [{"index": 0, "mes',
                                    media_type="application/json")  # fmt: skip
                try:
                    completion = self._completion(body, fault)
                except Exception as error:  # a reply function that raises stands for a server error
                    with stats._lock:
                        stats.refused += 1
                    return _error(500, f"{type(error).__name__}: {error}")
                return JSONResponse(completion)
            finally:
                record.ended = time.monotonic()
                if not handed_off:
                    with stats._lock:
                        stats.in_flight -= 1

        async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
            # The connection's transport, for `reset`: uvicorn's `receive` is a method of its request cycle.
            scope["test_server.transport"] = getattr(getattr(receive, "__self__", None), "transport", None)
            await app(scope, receive, send)

        app.state.asgi = asgi
        return app

    def _draw_fault(self, raw: bytes) -> str | None:
        """The fault for this arrival of this body (call with the stats lock held): seeded, order-independent."""
        if self.fault_rate <= 0:
            return None
        digest = hashlib.sha256(raw).hexdigest()
        self._seen[digest] += 1
        draw = hashlib.sha256(f"{self.seed}:{digest}:{self._seen[digest]}".encode()).digest()
        share, pick = (int.from_bytes(draw[i : i + 8], "big") / 2**64 for i in (0, 8))
        return self.faults[int(pick * len(self.faults))] if share < self.fault_rate else None

    def _rate_limited(self, message: str) -> JSONResponse:
        """HTTP 429 in OpenAI's shape, with `Retry-After` (whole seconds, rounded up) and `retry-after-ms`."""
        response = _error(429, f"{message}; retry after {self.retry_after} s")
        response.headers["retry-after"] = str(max(1, math.ceil(self.retry_after)))
        response.headers["retry-after-ms"] = str(round(self.retry_after * 1000))
        return response

    async def _never_ends(self, request: Request) -> AsyncIterator[bytes]:
        """The body of a `hang`: its first bytes, then nothing until the client leaves, `hang_seconds` or the stop."""
        try:
            yield b'{"id": "chatcmpl-hang", "object": "chat.completion", "choices": ['
            deadline = time.monotonic() + (self.hang_seconds if self.hang_seconds is not None else math.inf)
            while not self._stopping.is_set() and time.monotonic() < deadline:
                if await request.is_disconnected():
                    return
                await asyncio.sleep(0.05)
            _reset(request.scope)  # never ends well: the connection drops
        finally:
            with self.stats._lock:
                self.stats.in_flight -= 1

    def _completion(self, body: dict[str, Any], fault: str | None = None) -> dict[str, Any]:
        turn = agent_turn(body) if fault is None else None
        if fault == "garbage":
            text = _garbage(hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest())
        elif fault == "empty":
            text = ""
        elif turn is not None:
            text = turn["content"] or ""
        else:
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
                    "message": turn or {"role": "assistant", "content": text},
                    "finish_reason": "tool_calls" if turn and turn.get("tool_calls") else "stop",
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
        config = uvicorn.Config(
            self.app().state.asgi, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2
        )
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
        Start counting afresh (between runs measured one after another on one server).

        Requests still under way stay counted in `in_flight`, and `max_in_flight` starts from them; `max_requests`
        counts afresh too (`lifetime` still bounds the server).

        :returns: The counters as they were before the reset (a copy).
        """
        stats = self.stats
        with stats._lock:
            before = ServerStats(
                stats.requests,
                stats.retries,
                stats.in_flight,
                stats.max_in_flight,
                stats.refused,
                stats.first_attempts,
                stats.max_retry_count,
                Counter(stats.faults),
                stats.throttled,
            )
            stats.requests = stats.retries = stats.refused = stats.first_attempts = stats.max_retry_count = 0
            stats.throttled = 0
            stats.faults.clear()
            self.log.clear()
            stats.max_in_flight = stats.in_flight
        return before

    def stop_soon(self) -> None:
        """Ask the server to stop (it finishes the requests under way; `hang` responses drop); returns at once."""
        self._stopping.set()
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


def agent_turn(body: dict[str, Any]) -> dict[str, Any] | None:
    """
    The assistant message an Agent gets for a request that offers `tools`; None for a request without them.

    With no `tool` message in the conversation yet: one call of the first tool, its arguments `{"query": <the last
    user message's text>}`. After one: "Based on the tool: <the last tool message's content>".
    """
    tools = body.get("tools")
    if not tools:
        return None
    messages = body.get("messages") or []
    results = [message for message in messages if message.get("role") == "tool"]
    if results:
        return {"role": "assistant", "content": f"Based on the tool: {_content_text(results[-1])}"}
    query = next((_content_text(m) for m in reversed(messages) if m.get("role") == "user"), "")
    call = {"name": tools[0]["function"]["name"], "arguments": json.dumps({"query": query})}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": f"call_{len(messages)}", "type": "function", "function": call}],
    }


async def _disconnected_within(request: Request, seconds: float) -> bool:
    """Wait `seconds`, or less when the client disconnects first (checked every 10 ms): whether it did."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if await request.is_disconnected():
            return True
        await asyncio.sleep(min(left, 0.01))
    return False


def _content_text(message: dict[str, Any]) -> str:
    """A chat-completions message's text: its `content` string, or its text parts joined."""
    content = message.get("content") or ""
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content)


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


def _reset(scope: MutableMapping[str, Any]) -> None:
    """Reset the request's TCP connection (SO_LINGER 0, then abort: the peer gets RST, no response)."""
    transport = scope.get("test_server.transport")
    if transport is None:
        raise RuntimeError("the test server cannot reach this connection's transport to reset it")
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _garbage(seed: bytes) -> str:
    """A reply of noise: control and bidi characters, markup, prompt markers and words, from a seed (reproducible)."""
    pieces = ("\u202e", "\x00", "]]>", "<passage", "(a)", "Answer:", "[DONE]", "\ufffd", "{{", "lorem", "\n", "#", "🙃")
    stream = hashlib.sha256(seed).digest() * 2
    return "".join(pieces[byte % len(pieces)] for byte in stream[: 16 + stream[0] % 48])
