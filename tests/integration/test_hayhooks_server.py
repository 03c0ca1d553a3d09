"""Hayhooks for real: a server on 127.0.0.1 with the shipped wrappers over the embedded model and a saved index."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from haystack_fusion.backends import save_store

httpx = pytest.importorskip("httpx", reason="the `serve` extra")
pytest.importorskip("hayhooks", reason="the `serve` extra (pip install 'haystack-fusion[serve]')")
openai = pytest.importorskip("openai")

WRAPPERS = Path(__file__).resolve().parents[2] / "pipelines"
QUESTION = "When were the Normans in Normandy?"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/status", timeout=2).status_code == 200:
                    status = httpx.get(f"{url}/status", timeout=2).json()
                    if "concat_pf" in str(status):
                        break
            except httpx.HTTPError:
                pass
            if process.poll() is not None:
                pytest.fail(f"hayhooks exited: {(root / 'server.log').read_text()[-2000:]}")
            time.sleep(1)
        else:
            pytest.fail(f"hayhooks did not deploy concat_pf: {(root / 'server.log').read_text()[-2000:]}")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
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
