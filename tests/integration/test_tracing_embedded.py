"""A `sure` run on the embedded model, traced with the real OpenTelemetry SDK: one span per LLM call, real tokens."""

from __future__ import annotations

from haystack_fusion.llm import INPUT_TOKENS_TAG, OUTPUT_TOKENS_TAG
from haystack_fusion.strategies import build_pipeline, run_strategy
from tests.spans import llm_spans_by_component, span_tree


def test_sure_run_traces_every_llm_call(spans, retriever, llm, questions):
    pipeline = build_pipeline("sure", retriever=retriever, chat_generator=llm, few_shot=True)
    run = run_strategy(pipeline, questions[0].question)
    finished = spans.get_finished_spans()
    print(span_tree(finished))
    grouped = llm_spans_by_component(finished)
    llm_spans = [span for group in grouped.values() for span in group]
    assert len(llm_spans) == run.usage.calls >= 1
    assert set(grouped) <= {"summarizer", "verifier"}
    assert {span.attributes["haystack.component.type"] for span in llm_spans} == {type(llm).__name__}
    # the spans carry the tokens the model reported, and add up to the run's usage
    assert all(span.attributes[INPUT_TOKENS_TAG] > 0 for span in llm_spans)
    assert sum(span.attributes[INPUT_TOKENS_TAG] for span in llm_spans) == run.usage.prompt_tokens
    assert sum(span.attributes[OUTPUT_TOKENS_TAG] for span in llm_spans) == run.usage.completion_tokens
