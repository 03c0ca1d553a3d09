"""
Every LLM call of the fan-out is a `haystack.chat_generator.run` span under its component's span, traced through
Haystack's OpenTelemetryTracer into the real OpenTelemetry SDK (an in-memory exporter).
"""

import asyncio
from typing import Any

import pytest
from haystack import tracing
from haystack.components.generators.chat import MockChatGenerator
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from haystack_fusion.llm import INPUT_TOKENS_TAG, OUTPUT_TOKENS_TAG, run_chat_calls, run_chat_calls_async
from tests.spans import LLM_SPAN, llm_spans_by_component, span_tree
from tests.unit.scripted_calls import failing_sync_generator, prompts_of
from tests.unit.scripted_pipelines import QUERY, answer_from_context, make_pipeline


@pytest.fixture
def content_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing.tracer, "is_content_tracing_enabled", True)


def sure_inputs() -> dict[str, Any]:
    return {"retriever": {"query": QUERY}, "summarizer": {"query": QUERY}, "verifier": {"query": QUERY}}


class TestSureTrace:
    """K = 2 candidates: 1 candidate call + 2 summaries (summarizer), 2 validity + 2 ranking calls (verifier)."""

    def check(self, exporter: InMemorySpanExporter, outputs: dict[str, Any]) -> None:
        finished = exporter.get_finished_spans()
        print(span_tree(finished))  # the report's span tree: pytest -s shows it
        grouped = llm_spans_by_component(finished)
        assert {name: len(group) for name, group in grouped.items()} == {"summarizer": 3, "verifier": 4}
        assert len({span.context.trace_id for span in finished}) == 1
        for name, group in grouped.items():
            for span in group:
                assert span.attributes["haystack.component.name"] == "chat_generator"
                assert span.attributes["haystack.component.type"] == "MockChatGenerator"
                assert span.attributes[INPUT_TOKENS_TAG] > 0
                assert span.attributes[OUTPUT_TOKENS_TAG] > 0
                assert span.status.status_code != StatusCode.ERROR
            # the spans' token tags add up to the usage the component reports in its answers' meta
            usage = (
                outputs[name]["meta"]["usage"] if name == "summarizer" else outputs[name]["answers"][0].meta["usage"]
            )
            assert sum(span.attributes[INPUT_TOKENS_TAG] for span in group) == usage["prompt_tokens"]
            assert sum(span.attributes[OUTPUT_TOKENS_TAG] for span in group) == usage["completion_tokens"]

    def test_sync_pipeline(self, spans):
        pipeline = make_pipeline("sure", MockChatGenerator(response_fn=answer_from_context), num_candidates=2)
        outputs = pipeline.run(sure_inputs(), include_outputs_from={"summarizer", "verifier"})
        self.check(spans, outputs)

    async def test_sync_pipeline_inside_a_running_loop(self, spans):
        """The fan-out's private loop then runs in another thread: the context still carries the component's span."""
        pipeline = make_pipeline("sure", MockChatGenerator(response_fn=answer_from_context), num_candidates=2)
        outputs = pipeline.run(sure_inputs(), include_outputs_from={"summarizer", "verifier"})
        self.check(spans, outputs)

    async def test_async_pipeline(self, spans):
        pipeline = make_pipeline("sure", MockChatGenerator(response_fn=answer_from_context), num_candidates=2)
        outputs = await pipeline.run_async(sure_inputs(), include_outputs_from={"summarizer", "verifier"})
        self.check(spans, outputs)


class TestCallSpans:
    def test_content_is_traced_only_when_content_tracing_is_on(self, spans):
        run_chat_calls(MockChatGenerator(response_fn=answer_from_context), prompts_of(["a"]), max_concurrency=1)
        (span,) = spans.get_finished_spans()
        assert "haystack.component.input" not in span.attributes
        assert "haystack.component.output" not in span.attributes
        assert span.attributes[INPUT_TOKENS_TAG] == 1

    def test_content_tracing(self, spans, content_tracing):
        run_chat_calls(
            MockChatGenerator(responses=["Paris"]),
            prompts_of(["Capital of France?"]),
            max_concurrency=1,
            generation_kwargs={"temperature": 0.5},
        )
        (span,) = spans.get_finished_spans()
        assert "Capital of France?" in span.attributes["haystack.component.input"]
        assert "temperature" in span.attributes["haystack.component.input"]
        assert "Paris" in span.attributes["haystack.component.output"]
        assert (span.attributes[INPUT_TOKENS_TAG], span.attributes[OUTPUT_TOKENS_TAG]) == (3, 1)

    def test_a_failed_call_is_an_error_span(self, spans):
        result = run_chat_calls(failing_sync_generator(), prompts_of(["a", "boom"]), max_concurrency=2)
        assert result.failures[0].index == 1
        statuses = sorted(span.status.status_code.name for span in spans.get_finished_spans())
        assert statuses == ["ERROR", "UNSET"]

    async def test_async_calls_are_children_of_the_current_span(self, spans):
        with tracing.tracer.trace("parent"):
            await run_chat_calls_async(MockChatGenerator(), prompts_of(["a", "b", "c"]), max_concurrency=2)
            await asyncio.sleep(0)
        finished = spans.get_finished_spans()
        (parent,) = [span for span in finished if span.name == "parent"]
        children = [span for span in finished if span.name == LLM_SPAN]
        assert len(children) == 3
        assert all(span.parent.span_id == parent.context.span_id for span in children)
