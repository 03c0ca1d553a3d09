"""
The backend preflight: each backend's settings checked, and a clear error before a pipeline is deployed.
"""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from haystack_fusion.backends import save_store
from haystack_fusion.backends.checks import BackendSetupError, check_backend
from haystack_fusion.llm import CallLimitedChatGenerator
from haystack_fusion.serving.hayhooks import StrategyPipelineWrapper
from tests.unit.scripted_calls import DOCUMENTS

VARIABLES = (
    "HAYSTACK_FUSION_LLM",
    "HAYSTACK_FUSION_DOCUMENT_STORE",
    "HAYSTACK_FUSION_STORE",
    "HAYSTACK_FUSION_RETRIEVER",
    "HAYSTACK_FUSION_MODEL",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OLLAMA_HOST",
    "ELASTICSEARCH_URL",
)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)


class TestCheckBackend:
    def test_nothing_set_names_both_choices(self):
        with pytest.raises(BackendSetupError) as error:
            check_backend()
        assert "HAYSTACK_FUSION_LLM is not set" in str(error.value)
        assert "HAYSTACK_FUSION_DOCUMENT_STORE is not set" in str(error.value)

    def test_the_old_production_recipe_is_refused_not_served_on_the_embedded_model(self, monkeypatch):
        monkeypatch.setenv("ELASTICSEARCH_URL", "http://localhost:9200")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        with pytest.raises(BackendSetupError, match="HAYSTACK_FUSION_LLM is not set"):
            check_backend()

    def test_openai_without_key_and_memory_without_index(self, monkeypatch):
        monkeypatch.setenv("HAYSTACK_FUSION_LLM", "openai")
        monkeypatch.setenv("HAYSTACK_FUSION_DOCUMENT_STORE", "memory")
        with pytest.raises(BackendSetupError) as error:
            check_backend()
        assert "needs OPENAI_API_KEY" in str(error.value)
        assert "needs HAYSTACK_FUSION_STORE" in str(error.value)

    def test_missing_index_file(self, monkeypatch, tmp_path):
        monkeypatch.setenv("HAYSTACK_FUSION_LLM", "local")
        monkeypatch.setenv("HAYSTACK_FUSION_DOCUMENT_STORE", "memory")
        monkeypatch.setenv("HAYSTACK_FUSION_STORE", str(tmp_path / "missing.json"))
        with pytest.raises(BackendSetupError, match="no saved index there"):
            check_backend()

    def test_unknown_kind_is_a_setup_error(self, monkeypatch):
        monkeypatch.setenv("HAYSTACK_FUSION_LLM", "gpt")
        monkeypatch.setenv("HAYSTACK_FUSION_DOCUMENT_STORE", "memory")
        with pytest.raises(BackendSetupError, match="`llm` must be one of local, openai, ollama"):
            check_backend()

    def test_embedded_backend_passes(self, monkeypatch, tmp_path):
        pytest.importorskip("llama_cpp", reason="the `local` extra")
        index = tmp_path / "index.json"
        save_store(DOCUMENTS, index)
        monkeypatch.setenv("HAYSTACK_FUSION_LLM", "local")
        monkeypatch.setenv("HAYSTACK_FUSION_DOCUMENT_STORE", "memory")
        monkeypatch.setenv("HAYSTACK_FUSION_STORE", str(index))
        config = check_backend()
        assert (config.llm, config.store, config.index_path) == ("local", "memory", str(index))

    def test_elasticsearch_needs_its_url_and_a_server_that_answers(self, monkeypatch, tmp_path):
        pytest.importorskip("haystack_integrations.document_stores.elasticsearch", reason="the `elasticsearch` extra")
        monkeypatch.setenv("HAYSTACK_FUSION_LLM", "openai")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        monkeypatch.setenv("HAYSTACK_FUSION_DOCUMENT_STORE", "elasticsearch")
        with pytest.raises(BackendSetupError, match="needs ELASTICSEARCH_URL"):
            check_backend()
        monkeypatch.setenv("ELASTICSEARCH_URL", f"http://127.0.0.1:{free_port()}")
        with pytest.raises(BackendSetupError, match="Elasticsearch is not reachable at ELASTICSEARCH_URL"):
            check_backend()
        assert check_backend(probe=False).store == "elasticsearch"

    def test_ollama_needs_its_host_and_the_model_pulled(self, monkeypatch):
        pytest.importorskip("haystack_integrations.components.generators.ollama", reason="the `ollama` extra")
        index_dir = pytest.importorskip("tempfile").mkdtemp()
        index = f"{index_dir}/index.json"
        save_store(DOCUMENTS, index)
        monkeypatch.setenv("HAYSTACK_FUSION_LLM", "ollama")
        monkeypatch.setenv("HAYSTACK_FUSION_DOCUMENT_STORE", "memory")
        monkeypatch.setenv("HAYSTACK_FUSION_STORE", index)
        with pytest.raises(BackendSetupError, match="needs OLLAMA_HOST"):
            check_backend()
        with fake_ollama(["llama3.2:1b"]) as url:
            monkeypatch.setenv("OLLAMA_HOST", url)
            with pytest.raises(BackendSetupError, match=r"has no model 'qwen3:0\.6b'"):
                check_backend()
            monkeypatch.setenv("HAYSTACK_FUSION_MODEL", "llama3.2:1b")
            assert check_backend().model == "llama3.2:1b"

    @pytest.mark.parametrize("strategy", ["concatenation", "concat_pf", "sure"])
    def test_every_llm_call_of_a_served_pipeline_holds_a_call_slot(self, monkeypatch, tmp_path, strategy):
        """HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT bounds a server's direct generator calls, not only its fan-outs'."""
        index = tmp_path / "index.json"
        save_store(DOCUMENTS, index)
        monkeypatch.setenv("HAYSTACK_FUSION_LLM", "openai")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{free_port()}/v1")  # never called here
        monkeypatch.setenv("HAYSTACK_FUSION_DOCUMENT_STORE", "memory")
        monkeypatch.setenv("HAYSTACK_FUSION_STORE", str(index))

        wrapper = type("Wrapper", (StrategyPipelineWrapper,), {"strategy": strategy})()
        wrapper.setup()
        generators = [
            component
            if isinstance(component, CallLimitedChatGenerator)
            else getattr(component, "_chat_generator", component)
            for _, component in wrapper.pipeline.walk()
            if hasattr(component, "_chat_generator") or "ChatGenerator" in type(component).__name__
        ]
        assert generators
        assert all(isinstance(g, CallLimitedChatGenerator) for g in generators), generators

    def test_a_wrapper_refuses_to_set_up(self):
        class Wrapper(StrategyPipelineWrapper):
            strategy = "concat_pf"

        with pytest.raises(BackendSetupError, match="does not pick one for you"):
            Wrapper().setup()


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class fake_ollama:  # noqa: N801
    """A real HTTP server on 127.0.0.1 answering Ollama's `GET /api/tags` with the given model names."""

    def __init__(self, models: list[str]) -> None:
        body = json.dumps({"models": [{"name": name} for name in models]}).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200 if self.path == "/api/tags" else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)

    def __enter__(self) -> str:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
