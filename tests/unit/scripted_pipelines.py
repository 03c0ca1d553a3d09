"""
A scripted LLM that answers every strategy's prompts about five passages (the capital of France is Paris), and the
BM25 pipelines around it: the double the strategy, tracing and passage tests share.
"""

import re
from typing import Any

from haystack import Document, Pipeline
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.dataclasses import ChatMessage
from haystack.document_stores.in_memory import InMemoryDocumentStore

import haystack_fusion  # noqa: F401  (allowlists the package for deserialization)
from haystack_fusion.prompts.chain_of_note import ANSWER_LEAD
from haystack_fusion.strategies import (
    build_pipeline,
)
from haystack_fusion.testing import ScriptedChatGenerator

QUERY = "What is the capital of France?"


DOCUMENTS = [
    Document(id="paris", content="Paris is the capital and most populous city of France."),
    Document(id="eiffel", content="The Eiffel Tower is a wrought-iron tower in Paris, France."),
    Document(id="lyon", content="Lyon is the third-largest city of France."),
    Document(id="berlin", content="Berlin is the capital and largest city of Germany."),
    Document(id="everest", content="Mount Everest is the highest mountain on Earth."),
]


ANSWERS_BY_PASSAGE = {
    "Paris is the capital": "Paris",
    "The Eiffel Tower": "Paris",
    "Lyon is": "Lyon",
}


PASSAGE_BLOCK = re.compile(r'<passage key="([0-9a-f]+)">\n(.*?)\n</passage key="\1">', re.DOTALL)


DISTILLER_START = "Given the relevant background contexts and the candidate answers"


COT_END = "Rationale: Let's think step by step."


def live_passages(prompt: str) -> list[str]:
    """The passages of the live context: after the last "Context:" (Figures 8-9 also show demo passages)."""
    return [match.group(2) for match in PASSAGE_BLOCK.finditer(prompt.rsplit("Context:", 1)[-1])]


def answer_of(passage: str) -> str:
    for start, answer in ANSWERS_BY_PASSAGE.items():
        if passage.startswith(start):
            return answer
    return "unknown"


def sure_reply(prompt: str) -> str | None:
    """Replies to Kim et al.'s prompts (None for Liu et al.'s): candidates, summaries, validity, ranking, answers."""
    capital = "Paris is the capital" in prompt
    if prompt.startswith("Below are"):  # Listing 6
        return "(a) Paris, (b) Lyon" if capital else "unknown"
    if "Your job is to act as a professional writer." in prompt:  # Listings 7 and 11
        if "Prediction: (b)" in prompt:
            return "Lyon is a French city. [DONE]"
        return "Paris is the capital of France. [DONE]" if capital else "Nothing relevant. [DONE]"
    if prompt.endswith("Choices: [True, False]. Answer:"):  # Listing 8
        return "True" if "Prediction: Paris" in prompt and capital else "False"
    if "Target Question:" in prompt:  # Listing 9
        return "Passage 1" if "capital" in prompt.split("Passage 2: ")[0] else "Passage 2"
    if "Task description: predict the answer" in prompt:  # Listings 10 and 12, Table 3 baselines
        return " Paris." if capital else "unknown"
    return con_reply(prompt)


def con_reply(prompt: str) -> str | None:
    """Replies to Yu et al.'s prompts: single-call notes, per-document notes, synthesis."""
    live = prompt.rsplit("Question: ", 1)[-1]
    if prompt.endswith("Reading notes:"):
        if "Paris is the capital" in live:
            return f" Passage #1 says Paris is the capital of France. {ANSWER_LEAD} Paris."
        return f" Passage #1 is not relevant. {ANSWER_LEAD} unknown"
    if prompt.endswith("Reading note:"):
        if "Paris is the capital" in live:
            return " The passage says Paris is the capital of France.\nRelevance: (a) answers directly"
        return " The passage is not relevant.\nRelevance: (c) irrelevant"
    if prompt.endswith(ANSWER_LEAD):
        return " Paris." if "(answers directly)" in live else " unknown"
    return None


def answer_from_context(messages: list[ChatMessage]) -> str:
    """A response_fn for every prompt: "Paris" when a passage of the context says Paris is the capital."""
    prompt = messages[-1].text
    sure = sure_reply(prompt)
    if sure is not None:
        return sure
    passages = live_passages(prompt)
    if len(passages) == 1:
        answer = answer_of(passages[0])
    else:
        answer = "Paris" if any(p.startswith("Paris is the capital") for p in passages) else "unknown"
    if prompt.endswith(COT_END):
        return f" Source 1 answers the question.\nAnswer: {answer}"
    if prompt.startswith(DISTILLER_START):
        return f"(a) {answer} (b) something else" if answer != "unknown" else "unknown"
    return answer


def unknown_for_concatenation(messages: list[ChatMessage]) -> str:
    """A response_fn: "unknown" for prompts with more than one passage, the passage's answer for one passage."""
    prompt = messages[-1].text
    if prompt.count("<passage ") > 1:
        return "unknown"
    return answer_of(live_passages(prompt)[0])


def reply_from_context(prompt: str) -> str:
    return answer_from_context([ChatMessage.from_user(prompt)])


def recording_generator() -> ScriptedChatGenerator:
    """Answers with `answer_from_context` and records every prompt (thread-safe: the voter fans out in threads)."""
    return ScriptedChatGenerator(reply_from_context)


def concatenation_fails(passages: tuple[str, ...] = ()) -> ScriptedChatGenerator:
    """
    Raises on every concatenation call (a prompt of more than one passage), and on the calls whose prompt holds one of
    `passages` (texts); answers the other prompts with `answer_from_context`.
    """
    return ScriptedChatGenerator(
        reply_from_context,
        fail_on=lambda prompt: prompt.count("<passage ") > 1 or any(passage in prompt for passage in passages),
    )


def make_store() -> InMemoryDocumentStore:
    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    return store


def make_pipeline(name: str, chat_generator: Any, top_k: int = 3, **config: Any) -> Pipeline:
    retriever = InMemoryBM25Retriever(make_store(), top_k=top_k)
    return build_pipeline(name, retriever=retriever, chat_generator=chat_generator, **config)


ACID_PASSAGES = [Document(content=f"Passage {i} about the acid.") for i in range(3)]
"""Three passages for overlap voting: the replies, not the passages, carry the answers."""


def acid_retriever() -> InMemoryBM25Retriever:
    """BM25 top-3 over `ACID_PASSAGES`."""
    store = InMemoryDocumentStore()
    store.write_documents(ACID_PASSAGES)
    return InMemoryBM25Retriever(document_store=store, top_k=3)
