"""Fixtures for integration tests: the real SQuAD 2.0 dev subset in ../shared and the embedded local model."""

from __future__ import annotations

import pytest
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.backends import LlamaCppChatGenerator, local_chat_generator
from haystack_fusion.corpus import SquadQuestion, default_squad_path, load_squad

TOP_K = 5


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def squad() -> tuple[list, list[SquadQuestion]]:
    path = default_squad_path()
    if path is None:
        pytest.skip("the SQuAD 2.0 dev subset is not at ../shared/data/squad2-dev-subset (nor $HAYSTACK_FUSION_SQUAD)")
    return load_squad(path)


@pytest.fixture(scope="session")
def store(squad) -> InMemoryDocumentStore:
    store = InMemoryDocumentStore()
    store.write_documents(squad[0])
    return store


@pytest.fixture
def retriever(store) -> InMemoryBM25Retriever:
    return InMemoryBM25Retriever(document_store=store, top_k=TOP_K)


@pytest.fixture
def llm():
    """A fresh embedded generator (they share one loaded model per process)."""
    if LlamaCppChatGenerator is None:
        pytest.skip("the `local` extra (llama-cpp-haystack, llama-cpp-python, the packaged model) is not installed")
    return local_chat_generator()


@pytest.fixture(scope="session")
def questions(squad) -> list[SquadQuestion]:
    """The first five questions of the subset: answerable ones from its first article."""
    return squad[1][:5]
