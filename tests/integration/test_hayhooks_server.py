"""Hayhooks for real: a server on 127.0.0.1 with the shipped wrappers over the embedded model and a saved index."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from haystack_fusion.backends import save_store

from .conftest import free_port, local_serving_env, stop, wait_until_ready

httpx = pytest.importorskip("httpx", reason="the `serve` extra")
pytest.importorskip("hayhooks", reason="the `serve` extra (pip install 'haystack-fusion[serve]')")
openai = pytest.importorskip("openai")

WRAPPERS = Path(__file__).resolve().parents[2] / "pipelines"


@pytest.fixture(scope="module")
def question(questions) -> str:
    """A question of the subset, read from ../shared at run time."""
    return questions[2].question


@pytest.fixture(scope="module")
def server(tmp_path_factory, squad):
    root = tmp_path_factory.mktemp("hayhooks")
    for strategy in ("concat_pf", "concatenation"):
        shutil.copytree(WRAPPERS / strategy, root / "pipelines" / strategy)
    index = root / "index.json"
    save_store(squad[0], index)
    port = free_port()
    env = local_serving_env(index)
    hayhooks = Path(sys.executable).with_name("hayhooks")
    command = [
        str(hayhooks),
        "run",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--pipelines-dir",
        str(root / "pipelines"),
    ]
    log = (root / "server.log").open("w")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def deployed() -> bool:
        return {"concat_pf", "concatenation"} <= set(httpx.get(f"{url}/status", timeout=2).json()["pipelines"])

    try:
        wait_until_ready(deployed, process, root / "server.log", what="hayhooks")
        yield url
    finally:
        stop(process)
        log.close()


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


def test_streamed_chat_has_status_tokens_sources_and_details(server, question):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="not-needed")
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


def test_without_a_configured_backend_nothing_deploys(tmp_path):
    """`hayhooks run --pipelines-dir pipelines` with the old production recipe's variables: every wrapper refuses."""
    port = free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("HAYSTACK_FUSION_") and key not in ("OLLAMA_HOST",)
    }
    env.update(
        ELASTICSEARCH_URL="http://localhost:9200",
        OPENAI_API_KEY="sk-test-not-a-real-key",
        HAYSTACK_DESERIALIZATION_ALLOWLIST="haystack_fusion",
    )
    hayhooks = Path(sys.executable).with_name("hayhooks")
    command = [str(hayhooks), "run", "--host", "127.0.0.1", "--port", str(port), "--pipelines-dir", str(WRAPPERS)]
    log_path = tmp_path / "server.log"
    log = log_path.open("w")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until_ready(lambda: "Startup deploy complete" in log_path.read_text(), process, log_path, what="hayhooks")
        assert httpx.get(f"http://127.0.0.1:{port}/status", timeout=5).json()["pipelines"] == []
        text = log_path.read_text()
        assert "HAYSTACK_FUSION_LLM is not set" in text
        assert "HAYSTACK_FUSION_DOCUMENT_STORE is not set" in text
    finally:
        stop(process)
        log.close()
