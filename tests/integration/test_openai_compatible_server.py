"""The hosted code path for real: OpenAIChatGenerator against llama-cpp-python's OpenAI-compatible server."""

from __future__ import annotations

import subprocess
import sys

import pytest
from haystack.utils import Secret

from haystack_fusion.backends import BackendConfig, chat_generator, packaged_model_path
from haystack_fusion.strategies import build_pipeline, run_strategy

from .conftest import TOP_K, free_port, stop, wait_until_ready

httpx = pytest.importorskip("httpx")
pytest.importorskip("llama_cpp.server.app", reason="llama-cpp-python[server] (the `dev` extra)")


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    port = free_port()
    log_path = tmp_path_factory.mktemp("llama_server") / "server.log"
    command = [sys.executable, "-m", "llama_cpp.server", "--model", packaged_model_path(), "--host", "127.0.0.1",
               "--port", str(port), "--n_ctx", "8192", "--model_alias", "gemma3-270m"]  # fmt: skip
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}/v1"
        try:
            wait_until_ready(
                lambda: httpx.get(f"{url}/models", timeout=2).status_code == 200,
                process,
                log_path,
                what="llama_cpp.server",
            )
            yield url
        finally:
            stop(process)


@pytest.mark.parametrize("name", ["concat_pf", "sure", "cascade"])
def test_strategy_through_openai_chat_generator(name, server_url, retriever, questions, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "not-needed-by-a-local-server")
    monkeypatch.setenv("OPENAI_TIMEOUT", "300")
    config = BackendConfig(llm="openai", model="gemma3-270m", api_base_url=server_url)
    generator = chat_generator(config)
    assert generator.api_key == Secret.from_env_var("OPENAI_API_KEY")
    # the base model behind a chat template does not stop by itself: bound each completion
    generator.generation_kwargs.update(max_tokens=48, stop=["\n\n"])
    pipeline = build_pipeline(name, retriever=retriever, chat_generator=generator, max_concurrency=1)
    run = run_strategy(name, pipeline, questions[0].question)
    assert run.answer_text().strip()  # an answer, or what the answer checks rejected and why
    assert len(run.documents) == TOP_K
    assert run.usage["failed_calls"] == 0
    assert run.usage["prompt_tokens"] > 0  # the server reports OpenAI-style usage
    assert run.usage["completion_tokens"] > 0
