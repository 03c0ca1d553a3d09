"""Dense and hybrid retrieval as single retriever components for any store: `run(query, top_k=None)` gives
`{"documents": [...]}`, at most `top_k` (None: the components' own), best first; `warm_up` loads the embedding model."""

from __future__ import annotations

from typing import Any

from haystack import Pipeline, default_from_dict, default_to_dict, super_component
from haystack.components.joiners import DocumentJoiner
from haystack.core.serialization import component_to_dict
from haystack.utils import deserialize_component_inplace


@super_component
class DenseRetriever:
    """
    A text embedder (the model the documents were embedded with) in front of an embedding retriever.

    ### Usage example
    ```python
    from haystack.components.retrievers.in_memory import InMemoryEmbeddingRetriever
    from haystack_fusion.embeddings import PackagedTextEmbedder
    from haystack_fusion.retrieval import DenseRetriever

    retriever = DenseRetriever(
        text_embedder=PackagedTextEmbedder(), embedding_retriever=InMemoryEmbeddingRetriever(store, top_k=5)
    )
    retriever.warm_up()
    print(retriever.run(query="Which river flows through the capital?", top_k=5)["documents"][0].content)
    ```
    """

    def __init__(self, *, text_embedder: Any, embedding_retriever: Any) -> None:
        self.text_embedder = text_embedder
        self.embedding_retriever = embedding_retriever
        pipeline = Pipeline()
        pipeline.add_component("text_embedder", text_embedder)
        pipeline.add_component("embedding_retriever", embedding_retriever)
        pipeline.connect("text_embedder.embedding", "embedding_retriever.query_embedding")
        self.pipeline = pipeline
        self.input_mapping = {"query": ["text_embedder.text"], "top_k": ["embedding_retriever.top_k"]}
        self.output_mapping = {"embedding_retriever.documents": "documents"}

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(
            self,
            text_embedder=component_to_dict(obj=self.text_embedder, name="text_embedder"),
            embedding_retriever=component_to_dict(obj=self.embedding_retriever, name="embedding_retriever"),
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DenseRetriever:
        for key in ("text_embedder", "embedding_retriever"):
            deserialize_component_inplace(data["init_parameters"], key=key)
        return default_from_dict(cls, data)


@super_component
class HybridRetriever:
    """
    BM25 and dense retrieval, top_k passages each, fused by Haystack's DocumentJoiner (`join_mode`, reciprocal rank
    fusion by default), the top_k best kept; `top_k` (>= 1, else ValueError) unless `run` gets one.

    ### Usage example
    ```python
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever, InMemoryEmbeddingRetriever
    from haystack_fusion.embeddings import PackagedTextEmbedder
    from haystack_fusion.retrieval import HybridRetriever

    retriever = HybridRetriever(
        bm25_retriever=InMemoryBM25Retriever(store),
        text_embedder=PackagedTextEmbedder(),
        embedding_retriever=InMemoryEmbeddingRetriever(store),
    )
    retriever.warm_up()
    print(retriever.run(query="Which river flows through the capital?", top_k=5)["documents"][0].content)
    ```
    """

    def __init__(
        self,
        *,
        bm25_retriever: Any,
        text_embedder: Any,
        embedding_retriever: Any,
        join_mode: str = "reciprocal_rank_fusion",
        top_k: int = 10,
    ) -> None:
        if top_k < 1:
            raise ValueError(f"`top_k` must be at least 1, got {top_k}")
        self.bm25_retriever = bm25_retriever
        self.text_embedder = text_embedder
        self.embedding_retriever = embedding_retriever
        self.join_mode = join_mode
        self.top_k = top_k
        joiner = DocumentJoiner(join_mode=join_mode, top_k=top_k)
        pipeline = Pipeline()
        pipeline.add_component("bm25_retriever", bm25_retriever)
        pipeline.add_component("text_embedder", text_embedder)
        pipeline.add_component("embedding_retriever", embedding_retriever)
        pipeline.add_component("joiner", joiner)
        pipeline.connect("text_embedder.embedding", "embedding_retriever.query_embedding")
        pipeline.connect("bm25_retriever.documents", "joiner.documents")
        pipeline.connect("embedding_retriever.documents", "joiner.documents")
        self.pipeline = pipeline
        self.input_mapping = {
            "query": ["bm25_retriever.query", "text_embedder.text"],
            "top_k": ["bm25_retriever.top_k", "embedding_retriever.top_k", "joiner.top_k"],
        }
        self.output_mapping = {"joiner.documents": "documents"}

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(
            self,
            bm25_retriever=component_to_dict(obj=self.bm25_retriever, name="bm25_retriever"),
            text_embedder=component_to_dict(obj=self.text_embedder, name="text_embedder"),
            embedding_retriever=component_to_dict(obj=self.embedding_retriever, name="embedding_retriever"),
            join_mode=self.join_mode,
            top_k=self.top_k,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HybridRetriever:
        for key in ("bm25_retriever", "text_embedder", "embedding_retriever"):
            deserialize_component_inplace(data["init_parameters"], key=key)
        return default_from_dict(cls, data)
