"""The saved in-memory index, a BM25 retriever YAML pipelines name by its path, and indexing into any store."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore
from haystack.document_stores.types import DuplicatePolicy
from haystack.utils import Secret

from haystack_fusion.backends.config import BackendConfig, document_embedder, document_store
from haystack_fusion.backends.errors import BackendError, missing_index_message
from haystack_fusion.settings import DEFAULT_INDEX_PATH


def save_store(documents: list[Document], path: str | Path) -> InMemoryDocumentStore:
    """Write passages (duplicate ids once) to a new in-memory store saved at `path` (JSON; parents created)."""
    store = InMemoryDocumentStore()
    store.write_documents(documents, policy=DuplicatePolicy.SKIP)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    store.save_to_disk(str(path))
    return store


def load_store(path: str | Path) -> InMemoryDocumentStore:
    """The store `save_store` (or `haystack-fusion index`) saved; FileNotFoundError saying how to make one."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"No saved index at {path}; create one with `haystack-fusion index`")
    return InMemoryDocumentStore.load_from_disk(str(path))


@component
class SavedInMemoryBM25Retriever:
    """
    Haystack's `InMemoryBM25Retriever` over the index saved at `index_path`, serialized as that path (`~` expanded
    where it runs); `warm_up` loads the index.

    ### Usage example
    ```python
    from haystack import Document
    from haystack_fusion.backends import SavedInMemoryBM25Retriever, save_store

    save_store([Document(content="The Loire flows through Orleans.")], "index.json")
    retriever = SavedInMemoryBM25Retriever(index_path="index.json", top_k=5)
    print(retriever.run(query="Which river flows through Orleans?")["documents"])
    ```
    """

    def __init__(self, index_path: str = DEFAULT_INDEX_PATH, top_k: int = 10, scale_score: bool = False) -> None:
        """`index_path`: the saved index (`haystack-fusion index --store PATH`); ValueError for `top_k` 0."""
        if top_k < 1:
            raise ValueError(f"`top_k` must be at least 1, got {top_k}")
        self.index_path, self.top_k, self.scale_score = index_path, top_k, scale_score
        self._retriever: InMemoryBM25Retriever | None = None
        self._lock = threading.Lock()

    def warm_up(self) -> None:
        """Load the saved index, once; FileNotFoundError without one."""
        with self._lock:
            if self._retriever is None:
                store = load_store(Path(self.index_path).expanduser())
                self._retriever = InMemoryBM25Retriever(store, top_k=self.top_k, scale_score=self.scale_score)

    @component.output_types(documents=list[Document])
    def run(
        self,
        query: str,
        filters: dict[str, Any] | None = None,
        top_k: int | None = None,
        scale_score: bool | None = None,
    ) -> dict[str, list[Document]]:
        """The `documents` that match `query` best (BM25); None settings: the init ones."""
        self.warm_up()
        assert self._retriever is not None
        return self._retriever.run(query=query, filters=filters, top_k=top_k, scale_score=scale_score)

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, index_path=self.index_path, top_k=self.top_k, scale_score=self.scale_score)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SavedInMemoryBM25Retriever:
        return default_from_dict(cls, data)


def check_document_store(config: BackendConfig) -> None:
    """Fail before a question is asked when the store has no passages: FileNotFoundError without the saved index,
    BackendError for a missing or empty Elasticsearch index (read with the official client: the integration's store
    would create it), ImportError without the extra, `elastic_transport.ConnectionError`."""
    if config.store == "memory":
        if not Path(config.index_path).expanduser().is_file():
            raise FileNotFoundError(f"No saved index at {config.index_path}; create one with `haystack-fusion index`")
        return
    document_store(config)  # ImportError naming the extra first; building it makes no connection
    from elasticsearch import Elasticsearch

    # the store's credentials, as elasticsearch-haystack reads them: an id and a key, or one encoded key, or none
    key = Secret.from_env_var("ELASTIC_API_KEY", strict=False).resolve_value()
    key_id = Secret.from_env_var("ELASTIC_API_KEY_ID", strict=False).resolve_value()
    client = Elasticsearch(hosts=config.elasticsearch_url, api_key=(key_id, key) if key_id and key else key or None)
    try:
        index = config.elasticsearch_index
        if not client.indices.exists(index=index) or not client.count(index=index)["count"]:
            raise BackendError(missing_index_message(config))
    finally:
        client.close()


def index_documents(
    config: BackendConfig, documents: list[Document], *, batch_size: int = 64, fresh: bool = False
) -> int:
    """Write passages to the configured store (`write_documents`), then save an in-memory store; returns its count.
    `fresh` (in-memory only): start empty, so the index holds exactly `documents`. ValueError for `batch_size` < 1."""
    store = InMemoryDocumentStore() if fresh and config.store == "memory" else document_store(config)
    write_documents(config, store, documents, batch_size=batch_size)
    if config.store == "memory":
        path = Path(config.index_path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        store.save_to_disk(str(path))
    return int(store.count_documents())


def write_documents(config: BackendConfig, store: Any, documents: list[Document], *, batch_size: int = 64) -> None:
    """Write passages to `store` in batches with a progress bar, embedded for dense or hybrid retrieval, the same id
    overwritten; nothing saved. ValueError for `batch_size` < 1."""
    from tqdm import tqdm

    if batch_size < 1:
        raise ValueError(f"`batch_size` must be at least 1, got {batch_size}")
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
