"""Hayhooks for real: a server on 127.0.0.1 with the shipped wrappers over the embedded model and a saved index."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from haystack_fusion.backends import save_store

from .conftest import free_port, stop, wait_until_ready

httpx = pytest.importorskip("httpx", reason="the `serve` extra")
pytest.importorskip("hayhooks", reason="the `serve` extra (pip install 'haystack-fusion[serve]')")
openai = pytest.importorskip("openai")

WRAPPERS = Path(__file__).resolve().parents[2] / "pipelines"
QUESTION = "When were the Normans in Normandy?"


@pytest.fixture(scope="module")
def server(tmp_path_factory, squad):
    root = tmp_path_factory.mktemp("hayhooks")
    shutil.copytree(WRAPPERS / "concat_pf", root / "pipelines" / "concat_pf")
    index = root / "index.json"
    save_store(squad[0], index)
    port = free_port()
    env = {
        **os.environ,
        "HAYSTACK_FUSION_STORE": str(index),
        "HAYSTACK_FUSION_DOCUMENT_STORE": "memory",
        "HAYSTACK_FUSION_LLM": "local",
        "HAYSTACK_DESERIALIZATION_ALLOWLIST": "haystack_fusion",
    }
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
        return "concat_pf" in str(httpx.get(f"{url}/status", timeout=2).json())

    try:
        wait_until_ready(deployed, process, root / "server.log", what="hayhooks")
        yield url
    finally:
        stop(process)
        log.close()


def test_run_endpoint_answers_with_sources(server):
    response = httpx.post(f"{server}/concat_pf/run", json={"query": QUESTION}, timeout=120)
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert result["answer"]
    assert result["sources"]
    assert result["usage"]["calls"] >= 1


def test_openai_client_chat_completion(server):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="not-needed")
    completion = client.chat.completions.create(model="concat_pf", messages=[{"role": "user", "content": QUESTION}])
    text = completion.choices[0].message.content
    assert "\n\nSources:\n[1] " in text
    assert text.split("\n\nSources:")[0].strip()


def test_empty_question_is_a_client_error(server):
    response = httpx.post(f"{server}/concat_pf/run", json={"query": "   "}, timeout=60)
    assert response.status_code == 400
    assert "non-empty question" in response.text
