"""Fixtures for integration tests: the real SQuAD 2.0 dev subset ($HAYSTACK_FUSION_SQUAD) and the embedded model."""

from __future__ import annotations

import os

import pytest
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.backends import LocalChatGenerator, local_chat_generator
from haystack_fusion.corpus import Question, default_squad_path, load_squad
from haystack_fusion.settings import SQUAD_VARIABLE

TOP_K = 5


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def squad() -> tuple[list, list[Question]]:
    if not os.environ.get(SQUAD_VARIABLE):  # tests/conftest.py sets it to ../shared's subset when that is there
        pytest.skip("$HAYSTACK_FUSION_SQUAD is unset and ../shared/data/squad2-dev-subset is not there")
    return load_squad(default_squad_path())


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
    if LocalChatGenerator is None:
        pytest.skip("the `local` extra (llama-cpp-python, the packaged model) is not installed")
    return local_chat_generator()


@pytest.fixture(scope="session")
def questions(squad) -> list[Question]:
    """The first five questions of the subset: answerable ones from its first article."""
    return squad[1][:5]


def local_serving_env(index) -> dict[str, str]:
    """The environment of a Hayhooks server on the embedded model over the saved in-memory index at `index`."""
    return {
        **os.environ,
        "HAYSTACK_FUSION_STORE": str(index),
        "HAYSTACK_FUSION_DOCUMENT_STORE": "memory",
        "HAYSTACK_FUSION_LLM": "local",
        "HAYSTACK_DESERIALIZATION_ALLOWLIST": "haystack_fusion",
    }


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_ready(ready, process, log_path, *, seconds: float = 180, what: str = "the server") -> None:
    """
    Poll `ready()` once a second until it returns True; fail the test with the log's tail if the process exits or
    `seconds` pass first. `ready` may raise (connection refused while starting): that counts as not ready.
    """
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except Exception:
            pass
        if process.poll() is not None:
            pytest.fail(f"{what} exited: {log_path.read_text()[-2000:]}")
        time.sleep(1)
    pytest.fail(f"{what} was not ready after {seconds} s: {log_path.read_text()[-2000:]}")


def stop(process) -> None:
    """Terminate a server process, killing it if it does not exit within 10 seconds."""
    import subprocess

    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
