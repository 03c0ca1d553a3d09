"""
A three-question dataset about capitals and a scripted LLM that answers it, shared by the evaluation tests.
"""

from __future__ import annotations

import time

from haystack import Document
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.dataclasses import ChatMessage
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.corpus import Question
from haystack_fusion.evaluation.datasets import EvalDataset
from haystack_fusion.evaluation.runner import EvalConfig, Evaluator

DOCUMENTS = [
    Document(content="Paris is the capital of France.", id="paris"),
    Document(content="Berlin is the capital of Germany.", id="berlin"),
    Document(content="Madrid is the capital of Spain.", id="madrid"),
    Document(content="Rome is the capital of Italy.", id="rome"),
    Document(content="Lisbon is the capital of Portugal.", id="lisbon"),
    Document(content="The Danube flows through Vienna.", id="danube"),
]


QUESTIONS = [
    Question("q1", "What is the capital of France?", ("Paris",), False, "paris"),
    Question("q2", "What is the capital of Germany?", ("Berlin",), False, "berlin"),
    Question("q3", "What is the capital of Mars?", (), True, None),
]


DATASET = EvalDataset(name="capitals", documents=DOCUMENTS, questions=QUESTIONS)


def capital_from_prompt(messages: list[ChatMessage]) -> str:
    """Answer the capital named in the prompt's first passage, "unknown" without passages."""
    text = messages[-1].text or ""
    context = text.split("Context:")[-1]
    for city in ("Paris", "Berlin", "Madrid", "Rome", "Lisbon"):
        if city in context:
            return city
    return "unknown"


def slow_paris(messages) -> str:
    """The reply of the SIGKILL test's generator, slow enough to kill the run part-way (the same in both runs, so
    that their fingerprints match)."""
    time.sleep(0.05)
    return "Paris"


def many_questions_evaluator(out: str, generator_factory) -> Evaluator:
    """40 questions over the capitals corpus, concatenation only (used by the SIGKILL test's child process)."""
    questions = [Question(f"q{i}", f"What is the capital of France, take {i}?", ("Paris",), False) for i in range(40)]
    dataset = EvalDataset("many", DOCUMENTS, questions)
    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    return Evaluator(
        dataset,
        EvalConfig(strategies=["concatenation"], top_ks=[2]),
        out,
        retriever_factory=lambda: InMemoryBM25Retriever(document_store=store),
        generator_factory=generator_factory,
    )


def make_evaluator(tmp_path, **config) -> Evaluator:
    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    return Evaluator(
        DATASET,
        EvalConfig(**{"strategies": ["concatenation", "post_fusion"], "top_ks": [2], **config}),
        tmp_path,
        retriever_factory=lambda: InMemoryBM25Retriever(document_store=store),
        generator_factory=lambda: MockChatGenerator(response_fn=capital_from_prompt),
    )


THREE_CAPITALS = [
    Document(content="Paris is the capital of France.", id="paris"),
    Document(content="Berlin is the capital of Germany.", id="berlin"),
    Document(content="Madrid is the capital of Spain.", id="madrid"),
]

THREE_CAPITALS_DATASET = EvalDataset(name="capitals", documents=THREE_CAPITALS, questions=QUESTIONS)
