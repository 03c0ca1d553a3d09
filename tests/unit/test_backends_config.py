"""BackendConfig and its factories: the right Haystack components for each kind, no server needed."""

import subprocess
import sys

import pytest
from haystack import Pipeline
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

import haystack_fusion.backends.config as backend_config
from haystack_fusion.backends import BackendConfig, chat_generator, document_store, retriever
from haystack_fusion.strategies import build_pipeline

es = pytest.importorskip("haystack_integrations.document_stores.elasticsearch", reason="the `elasticsearch` extra")
ollama = pytest.importorskip("haystack_integrations.components.generators.ollama", reason="the `ollama` extra")


@pytest.fixture(autouse=True)
def _keys(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")


def test_defaults_are_the_embedded_stack(tmp_path):
    config = BackendConfig(index_path=str(tmp_path / "none.json"))
    assert isinstance(document_store(config), InMemoryDocumentStore)
    assert isinstance(retriever(config), InMemoryBM25Retriever)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"store": "sql"}, "store"),
        ({"retriever": "magic"}, "retriever"),
        ({"llm": "gpt"}, "llm"),
        ({"top_k": 0}, "top_k"),
        ({"llm": "ollama", "logprobs": True}, "logprobs"),
    ],
)
def test_invalid(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BackendConfig(**kwargs)


def test_from_env(monkeypatch):
    monkeypatch.setenv("ELASTICSEARCH_URL", "http://es:9200")
    monkeypatch.setenv("OLLAMA_HOST", "http://ollama:11434")
    config = BackendConfig.from_env(store="elasticsearch", llm=None)
    assert (config.store, config.elasticsearch_url, config.ollama_url, config.llm) == (
        "elasticsearch",
        "http://es:9200",
        "http://ollama:11434",
        "local",
    )


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("bm25", "ElasticsearchBM25Retriever"), ("dense", "DenseRetriever"), ("hybrid", "HybridRetriever")],
)
def test_elasticsearch_retrievers(kind, expected):
    pytest.importorskip("haystack_integrations.components.embedders.sentence_transformers", reason="the `dense` extra")
    config = BackendConfig(store="elasticsearch", retriever=kind, top_k=7)
    component = retriever(config)
    assert type(component).__name__ == expected
    assert isinstance(document_store(config), es.ElasticsearchDocumentStore)


@pytest.mark.parametrize("llm", ["openai", "ollama"])
def test_hosted_and_server_llms(llm):
    generator = chat_generator(BackendConfig(llm=llm, api_base_url="http://127.0.0.1:8000/v1"))
    expected = OpenAIChatGenerator if llm == "openai" else ollama.OllamaChatGenerator
    assert isinstance(generator, expected)
    assert generator.generation_kwargs["temperature"] == 0.0


@pytest.mark.parametrize("llm", ["openai", "ollama"])
@pytest.mark.parametrize("kind", ["bm25", "hybrid"])
def test_production_pipelines_round_trip_without_secrets(llm, kind):
    pytest.importorskip("haystack_integrations.components.embedders.sentence_transformers", reason="the `dense` extra")
    config = BackendConfig(store="elasticsearch", retriever=kind, llm=llm)
    pipeline = build_pipeline("concat_pf", retriever=retriever(config), chat_generator=chat_generator(config))
    text = pipeline.dumps()
    assert "sk-test-not-a-real-key" not in text
    assert Pipeline.loads(text) == pipeline


def test_dense_over_an_index_without_embeddings_is_a_clear_error(tmp_path):
    from haystack import Document

    from haystack_fusion.backends import save_store

    path = tmp_path / "bm25.json"
    save_store([Document(content="Rollo was a Viking leader.")], path)
    with pytest.raises(ValueError, match="no embeddings"):
        retriever(BackendConfig(index_path=str(path), retriever="dense"))
    assert isinstance(retriever(BackendConfig(index_path=str(path))), InMemoryBM25Retriever)


def test_openai_logprobs_on_request(monkeypatch):
    assert "logprobs" not in chat_generator(BackendConfig(llm="openai")).generation_kwargs
    assert chat_generator(BackendConfig(llm="openai", logprobs=True)).generation_kwargs["logprobs"] is True
    monkeypatch.setenv("HAYSTACK_FUSION_LOGPROBS", "true")
    assert BackendConfig.from_env(llm="openai").logprobs is True


def test_a_default_for_retries_yields_to_the_settings(monkeypatch):
    """Serving's default retries (`SERVING_MAX_RETRIES`) apply only when neither `max_retries` nor the openai
    client's `OPENAI_MAX_RETRIES` is set."""
    monkeypatch.delenv("OPENAI_MAX_RETRIES", raising=False)
    config = BackendConfig(llm="openai", fallback_llm="openai", fallback_model="strong")
    assert chat_generator(config).max_retries is None  # OpenAIChatGenerator's own default
    assert chat_generator(config, default_max_retries=1).max_retries == 1
    assert backend_config.fallback_chat_generator(config, default_max_retries=1).max_retries == 1
    assert chat_generator(BackendConfig(llm="openai", max_retries=3), default_max_retries=1).max_retries == 3
    monkeypatch.setenv("OPENAI_MAX_RETRIES", "4")
    assert chat_generator(config, default_max_retries=1).max_retries is None


def test_llama_log_on_request(monkeypatch):
    pytest.importorskip("llama_cpp", reason="the `local` extra")
    assert not chat_generator(BackendConfig()).model_kwargs.get("verbose")
    assert chat_generator(BackendConfig(llama_log=True)).model_kwargs["verbose"] is True
    assert "verbose" not in (chat_generator(BackendConfig(llm="openai", llama_log=True)).generation_kwargs or {})
    monkeypatch.setenv("HAYSTACK_FUSION_LLAMA_LOG", "1")
    assert BackendConfig.from_env().llama_log is True
    monkeypatch.setenv("HAYSTACK_FUSION_LLAMA_LOG", "0")
    assert BackendConfig.from_env().llama_log is False


@pytest.mark.parametrize(
    ("extra", "config", "factory"),
    [
        ("elasticsearch", BackendConfig(store="elasticsearch"), document_store),
        ("elasticsearch", BackendConfig(store="elasticsearch"), lambda config: retriever(config, store=object())),
        ("ollama", BackendConfig(llm="ollama"), chat_generator),
    ],
)
def test_a_missing_extra_is_named_when_its_backend_is_asked_for(monkeypatch, extra, config, factory):
    """The integrations are imported with the module; one that failed to import is reported when it is used."""
    cause = ImportError(f"No module named '{extra}'")
    monkeypatch.setitem(backend_config._MISSING_EXTRAS, extra, cause)
    with pytest.raises(
        ImportError, match=rf"needs the `{extra}` extra: pip install 'haystack-fusion\[{extra}\]'"
    ) as raised:
        factory(config)
    assert raised.value.__cause__ is cause


def test_the_backends_import_without_the_local_extra():
    # llama-cpp-python missing: the OpenAI and Ollama backends are still usable, the embedded names are None
    code = (
        "import sys; sys.modules['llama_cpp'] = None\n"
        "from haystack_fusion.backends import LocalChatGenerator, local_chat_generator\n"
        "assert LocalChatGenerator is None\n"
        "try:\n    local_chat_generator()\nexcept ImportError as error:\n    print(error)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "needs the `local` extra" in out.stdout
