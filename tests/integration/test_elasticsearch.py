"""Elasticsearch for real: index the SQuAD 2.0 subset and answer with BM25, dense and hybrid retrieval.

Runs when `ELASTICSEARCH_URL` points at an Elasticsearch 8.x server (API key, if any, in `ELASTIC_API_KEY`); skipped
with that reason otherwise: Elasticsearch cannot run on the project's own machines.
"""

from __future__ import annotations

import os
import uuid

import pytest

from haystack_fusion.backends import BackendConfig, document_store, index_documents, retriever
from haystack_fusion.strategies import build_pipeline, run_strategy

pytestmark = [
    pytest.mark.elasticsearch,
    pytest.mark.skipif(not os.environ.get("ELASTICSEARCH_URL"), reason="ELASTICSEARCH_URL is not set"),
]
pytest.importorskip("haystack_integrations.document_stores.elasticsearch", reason="the `elasticsearch` extra")


@pytest.fixture(scope="module")
def index_name(squad):
    name = f"haystack_fusion_test_{uuid.uuid4().hex[:8]}"
    config = BackendConfig.from_env(store="elasticsearch", elasticsearch_index=name, retriever="hybrid")
    assert index_documents(config, squad[0], batch_size=32) == len(squad[0])
    assert index_documents(config, squad[0], batch_size=32) == len(squad[0])  # idempotent
    yield name
    document_store(config).client.indices.delete(index=name)


@pytest.mark.parametrize("kind", ["bm25", "dense", "hybrid"])
def test_answers_with_each_retriever(kind, index_name, llm, questions):
    config = BackendConfig.from_env(store="elasticsearch", elasticsearch_index=index_name, retriever=kind)
    pipeline = build_pipeline("concat_pf", retriever=retriever(config), chat_generator=llm)
    hits = 0
    for question in questions:
        run = run_strategy(pipeline, question.question)
        assert len(run.documents) == config.top_k
        assert run.answer_text().strip()  # an answer, or what the answer checks rejected and why
        hits += question.gold_document_id in [d.id for d in run.documents]
    assert hits >= len(questions) - 1
