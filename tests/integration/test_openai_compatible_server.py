"""The hosted code path for real: OpenAIChatGenerator against llama-cpp-python's OpenAI-compatible server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.utils import Secret

from haystack_fusion.backends import (
    BackendConfig,
    chat_generator,
    load_store,
    missing_logprobs,
    packaged_model_path,
    save_store,
)
from haystack_fusion.cli import main
from haystack_fusion.strategies import build_pipeline, run_strategy

from .conftest import TOP_K, free_port, stop, wait_until_ready

httpx = pytest.importorskip("httpx")
pytest.importorskip("llama_cpp.server.app", reason="llama-cpp-python[server] (the `dev` extra)")


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    port = free_port()
    log_path = tmp_path_factory.mktemp("llama_server") / "server.log"
    command = [sys.executable, "-m", "llama_cpp.server", "--model", packaged_model_path(), "--host", "127.0.0.1",
               "--port", str(port), "--n_ctx", "8192", "--model_alias", "gemma3-270m",
               "--chat_format", "gemma"]  # fmt: skip
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
    run = run_strategy(pipeline, questions[0].question)
    assert run.answer_text().strip()  # an answer, or what the answer checks rejected and why
    assert len(run.documents) == TOP_K
    assert run.usage.failed_calls == 0
    assert run.usage.prompt_tokens > 0  # the server reports OpenAI-style usage
    assert run.usage.completion_tokens > 0


@pytest.fixture(scope="module")
def index(tmp_path_factory, squad) -> str:
    path = tmp_path_factory.mktemp("index") / "index.json"
    save_store(squad[0], path)
    return str(path)


def ask_json(capsys, *arguments: str) -> dict:
    assert main(["ask", *arguments, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


class TestConfidence:
    """`--logprobs` on llama-cpp-python's server, which sends log-probabilities only when `top_logprobs` is asked."""

    def options(self, server_url: str, index: str) -> list[str]:
        return ["--llm", "openai", "--model", "gemma3-270m", "--api-base-url", server_url, "--store", index,
                "--logprobs", "--max-tokens", "48", "--max-concurrency", "1"]  # fmt: skip

    def test_concatenation_has_a_confidence_and_cascade_falls_back_below_tau(
        self, server_url, index, questions, monkeypatch, capsys, caplog
    ):
        monkeypatch.setenv("OPENAI_API_KEY", "not-needed-by-a-local-server")
        options = self.options(server_url, index)
        for question in questions[:10]:  # one the concatenation answers (not "unknown")
            run = ask_json(capsys, question.question, "--strategy", "concatenation", *options)
            if run["answer"] != "unknown":
                break
        confidence = run["evidence"]["confidence"]
        assert confidence is not None
        assert 0.0 < confidence < 1.0
        assert "returned no token log-probabilities" not in caplog.text

        cascade = ask_json(capsys, question.question, "--strategy", "cascade", "--min-confidence", "1.0", *options)
        first = cascade["evidence"]["stages"][0]
        print(
            f"concatenation's confidence {confidence:.3f}; cascade at tau 1.0: stages {cascade['evidence']['stages']}"
        )
        assert first["stage"] == "concatenation"
        assert not first["answered"]
        assert first["reason"].startswith("confidence"), first
        assert len(cascade["evidence"]["stages"]) >= 2  # post-fusion ran

    def test_a_server_that_sends_none_is_named_once(self, server_url, index, questions, monkeypatch, capsys, caplog):
        """Without `top_logprobs`, this server sends none: the warning names it and what was sent."""
        monkeypatch.setenv("OPENAI_API_KEY", "not-needed-by-a-local-server")
        config = BackendConfig(llm="openai", model="gemma3-270m", api_base_url=server_url, logprobs=True)
        generator = chat_generator(config)
        assert generator.generation_kwargs["top_logprobs"] == 0
        del generator.generation_kwargs["top_logprobs"]
        generator.generation_kwargs.update(max_tokens=16)
        pipeline = build_pipeline("concatenation", retriever=InMemoryBM25Retriever(load_store(index)),
                                  chat_generator=generator)  # fmt: skip
        run = run_strategy(pipeline, questions[0].question)
        assert run.evidence.confidence is None
        message = missing_logprobs(generator, run.answers)
        assert message == (
            f"the OpenAI-compatible server at {server_url} returned no token log-probabilities although the "
            'requests asked for them ({"logprobs": true}): answers carry no confidence, so a confidence threshold '
            "(tau, --min-confidence) never routes a question"
        )
