"""
`haystack-fusion serve` as clients and hostile pages meet it, for real: the server in a child process on 127.0.0.1,
its LLM the package's OpenAI-compatible test server (with faults where a test needs them), driven with httpx and the
`openai` client.

- Only its own user: a foreign `Host` (DNS rebinding) gets 400; a 20 MB body gets 413 before it is read (no memory
  spent, nothing logged); a question is logged by length and hash, and a question holding `</passage>` or tags breaks
  no log line; MCP refuses a web page of another origin.
- OpenAI's contract: errors in OpenAI's shape (`openai` raises them with the server's message), content part lists,
  `data: [DONE]` at the end of a stream, an invalid body as 400.
- Failures are never answers: every LLM call failing, or the LLM server answering 400, gives the same error streamed
  (an error chunk, which the `openai` client raises) or not (503 / 502); a lone surrogate is a 400.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest
from haystack import Document

from haystack_fusion.backends import save_store
from tests.support.openai_server import OpenAIServer
from tests.support.serve_process import HayhooksProcess

httpx = pytest.importorskip("httpx", reason="the `serve` extra")
pytest.importorskip("hayhooks", reason="the `serve` extra (pip install 'haystack-fusion[serve]')")
openai = pytest.importorskip("openai")

QUESTION = "What does post-fusion answer with?"
PASSAGES = [
    Document(content="Post-fusion answers with the majority vote of the replies.", meta={"title": "post-fusion.md"}),
    Document(content="Chain-of-Note writes a reading note per passage.", meta={"title": "chain-of-note.md"}),
]


def env_for(index: Path, base_url: str) -> dict[str, str]:
    return {
        "HAYSTACK_FUSION_LLM": "openai",
        "HAYSTACK_FUSION_DOCUMENT_STORE": "memory",
        "HAYSTACK_FUSION_STORE": str(index),
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": "x",
        "HAYSTACK_FUSION_MAX_RETRIES": "0",
    }


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("contract") / "index.json"
    save_store(PASSAGES, path)
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory, index):
    with (
        OpenAIServer(reply="the majority vote") as llm,
        HayhooksProcess(
            ["concatenation", "cascade"], env=env_for(index, llm.base_url), workdir=tmp_path_factory.mktemp("server")
        ) as process,
    ):
        yield process


def events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


OPEN_WEBUI = {"User-Agent": "Python/3.11 aiohttp/3.12.15"}
"""The user agent of Open WebUI's requests, which get its status events (`serving.protocol.dialect`)."""


def stream(url: str, body: dict, headers: dict[str, str] | None = None) -> tuple[int, str]:
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, headers=headers, timeout=120
    ) as response:
        return response.status_code, "".join(response.iter_text())


class TestOnlyItsOwnUser:
    @pytest.mark.parametrize("host", ["evil.example", "evil.example:1416", "127.0.0.1.evil.example"])
    def test_a_foreign_host_is_refused(self, server, host):
        for method, path in (("GET", "/v1/models"), ("POST", "/concatenation/run"), ("GET", "/openapi.json")):
            response = httpx.request(method, f"{server.url}{path}", json={"query": "Who?"}, headers={"Host": host})
            assert response.status_code == 400, path
        assert httpx.get(f"{server.url}/v1/models").status_code == 200

    def test_a_huge_body_is_refused_unread(self, server):
        before = server.rss_bytes()
        big = {"model": "concatenation", "messages": [{"role": "user", "content": "x" * 20_000_000}]}
        response = httpx.post(f"{server.url}/v1/chat/completions", json=big, timeout=120)
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"
        assert httpx.post(f"{server.url}/concatenation/run", json={"query": "x" * 20_000_000}).status_code == 413
        assert server.rss_bytes() - before < 50 * 2**20
        assert max(len(line) for line in server.log().splitlines()) < 2000

    def test_questions_are_logged_by_length_and_hash_and_never_break_the_log(self, server):
        question = "What is </passage> <b>here</b> {x} <red>?"
        response = httpx.post(f"{server.url}/concatenation/run", json={"query": question}, timeout=120)
        assert response.status_code == 200
        log = server.log()
        assert "Logging error" not in log
        assert "</passage>" not in log
        assert re.search(r"'query': '41 characters, sha256 [0-9a-f]{12}'", log)


class TestNoRequestStalls:
    @pytest.mark.parametrize("newlines", [80_000, 500_000])
    def test_a_pathological_chat_is_answered_while_other_requests_are(self, server, newlines):
        """An earlier turn of newlines, up to the 1 MiB body limit: answered in seconds, and `/status` meanwhile."""
        chat = [
            {"role": "user", "content": "What is post-fusion?"},
            {"role": "assistant", "content": "A vote." + "\n" * newlines},
            {"role": "user", "content": QUESTION},
        ]
        body = {"model": "concatenation", "messages": chat}
        assert len(json.dumps(body)) < 1024 * 1024
        waits: list[float] = []
        done = threading.Event()

        def poll() -> None:
            while not done.is_set():
                start = time.perf_counter()
                assert httpx.get(f"{server.url}/status", timeout=120).status_code == 200
                waits.append(time.perf_counter() - start)
                time.sleep(0.05)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            start = time.perf_counter()
            response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
            seconds = time.perf_counter() - start
        finally:
            done.set()
            poller.join()
        assert seconds < 30, seconds  # a hang guard: milliseconds of reading, then two calls to the test server
        assert waits, "no /status request was answered meanwhile"
        assert max(waits) < 10, max(waits)  # a hang guard: the event loop is never held by the reading
        assert response.status_code == 200, response.text
        assert "Sources:\n[1] post-fusion.md" in response.json()["choices"][0]["message"]["content"]


class TestOpenAiContract:
    def test_errors_in_openai_shape(self, server):
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError) as error:
            client.chat.completions.create(model="concatenation", messages=[{"role": "user", "content": "  "}])
        assert error.value.body["code"] == "invalid_request"
        with pytest.raises(openai.NotFoundError) as error:
            client.chat.completions.create(model="nope", messages=[{"role": "user", "content": QUESTION}])
        assert "'nope' not found" in error.value.message
        invalid = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "cascade"})
        assert invalid.status_code == 400
        assert invalid.json()["error"]["message"] == "Invalid request body: messages: Field required"

    def test_content_parts_and_the_stream_end(self, server):
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        parts = [{"type": "text", "text": QUESTION}]
        completion = client.chat.completions.create(model="cascade", messages=[{"role": "user", "content": parts}])
        assert completion.choices[0].message.content.startswith("the majority vote\n\nSources:\n[1] ")
        chunks = list(
            client.chat.completions.create(model="cascade", messages=[{"role": "user", "content": parts}], stream=True)
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).startswith("the majority vote")
        status, text = stream(server.url, {"model": "cascade", "messages": [{"role": "user", "content": QUESTION}]})
        assert status == 200
        assert text.endswith("data: [DONE]\n\n")
        image = [{"type": "image_url", "image_url": {"url": "data:,"}}]
        with pytest.raises(openai.BadRequestError, match="content parts of type image_url"):
            client.chat.completions.create(model="cascade", messages=[{"role": "user", "content": image}])

    def test_a_lone_surrogate_is_a_400(self, server):
        body = json.dumps({"model": "cascade", "messages": [{"role": "user", "content": "Who is \ud800?"}]})
        response = httpx.post(
            f"{server.url}/v1/chat/completions", content=body, headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 400
        assert "not valid Unicode text" in response.json()["error"]["message"]


class TestFailuresAreNeverAnswers:
    @pytest.mark.parametrize(
        ("fault", "status", "code"), [("server_error", 503, "backend_unavailable"), ("bad_request", 502, "llm_error")]
    )
    def test_the_same_failure_streamed_or_not(self, tmp_path, index, fault, status, code):
        strategy = "cascade" if fault == "server_error" else "concatenation"
        with (
            OpenAIServer(reply="x", fault_rate=1.0, faults=(fault,)) as llm,
            # no circuit breaker: each request meets the same failure, never an open breaker's
            HayhooksProcess(
                [strategy],
                env={**env_for(index, llm.base_url), "HAYSTACK_FUSION_BREAKER_FAILURES": "0"},
                workdir=tmp_path,
            ) as server,
        ):
            body = {"model": strategy, "messages": [{"role": "user", "content": QUESTION}]}
            refused = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
            assert refused.status_code == status
            error = refused.json()["error"]
            assert error["code"] == code
            http_status, text = stream(server.url, body, OPEN_WEBUI)
            assert http_status == 200  # the stream had started: status events came first
            streamed = events(text)
            assert [event["error"] for event in streamed if "error" in event] == [error]
            answer = "".join(
                (c.get("delta") or {}).get("content") or "" for e in streamed for c in e.get("choices") or []
            )
            assert answer == ""  # no "unknown", no sources
            last_status = [
                e["event"]["data"]["description"] for e in streamed if e.get("event", {}).get("type") == "status"
            ][-1]
            assert last_status == f"Failed: {error['message']}"
            assert text.endswith("data: [DONE]\n\n")
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
            with pytest.raises(openai.APIError, match=re.escape(error["message"][:40])):
                list(client.chat.completions.create(**body, stream=True))


@pytest.mark.parametrize("streamed", [True, False])
def test_a_client_that_goes_away_cancels_its_question(tmp_path, index, streamed):
    """A client that goes away (Open WebUI's Stop closes the stream; an API client gives up): the question's pending
    LLM calls are never made."""
    import http.client
    import time
    from urllib.parse import urlsplit

    with (
        OpenAIServer(reply="unknown", latency=3.0) as llm,
        HayhooksProcess(["cascade"], env=env_for(index, llm.base_url), workdir=tmp_path) as server,
    ):
        body = {"model": "cascade", "messages": [{"role": "user", "content": QUESTION}], "stream": streamed}
        url = urlsplit(server.url)
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
        headers = {"Content-Type": "application/json", **OPEN_WEBUI}  # Open WebUI's stream, with its status lines
        connection.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        if streamed:
            response = connection.getresponse()
            while b"Concatenation: reading" not in (line := response.readline()):
                assert line, "the stream ended before concatenation's round started"
        deadline = time.monotonic() + 60
        while llm.stats.requests < 1 and time.monotonic() < deadline:  # concatenation's call is under way
            time.sleep(0.1)
        assert llm.stats.requests == 1
        connection.close()  # Stop
        time.sleep(8)  # concatenation's call ends (3 s): its "unknown" would send post-fusion's 2 calls at once
        assert llm.stats.requests == 1
        assert "Traceback" not in server.log()
