"""Ollama for real: strategies through OllamaChatGenerator on the SQuAD 2.0 subset.

Runs when `OLLAMA_HOST` points at an Ollama server that has the model `OLLAMA_MODEL` (default `qwen3:0.6b`) pulled;
skipped with that reason otherwise: Ollama cannot run on the project's own machines.
"""

from __future__ import annotations

import os

import pytest

from haystack_fusion.backends import BackendConfig, chat_generator
from haystack_fusion.strategies import build_pipeline, run_strategy

pytestmark = [
    pytest.mark.ollama,
    pytest.mark.skipif(not os.environ.get("OLLAMA_HOST"), reason="OLLAMA_HOST is not set"),
]
pytest.importorskip("haystack_integrations.components.generators.ollama", reason="the `ollama` extra")


@pytest.mark.parametrize("name", ["concat_pf", "sure", "chain_of_note"])
def test_strategy_answers_through_ollama(name, retriever, questions):
    config = BackendConfig.from_env(llm="ollama", model=os.environ.get("OLLAMA_MODEL"))
    pipeline = build_pipeline(name, retriever=retriever, chat_generator=chat_generator(config))
    for question in questions[:2]:
        run = run_strategy(pipeline, question.question)
        assert run.answer_text().strip()  # an answer, or what the answer checks rejected and why
        assert run.usage.failed_calls == 0
