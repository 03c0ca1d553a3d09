"""
The log of `haystack-fusion serve`, for real: the server in a child process on 127.0.0.1 behind a key, its LLM the
package's OpenAI-compatible test server (4 s per call, so requests overlap), its output read from `server.log`.

A few requests are answered, refused (401, 400, 422, a foreign `Host`, a full queue) or fail (a streamed reply the
LLM server refuses, a streamed request whose wait for a slot runs out), and the log holds:

- every line in the one format (`serving.logs.LINE_PATTERN`): time, level, logger, request id, message;
- every line a request caused with that request's id, the one its response's `X-Request-ID` gave; lines without an
  id only before the server answered its first request and after it began shutting down;
- exactly one line per refused or failed request, saying its status, code and reason;
- never the question's text.
"""

from __future__ import annotations

import re
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import pytest
from haystack import Document

from haystack_fusion.backends import save_store
from tests.support.openai_server import OpenAIServer
from tests.support.serve_process import HayhooksProcess

httpx = pytest.importorskip("httpx", reason="the `serve` extra")
pytest.importorskip("hayhooks", reason="the `serve` extra (pip install 'haystack-fusion[serve]')")
from haystack_fusion.serving.logs import LINE_PATTERN  # noqa: E402

KEY = "hf-log-test-key"
MARK = "zebra-q7x"  # in every question sent: never in the log
QUESTION = f"What is the capital of France ({MARK})?"
AUTH = {"Authorization": f"Bearer {KEY}"}
FAILURE = re.compile(r"\bHTTP (?P<status>\d{3}) (?P<code>[a-z0-9_]+): (?P<reason>\S.*)")
"""A refused or failed request's line: its status, code and reason."""


def chat(question: str = QUESTION, **body) -> dict:
    return {"model": "concatenation", "messages": [{"role": "user", "content": question}], **body}


@dataclass
class Served:
    """The requests made (name -> response), the streamed replies' text and the server's log once it stopped."""

    responses: dict[str, httpx.Response] = field(default_factory=dict)
    streamed: dict[str, str] = field(default_factory=dict)
    log: str = ""


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Served:
    workdir = tmp_path_factory.mktemp("log")
    save_store([Document(content="Paris is the capital of France.", meta={"title": "Paris"})], workdir / "index.json")
    with OpenAIServer(reply="Paris", latency=4.0, lifetime=300) as llm:
        env = {
            "HAYSTACK_FUSION_LLM": "openai",
            "OPENAI_API_KEY": "x",
            "OPENAI_BASE_URL": llm.base_url,
            "HAYSTACK_FUSION_MAX_RETRIES": "0",
            "HAYSTACK_FUSION_DOCUMENT_STORE": "memory",
            "HAYSTACK_FUSION_STORE": str(workdir / "index.json"),
            "HAYSTACK_FUSION_API_KEY": KEY,
            "HAYSTACK_FUSION_MAX_REQUESTS": "1",
            "HAYSTACK_FUSION_MAX_WAITING": "1",
            "HAYSTACK_FUSION_QUEUE_TIMEOUT": "1",
        }
        served = Served()
        with HayhooksProcess(["concatenation"], env=env, workdir=workdir) as server:
            _requests(server.url, llm, served)
        served.log = server.log()
        return served


def _requests(url: str, llm: OpenAIServer, served: Served) -> None:
    post = f"{url}/v1/chat/completions"
    responses = served.responses
    responses["answered"] = httpx.post(post, json=chat(), headers=AUTH, timeout=60)
    responses["run answered"] = httpx.post(
        f"{url}/concatenation/run", json={"query": QUESTION}, headers=AUTH, timeout=60
    )
    responses["no key"] = httpx.post(post, json=chat(), timeout=60)
    responses["empty question"] = httpx.post(post, json=chat("  "), headers=AUTH, timeout=60)
    responses["invalid body"] = httpx.post(f"{url}/concatenation/run", json={"query": [QUESTION]}, headers=AUTH)
    responses["foreign host"] = httpx.post(post, json=chat(), headers={**AUTH, "Host": "evil.example"})
    responses["stream refused by the LLM"] = httpx.post(post, json=chat(stream=True), headers=AUTH, timeout=60)
    served.streamed["stream refused by the LLM"] = responses["stream refused by the LLM"].text
    # one request holds the only slot for 4 s; a streamed one waits for it (1 s at most), a third finds the queue full
    calls = llm.stats.requests
    holder = threading.Thread(
        target=lambda: responses.__setitem__("slot holder", httpx.post(post, json=chat(), headers=AUTH, timeout=60))
    )
    holder.start()
    deadline = time.monotonic() + 30
    while llm.stats.requests == calls and time.monotonic() < deadline:
        time.sleep(0.05)
    open_webui = {**AUTH, "User-Agent": "Python/3.11 aiohttp/3.12.15"}  # Open WebUI's stream says it waits
    with httpx.stream("POST", post, json=chat(stream=True), headers=open_webui, timeout=60) as waiting:
        lines = waiting.iter_lines()
        assert any("Waiting for the server" in line for line in lines)
        responses["queue full"] = httpx.post(post, json=chat(), headers=AUTH, timeout=60)
        served.streamed["wait ran out, streamed"] = "\n".join(lines)
        responses["wait ran out, streamed"] = waiting
    holder.join()


def parsed(log: str) -> list[dict[str, str]]:
    return [LINE_PATTERN.match(line).groupdict() for line in log.splitlines()]  # type: ignore[union-attr]


def test_every_line_is_in_the_one_format(served):
    log = served.log
    print(log)
    assert log.strip()
    bad = [line for line in log.splitlines() if not LINE_PATTERN.match(line)]
    assert bad == []


def test_the_requests_got_what_the_test_expects(served):
    responses = served.responses
    statuses = {name: response.status_code for name, response in responses.items()}
    assert statuses == {
        "answered": 200,
        "run answered": 200,
        "no key": 401,
        "empty question": 400,
        "invalid body": 422,
        "foreign host": 400,
        "stream refused by the LLM": 200,  # the stream had started: it ends with an error chunk
        "slot holder": 200,
        "queue full": 503,
        "wait ran out, streamed": 200,
    }
    assert '"code":"llm_error"' in served.streamed["stream refused by the LLM"]
    assert '"code":"server_busy"' in served.streamed["wait ran out, streamed"]


def test_every_line_a_request_caused_carries_its_id(served):
    responses, log = served.responses, served.log
    lines = parsed(log)
    ids = {name: response.headers["x-request-id"] for name, response in responses.items()}
    assert all(re.fullmatch(r"[0-9a-f]{8}", request_id) for request_id in ids.values())
    assert len(set(ids.values())) == len(ids)
    by_id: dict[str, list[dict[str, str]]] = defaultdict(list)
    for line in lines:
        by_id[line["request_id"]].append(line)
    for name, request_id in ids.items():
        access = [line for line in by_id[request_id] if line["logger"] == "uvicorn.access"]
        assert len(access) == 1, name
        assert f" {responses[name].status_code}" in access[0]["message"], name
    # lines with an id that no response of the test carried: the readiness polls of `GET /status`
    for request_id in set(by_id) - set(ids.values()) - {"-"}:
        assert [line["message"].split('"')[1] for line in by_id[request_id]] == ["GET /status HTTP/1.1"]
    # lines without an id: starting up (before the first request) and shutting down
    first = next(index for index, line in enumerate(lines) if line["request_id"] != "-")
    stop = next(index for index, line in enumerate(lines) if line["message"] == "Shutting down")
    assert [line for line in lines[first:stop] if line["request_id"] == "-"] == []
    assert {line["logger"] for line in lines[stop:]} == {"uvicorn.error"}


def test_one_line_per_refused_or_failed_request(served):
    responses, log = served.responses, served.log
    failures = defaultdict(list)
    for line in parsed(log):
        if line["logger"] != "uvicorn.access" and (match := FAILURE.search(line["message"])):
            failures[line["request_id"]].append((match["status"], match["code"], line["message"]))
    expected = {
        "no key": ("401", "invalid_api_key"),
        "empty question": ("400", "invalid_request"),
        "invalid body": ("422", "invalid_request"),
        "foreign host": ("400", "http_400"),
        "stream refused by the LLM": ("502", "llm_error"),
        "queue full": ("503", "server_busy"),
        "wait ran out, streamed": ("503", "server_busy"),
    }
    for name, response in responses.items():
        found = failures.pop(response.headers["x-request-id"], [])
        assert [(status, code) for status, code, _ in found] == ([expected[name]] if name in expected else []), name
    assert failures == {}


def test_the_question_is_never_logged(served):
    responses, log = served.responses, served.log
    assert MARK not in log
    assert MARK not in responses["invalid body"].text  # the 422 names the field, not its value
    assert responses["invalid body"].status_code == 422
    assert re.search(r"'query': '\d+ characters, sha256 [0-9a-f]{12}'", log)  # Hayhooks' run line, summarized
