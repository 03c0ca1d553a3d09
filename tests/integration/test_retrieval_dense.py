"""Dense and hybrid retrieval on the real SQuAD 2.0 subset with the packaged embedding model (the `dense` extra)."""

from __future__ import annotations

import pytest
from haystack import Pipeline
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever, InMemoryEmbeddingRetriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

pytest.importorskip(
    "haystack_integrations.components.embedders.sentence_transformers",
    reason="the `dense` extra (pip install 'haystack-fusion[dense]') is not installed",
)

from haystack_fusion.embeddings import EMBEDDING_DIM, PackagedDocumentEmbedder, PackagedTextEmbedder
from haystack_fusion.retrieval import DenseRetriever, HybridRetriever
from haystack_fusion.strategies import build_pipeline, run_strategy


@pytest.fixture(scope="module")
def embedded_store(squad) -> InMemoryDocumentStore:
    embedder = PackagedDocumentEmbedder(progress_bar=False)
    embedder.warm_up()
    store = InMemoryDocumentStore()
    store.write_documents(embedder.run(documents=squad[0])["documents"])
    return store


def dense(store: InMemoryDocumentStore) -> DenseRetriever:
    return DenseRetriever(
        text_embedder=PackagedTextEmbedder(progress_bar=False), embedding_retriever=InMemoryEmbeddingRetriever(store)
    )


def hybrid(store: InMemoryDocumentStore) -> HybridRetriever:
    return HybridRetriever(
        bm25_retriever=InMemoryBM25Retriever(store),
        text_embedder=PackagedTextEmbedder(progress_bar=False),
        embedding_retriever=InMemoryEmbeddingRetriever(store),
    )


def test_packaged_embeddings_have_384_dimensions(embedded_store):
    document = embedded_store.filter_documents()[0]
    assert len(document.embedding) == EMBEDDING_DIM


@pytest.mark.parametrize("make", [dense, hybrid])
def test_retrieves_the_gold_paragraph(make, embedded_store, squad):
    """On the subset's first 20 answerable questions (full figures: research/benchmarks/retrieval_recall.py)."""
    retriever = make(embedded_store)
    retriever.warm_up()
    questions = [q for q in squad[1] if q.answers][:20]
    hits = 0
    for question in questions:
        documents = retriever.run(query=question.question, top_k=5)["documents"]
        assert len(documents) == 5
        hits += question.gold_document_id in [d.id for d in documents]
    assert hits >= 16


@pytest.mark.parametrize("make", [dense, hybrid])
def test_strategy_pipeline_with_dense_retrieval_round_trips_and_runs(make, embedded_store, questions):
    pipeline = build_pipeline(
        "concatenation", retriever=make(embedded_store), chat_generator=MockChatGenerator(responses=["France"])
    )
    assert Pipeline.loads(pipeline.dumps()) == pipeline
    assert "model: null" in pipeline.dumps()  # the packaged model, portable
    run = run_strategy(pipeline, questions[0].question, top_k=3)
    assert len(run.documents) == 3
    assert run.answer.data == "France"


def test_hybrid_rejects_an_unknown_join_mode(embedded_store):
    with pytest.raises(ValueError, match="join mode"):
        HybridRetriever(
            bm25_retriever=InMemoryBM25Retriever(embedded_store),
            text_embedder=PackagedTextEmbedder(),
            embedding_retriever=InMemoryEmbeddingRetriever(embedded_store),
            join_mode="nope",
        )
