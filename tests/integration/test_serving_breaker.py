"""
An LLM server that fails every call, met by `haystack-fusion serve` for real: the server in a child process on
127.0.0.1, its LLM the package's OpenAI-compatible test server answering HTTP 500 (Haystack's real
`OpenAIChatGenerator` calling it), asked through the real `openai` client with its default retries.

- Questions fail in seconds, and the failing server sees a handful of calls: one retry per call inside the server,
  the LLM server's circuit breaker failing the next calls at once, and no retry by the client
  (`x-should-retry: false`).
- The message the client raises says what happened in the user's terms: no URL, flag or variable.
- After the cool-down one probe call goes upstream; once the server answers again, so do the questions.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from haystack import Document

from haystack_fusion.backends import save_store
from tests.support.openai_server import OpenAIServer
from tests.support.serve_process import HayhooksProcess

pytest.importorskip("hayhooks", reason="the `serve` extra (pip install 'haystack-fusion[serve]')")
openai = pytest.importorskip("openai")

QUESTION = "What does post-fusion answer with?"
PASSAGES = [
    Document(content=f"Post-fusion answers with the majority vote of the replies ({i}).", meta={"title": f"p{i}.md"})
    for i in range(5)
]
COOLDOWN = 4.0
NAMES_NO_SETTING = ("http", "127.0.0.1", "--", "$", "OPENAI", "HAYSTACK_FUSION", "warnings above")


class Outage:
    """The LLM server's replies: HTTP 500 while `down` is set (a reply function that raises), else the answer."""

    def __init__(self) -> None:
        self.down = threading.Event()
        self.down.set()

    def __call__(self, body: dict[str, Any]) -> str:
        if self.down.is_set():
            raise RuntimeError("the model crashed")
        return "the majority vote"


@pytest.fixture
def index(tmp_path: Path) -> Path:
    path = tmp_path / "index.json"
    save_store(PASSAGES, path)
    return path


def ask(client: Any) -> tuple[float, Any]:
    """One question through the `openai` client: (seconds it took, the completion or the error it raised)."""
    start = time.monotonic()
    try:
        outcome = client.chat.completions.create(model="concat_pf", messages=[{"role": "user", "content": QUESTION}])
    except openai.APIError as error:
        outcome = error
    return time.monotonic() - start, outcome


def test_a_failing_llm_server_costs_seconds_and_a_handful_of_calls_then_one_probe(tmp_path, index):
    outage = Outage()
    with (
        OpenAIServer(reply=outage, lifetime=300) as llm,
        HayhooksProcess(
            ["concat_pf"],
            env={
                "HAYSTACK_FUSION_LLM": "openai",
                "HAYSTACK_FUSION_DOCUMENT_STORE": "memory",
                "HAYSTACK_FUSION_STORE": str(index),
                "OPENAI_BASE_URL": llm.base_url,
                "OPENAI_API_KEY": "x",
                "OPENAI_MAX_RETRIES": "",  # serving's default retries, whatever the environment says
                "HAYSTACK_FUSION_MAX_RETRIES": "",
                "HAYSTACK_FUSION_BREAKER_COOLDOWN": str(COOLDOWN),
            },
            workdir=tmp_path,
        ) as server,
    ):
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", timeout=60)  # the default 2 retries
        asked = [ask(client) for _ in range(3)]
        failed_calls = llm.stats.snapshot()

        for seconds, error in asked:
            assert isinstance(error, openai.InternalServerError), error
            assert seconds < 30
            assert error.status_code == 503
            assert error.body["code"] == "backend_unavailable"
            assert error.response.headers["x-should-retry"] == "false"
            assert 1 <= int(error.response.headers["retry-after"]) <= COOLDOWN
            assert error.body["message"] in [
                f"The language model server is failing: HTTP 500 Internal Server Error; try again in {wait} s"
                for wait in range(1, int(COOLDOWN) + 1)
            ]
            assert not any(word in error.message for word in NAMES_NO_SETTING), error.message  # "Error code: 503 - ..."
        # concatenation's call and post-fusion's 5, each tried twice; then the breaker fails the calls at once
        assert failed_calls["requests"] <= 12
        assert failed_calls["first_attempts"] <= 6
        assert server.log().count('"POST /v1/chat/completions HTTP/1.1" 503') == 3  # the client never retried

        time.sleep(COOLDOWN + 0.5)
        seconds, error = ask(client)  # the probe: one call (and its one retry), failing again
        assert isinstance(error, openai.InternalServerError)
        probe = llm.stats.snapshot()
        assert probe["first_attempts"] - failed_calls["first_attempts"] == 1
        assert probe["requests"] - failed_calls["requests"] <= 2

        outage.down.clear()
        seconds, error = ask(client)  # the breaker is open again: refused, never sent
        assert isinstance(error, openai.InternalServerError)
        assert llm.stats.snapshot()["requests"] == probe["requests"]
        time.sleep(COOLDOWN + 0.5)
        seconds, completion = ask(client)  # the probe succeeds: the server answers again
        assert not isinstance(completion, Exception), completion
        assert completion.choices[0].message.content.startswith("the majority vote")
        seconds, completion = ask(client)
        assert completion.choices[0].message.content.startswith("the majority vote")
        log = server.log()
    assert "Traceback" not in log
    assert "HTTP 503 backend_unavailable: The language model server is failing" in log
    assert "(cause: every LLM call failed" in log
