"""`BackendConfig` and the factories that turn it into Haystack parts: document store, embedders, retriever, LLM."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

# Imported here, not in the factories: two threads importing a lazily loaded Haystack class at once can race
from haystack.components.embedders import OpenAIDocumentEmbedder, OpenAITextEmbedder
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever, InMemoryEmbeddingRetriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.backends.local import LOCAL_GENERATION_KWARGS, local_chat_generator
from haystack_fusion.retrieval import DenseRetriever, HybridRetriever
from haystack_fusion.settings import DEFAULT_INDEX_PATH, backend_values

_MISSING_EXTRAS: dict[str, ImportError] = {}  # the extras whose integration failed to import

try:
    from haystack_integrations.components.retrievers.elasticsearch import (
        ElasticsearchBM25Retriever,
        ElasticsearchEmbeddingRetriever,
    )
    from haystack_integrations.document_stores.elasticsearch import ElasticsearchDocumentStore
except ImportError as error:  # pragma: no cover - exercised only without the extra
    _MISSING_EXTRAS["elasticsearch"] = error

try:
    from haystack_integrations.components.generators.ollama import OllamaChatGenerator
except ImportError as error:  # pragma: no cover - exercised only without the extra
    _MISSING_EXTRAS["ollama"] = error

StoreKind = Literal["memory", "elasticsearch"]
RetrieverKind = Literal["bm25", "dense", "hybrid"]
EmbedderKind = Literal["packaged", "openai"]
LLMKind = Literal["local", "openai", "ollama"]

DEFAULT_MODELS = {"openai": "gpt-4o-mini", "ollama": "qwen3:0.6b"}  # each server LLM's model when none is given
DEFAULT_OPENAI_EMBEDDING_MODEL = "text-embedding-3-small"
OPENAI_LOGPROBS_KWARGS: dict[str, Any] = {"logprobs": True, "top_logprobs": 0}
"""What asks an OpenAI-compatible server for each token's log-probability: llama-cpp-python's server sends them only
with `top_logprobs` too, and OpenAI, vLLM and llama.cpp's servers all accept 0."""


@dataclass(frozen=True)
class BackendConfig:
    """
    Which document store, retriever, embedder and LLM a pipeline uses (Haystack integrations' components, which read
    secrets such as `OPENAI_API_KEY` from the environment, never from here).

    :param store: "memory" (Haystack's in-memory store, saved at `index_path`) or "elasticsearch".
    :param retriever: "bm25", "dense" or "hybrid" (both, reciprocal rank fusion).
    :param embedder: "packaged" (all-MiniLM-L6-v2, the `dense` extra) or "openai" (`text-embedding-3-small`).
    :param llm: "local" (the embedded GGUF model), "openai" (or any OpenAI-compatible server at `api_base_url`) or
        "ollama"; `model` None: `DEFAULT_MODELS`.
    :param timeout: Seconds an OpenAI or Ollama call may take; `max_retries`: of a failed OpenAI call.
    :param max_tokens: Completion budget of a call, in tokens (None: the LLM's own; the embedded model's is 128).
    :param logprobs: Ask an OpenAI-compatible LLM for token log-probabilities (the embedded model sends them always).
    :param llama_log: Print all of llama.cpp's log lines on stderr, not only its errors.
    :param fallback_llm: The LLM of the fallback rounds of `concat_pf`, `pf_concat` and `cascade` (None: `llm`), with
        `fallback_model` and `fallback_api_base_url` (`fallback_config`).
    :raises ValueError: For an unknown kind, a value out of range, a setting the LLM does not take, or a fallback
        setting without `fallback_llm`.
    """

    store: StoreKind = "memory"
    index_path: str = DEFAULT_INDEX_PATH
    elasticsearch_url: str = "http://localhost:9200"
    elasticsearch_index: str = "haystack_fusion"
    retriever: RetrieverKind = "bm25"
    embedder: EmbedderKind = "packaged"
    embedding_model: str | None = None
    llm: LLMKind = "local"
    model: str | None = None
    api_base_url: str | None = None
    ollama_url: str = "http://localhost:11434"
    top_k: int = 5
    timeout: float | None = None
    max_retries: int | None = None
    max_tokens: int | None = None
    logprobs: bool = False
    llama_log: bool = False
    fallback_llm: LLMKind | None = None
    fallback_model: str | None = None
    fallback_api_base_url: str | None = None

    def __post_init__(self) -> None:
        for name, allowed in (
            ("store", ("memory", "elasticsearch")),
            ("retriever", ("bm25", "dense", "hybrid")),
            ("embedder", ("packaged", "openai")),
            ("llm", ("local", "openai", "ollama")),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"`{name}` must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.top_k < 1:
            raise ValueError(f"`top_k` must be at least 1, got {self.top_k}")
        if self.llm == "local" and (self.timeout is not None or self.max_retries is not None):
            raise ValueError("`timeout` and `max_retries` apply to the openai and ollama LLMs, not the embedded one")
        if self.llm == "ollama" and self.max_retries is not None:
            raise ValueError("`max_retries` applies to the openai LLM: ollama-haystack's generator does not retry")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"`timeout` must be a positive number of seconds, got {self.timeout}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"`max_tokens` must be at least 1, got {self.max_tokens}")
        if self.logprobs and self.llm == "ollama":
            raise ValueError("`logprobs`: ollama-haystack's generator returns no token log-probabilities")
        if self.fallback_llm not in (None, "local", "openai", "ollama"):
            raise ValueError(f"`fallback_llm` must be one of local, openai, ollama, got {self.fallback_llm!r}")
        if self.fallback_llm is None and (self.fallback_model or self.fallback_api_base_url):
            raise ValueError(
                "`fallback_model` and `fallback_api_base_url` need `fallback_llm` (local, openai or ollama)"
            )
        if self.max_retries is not None and self.max_retries < 0:
            raise ValueError(f"`max_retries` must be at least 0, got {self.max_retries}")

    def llm_label(self) -> str:
        """E.g. "openai gpt-4o-mini at http://127.0.0.1:8000/v1"."""
        if self.llm == "local":
            return f"embedded llama.cpp {Path(self.model).name if self.model else 'packaged gemma3 270M (Q4_K_M)'}"
        model = self.model or DEFAULT_MODELS[self.llm]
        where = self.api_base_url if self.llm == "openai" else self.ollama_url
        return f"{self.llm} {model}" + (f" at {where}" if where else "")

    def llms_label(self) -> str:
        """E.g. "openai a at URL; fallback: openai b at URL"."""
        fallback = fallback_config(self)
        return self.llm_label() + (f"; fallback: {fallback.llm_label()}" if fallback else "")

    def retrieval_label(self) -> str:
        """E.g. "BM25 over in-memory store" or "hybrid ... over elasticsearch index 'x'"."""
        kind = {"bm25": "BM25", "dense": "dense", "hybrid": "hybrid (BM25 + dense, RRF)"}[self.retriever]
        where = "in-memory store" if self.store == "memory" else f"elasticsearch index {self.elasticsearch_index!r}"
        return f"{kind} over {where}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> BackendConfig:
        """From `env` (default `os.environ`; `settings.backend_values`), then the non-None `overrides`."""
        values = backend_values(cls.__dataclass_fields__, env)
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)


def document_store(config: BackendConfig) -> Any:
    """The saved in-memory store (empty without a file at `index_path`) or an ElasticsearchDocumentStore (connecting
    when used; ImportError without the `elasticsearch` extra)."""
    if config.store == "memory":
        path = Path(config.index_path).expanduser()
        return InMemoryDocumentStore.load_from_disk(str(path)) if path.is_file() else InMemoryDocumentStore()
    _require_extra("elasticsearch", "Elasticsearch")
    return ElasticsearchDocumentStore(hosts=config.elasticsearch_url, index=config.elasticsearch_index)


def _require_extra(extra: str, what: str) -> None:
    if extra in _MISSING_EXTRAS:
        raise ImportError(
            f"{what} needs the `{extra}` extra: pip install 'haystack-fusion[{extra}]'"
        ) from _MISSING_EXTRAS[extra]


_EMBEDDINGS_IMPORT_LOCK = threading.Lock()


def _packaged_embeddings() -> ModuleType:
    """`haystack_fusion.embeddings` (torch), imported on first use by one thread at a time."""
    with _EMBEDDINGS_IMPORT_LOCK:
        from haystack_fusion import embeddings
    return embeddings


def text_embedder(config: BackendConfig) -> Any:
    """The query embedder of dense and hybrid retrieval; ImportError for the packaged one without the `dense` extra."""
    if config.embedder == "openai":
        return OpenAITextEmbedder(model=config.embedding_model or DEFAULT_OPENAI_EMBEDDING_MODEL)
    return _packaged_embeddings().PackagedTextEmbedder(model=config.embedding_model, progress_bar=False)


def document_embedder(config: BackendConfig) -> Any:
    """The passage embedder of dense and hybrid indexing; ImportError as `text_embedder`."""
    if config.embedder == "openai":
        return OpenAIDocumentEmbedder(model=config.embedding_model or DEFAULT_OPENAI_EMBEDDING_MODEL)
    return _packaged_embeddings().PackagedDocumentEmbedder(model=config.embedding_model, progress_bar=False)


def retriever(config: BackendConfig, store: Any | None = None) -> Any:
    """The configured retriever (`query`, `top_k` in; `documents` out) over `store` (default `document_store(config)`);
    ValueError for dense or hybrid retrieval over passages without embeddings, ImportError without its extra."""
    store = document_store(config) if store is None else store
    if config.retriever != "bm25" and isinstance(store, InMemoryDocumentStore):
        documents = store.filter_documents()
        if documents and all(document.embedding is None for document in documents):
            raise ValueError(
                f"The passages in the in-memory store have no embeddings, so {config.retriever} retrieval finds "
                f"nothing: index them with `--retriever {config.retriever}` (or `index_documents` with this "
                "configuration)"
            )
    memory = config.store == "memory"
    if not memory:
        _require_extra("elasticsearch", "Elasticsearch")
    keyword_class: Any = InMemoryBM25Retriever if memory else ElasticsearchBM25Retriever
    keyword = keyword_class(document_store=store, top_k=config.top_k)
    if config.retriever == "bm25":
        return keyword
    embedding_class: Any = InMemoryEmbeddingRetriever if memory else ElasticsearchEmbeddingRetriever
    embedding = embedding_class(document_store=store, top_k=config.top_k)
    if config.retriever == "dense":
        return DenseRetriever(text_embedder=text_embedder(config), embedding_retriever=embedding)
    return HybridRetriever(
        bm25_retriever=keyword, text_embedder=text_embedder(config), embedding_retriever=embedding, top_k=config.top_k
    )


def fallback_config(config: BackendConfig) -> BackendConfig | None:
    """The fallback LLM's configuration (the settings it takes shared); None without `fallback_llm`."""
    if config.fallback_llm is None:
        return None
    kind = config.fallback_llm
    return replace(
        config,
        llm=kind,
        model=config.fallback_model,
        api_base_url=config.fallback_api_base_url,
        timeout=None if kind == "local" else config.timeout,
        max_retries=config.max_retries if kind == "openai" else None,
        logprobs=config.logprobs and kind == "openai",
        fallback_llm=None,
        fallback_model=None,
        fallback_api_base_url=None,
    )


SERVING_MAX_RETRIES = 1
"""Retries of a failed OpenAI call when serving and none are set (Haystack's: 5): a question makes several calls and
a chat client may retry too, so retries multiply; a failing server is the circuit breaker's."""


def fallback_chat_generator(config: BackendConfig, *, default_max_retries: int | None = None) -> Any | None:
    """`chat_generator` of `fallback_config`, or None without `fallback_llm`."""
    fallback = fallback_config(config)
    return None if fallback is None else chat_generator(fallback, default_max_retries=default_max_retries)


def chat_generator(config: BackendConfig, *, default_max_retries: int | None = None) -> Any:
    """The configured LLM, greedy (temperature 0) as in the papers; ImportError without its extra. OpenAI's retries:
    `config.max_retries`, `OPENAI_MAX_RETRIES`, else `default_max_retries` (None: `OpenAIChatGenerator`'s)."""
    budget = {} if config.max_tokens is None else {"max_tokens": config.max_tokens}
    retries = config.max_retries
    if retries is None and not os.environ.get("OPENAI_MAX_RETRIES"):
        retries = default_max_retries
    if config.llm == "local":
        kwargs: dict[str, Any] = {} if config.model is None else {"model": config.model}
        if config.llama_log:
            kwargs["model_kwargs"] = {"verbose": True}
        if budget:
            kwargs["generation_kwargs"] = {**LOCAL_GENERATION_KWARGS, **budget}
        return local_chat_generator(**kwargs)
    if config.llm == "openai":
        return OpenAIChatGenerator(
            model=config.model or DEFAULT_MODELS["openai"],
            api_base_url=config.api_base_url,
            generation_kwargs={"temperature": 0.0, **budget, **(OPENAI_LOGPROBS_KWARGS if config.logprobs else {})},
            timeout=config.timeout,
            max_retries=retries,
        )
    _require_extra("ollama", "Ollama")
    return OllamaChatGenerator(
        model=config.model or DEFAULT_MODELS["ollama"],
        url=config.ollama_url,
        generation_kwargs={"temperature": 0.0, **({"num_predict": config.max_tokens} if config.max_tokens else {})},
        timeout=int(config.timeout) if config.timeout is not None else 120,  # 120: the integration's default
    )
