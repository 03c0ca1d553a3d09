"""
`haystack-fusion serve` for real: Hayhooks on 127.0.0.1 with two strategies over the embedded model and a saved index;
the run route, the OpenAI-compatible chat endpoint (plain and streamed) and a server that refuses to start.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from haystack_fusion.backends import save_store
from tests.support.serve_process import HayhooksProcess, free_port

from .conftest import local_serving_env

httpx = pytest.importorskip("httpx", reason="the `serve` extra")
pytest.importorskip("hayhooks", reason="the `serve` extra (pip install 'haystack-fusion[serve]')")
openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def question(questions) -> str:
    """A question of the subset, read from ../shared at run time."""
    return questions[2].question


@pytest.fixture(scope="module")
def server(tmp_path_factory, squad):
    """`haystack-fusion serve --strategy concat_pf --strategy concatenation` on the embedded model."""
    root = tmp_path_factory.mktemp("serve")
    index = root / "index.json"
    save_store(squad[0], index)
    with HayhooksProcess(["concat_pf", "concatenation"], env=local_serving_env(index), workdir=root) as process:
        yield process.url


def test_run_endpoint_answers_with_sources(server, question):
    response = httpx.post(f"{server}/concat_pf/run", json={"query": question}, timeout=120)
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert result["answer"]
    assert result["sources"]
    assert result["usage"]["calls"] >= 1


def test_openai_client_chat_completion(server, question):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="not-needed")
    completion = client.chat.completions.create(model="concat_pf", messages=[{"role": "user", "content": question}])
    text = completion.choices[0].message.content
    assert "\n\nSources:\n[1] " in text
    assert text.split("\n\nSources:")[0].strip()


def test_empty_question_is_a_client_error(server):
    response = httpx.post(f"{server}/concat_pf/run", json={"query": "   "}, timeout=60)
    assert response.status_code == 400
    assert "non-empty question" in response.text


def test_streamed_chat_has_status_tokens_sources_and_details_for_open_webui(server, question):
    # a header Open WebUI sends (ENABLE_FORWARD_USER_INFO_HEADERS) asks for its dialect
    client = openai.OpenAI(
        base_url=f"{server}/v1", api_key="not-needed", default_headers={"X-OpenWebUI-Chat-Id": "chat-1"}
    )
    stream = client.chat.completions.create(
        model="concatenation", messages=[{"role": "user", "content": question}], stream=True
    )
    kinds, texts = [], []
    for chunk in stream:
        event = (chunk.model_extra or {}).get("event")
        if event:
            kinds.append(event["type"])
            if event["type"] == "source":
                assert event["data"]["document"][0]
        elif chunk.choices and chunk.choices[0].delta.content:
            kinds.append("text")
            texts.append(chunk.choices[0].delta.content)
    assert kinds[0] == "status"
    first_text = kinds.index("text")
    assert set(kinds[:first_text]) == {"status"}
    assert kinds.count("source") >= 1
    assert kinds.index("source") > first_text
    assert texts[-1].lstrip().startswith('<details type="evidence"')
    assert "".join(texts[:-1]).strip(), "an answer before the details"


def test_without_a_configured_backend_the_server_does_not_start(tmp_path):
    """`haystack-fusion serve` with the variables of a half-done setup: exit 1, one line per missing variable."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("HAYSTACK_FUSION_") and key not in ("OLLAMA_HOST",)
    }
    env.update(ELASTICSEARCH_URL="http://localhost:9200", OPENAI_API_KEY="sk-test-not-a-real-key")
    command = [str(Path(sys.executable).with_name("haystack-fusion")), "serve", "--port", str(free_port())]
    result = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "HAYSTACK_FUSION_LLM is not set" in result.stderr
    assert "HAYSTACK_FUSION_DOCUMENT_STORE is not set" in result.stderr
    assert "Traceback" not in result.stderr
