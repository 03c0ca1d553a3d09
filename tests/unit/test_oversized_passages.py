"""
A passage far larger than the model's context is trimmed, and only the passage: for every registered strategy, the
prompts of a run over oversized passages are exactly the prompts of a run over those passages already cut to the
budget (`DEFAULT_MAX_PASSAGE_CHARS`), so the instructions, examples and delimiters are intact and every prompt stays
bounded (issue 15, item 7; extends `test_prompts.TestFormatPassages.test_trimming_leaves_instructions_untouched`,
which checks the Figure 7 template alone).
"""

from __future__ import annotations

from typing import Any

import pytest
from haystack import Document, component

from haystack_fusion.prompts import DEFAULT_MAX_PASSAGE_CHARS, format_passages
from haystack_fusion.strategies import STRATEGIES, build_pipeline, run_strategy
from tests.unit.scripted_pipelines import QUERY, recording_generator

FILLER = "filler " * 100_000
"""700,000 characters: about 100,000 tokens, beyond any model this package runs (the embedded one reads 8,192)."""

OVERSIZED = [
    Document(id="paris", content="Paris is the capital and most populous city of France. " + FILLER),
    Document(id="lyon", content="Lyon is the third-largest city of France. " + FILLER),
    Document(id="everest", content="Mount Everest is the highest mountain on Earth."),
]


def cut_to_budget(document: Document) -> Document:
    """The document with the text a prompt shows of it: what `format_passages` keeps within the default budget."""
    return Document(id=document.id, content=format_passages([document]).splitlines()[1], meta=document.meta)


@component
class FixedRetriever:
    """Returns the same documents in the same order for every query (BM25 would rank cut and uncut texts apart)."""

    def __init__(self, documents: list[Document]) -> None:
        self.documents = documents

    @component.output_types(documents=list[Document])
    def run(self, query: str, top_k: int | None = None) -> dict[str, Any]:
        return {"documents": list(self.documents[:top_k] if top_k else self.documents)}


def prompts_of(name: str, documents: list[Document]) -> list[str]:
    generator = recording_generator()
    pipeline = build_pipeline(name, retriever=FixedRetriever(documents), chat_generator=generator)
    run_strategy(name, pipeline, QUERY)
    return sorted(generator.prompts)  # fan-out calls may arrive in any order


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_oversized_passages_are_trimmed_with_the_instructions_intact(name):
    trimmed = [cut_to_budget(document) for document in OVERSIZED]
    assert len(trimmed[0].content) <= DEFAULT_MAX_PASSAGE_CHARS < len(OVERSIZED[0].content)

    oversized_prompts = prompts_of(name, OVERSIZED)

    assert oversized_prompts, "the strategy made no LLM call"
    assert oversized_prompts == prompts_of(name, trimmed)
    budget = len(OVERSIZED) * (DEFAULT_MAX_PASSAGE_CHARS + 100) + 8_000  # passages, delimiters, instructions
    assert max(len(prompt) for prompt in oversized_prompts) < budget
    assert all(FILLER[:50_000] not in prompt for prompt in oversized_prompts)
