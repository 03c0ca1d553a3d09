"""Every strategy end to end: the embedded llama.cpp model, BM25 over the real SQuAD 2.0 dev subset."""

from __future__ import annotations

import pytest
from haystack import Pipeline

from haystack_fusion.strategies import STRATEGIES, build_pipeline, run_strategy

from .conftest import TOP_K

EXPECTED_CALLS = {
    "concatenation": {1},
    "post_fusion": {TOP_K},
    "pruning": {1},
    "summary_cot": {1},
    "concat_pf": {1, 1 + TOP_K},
    "pf_concat": {1 + TOP_K},
}


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_strategy_answers_five_real_questions(name, retriever, llm, questions):
    pipeline = build_pipeline(name, retriever=retriever, chat_generator=llm)
    for question in questions:
        run = run_strategy(name, pipeline, question.question)
        assert isinstance(run.answer.data, str)
        assert run.answer.data.strip()
        assert len(run.documents) == TOP_K
        assert run.usage["calls"] in EXPECTED_CALLS[name]
        assert run.usage["failed_calls"] == 0
        assert run.usage["prompt_tokens"] > 0
        assert run.usage["completion_tokens"] > 0
        print(f"{name}: {question.question!r} -> {run.answer.data!r} (gold {question.answers})")


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_yaml_round_trip_with_the_embedded_generator(name, retriever, llm):
    pipeline = build_pipeline(name, retriever=retriever, chat_generator=llm)
    assert Pipeline.loads(pipeline.dumps()) == pipeline


def test_concat_pf_makes_one_call_when_the_first_answer_is_known(retriever, llm, questions):
    pipeline = build_pipeline("concat_pf", retriever=retriever, chat_generator=llm)
    run = run_strategy("concat_pf", pipeline, questions[0].question)
    assert run.evidence["fallback"] is False
    assert run.usage["calls"] == 1
    assert run.usage["rounds"] == 1
