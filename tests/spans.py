"""
Reading the spans Haystack traced into OpenTelemetry (the `spans` fixture of `tests/conftest.py`): the LLM spans of
each component and the span tree, for the unit and integration tracing tests.
"""

from opentelemetry.sdk.trace import ReadableSpan

from haystack_fusion.llm import INPUT_TOKENS_TAG, OUTPUT_TOKENS_TAG

LLM_SPAN = "haystack.chat_generator.run"


COMPONENT_SPAN = "haystack.component.run"


def llm_spans_by_component(finished: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    """The LLM spans grouped by the `haystack.component.name` of their parent span."""
    by_id = {span.context.span_id: span for span in finished}
    grouped: dict[str, list[ReadableSpan]] = {}
    for span in finished:
        if span.name == LLM_SPAN:
            assert span.parent is not None, "an LLM span without a parent"
            parent = by_id[span.parent.span_id]
            assert parent.name == COMPONENT_SPAN
            grouped.setdefault(str(parent.attributes["haystack.component.name"]), []).append(span)
    return grouped


def span_tree(finished: tuple[ReadableSpan, ...]) -> str:
    """The spans as an indented tree (name, component name, token tags), children in start order."""
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in sorted(finished, key=lambda span: span.start_time or 0):
        children.setdefault(span.parent.span_id if span.parent else None, []).append(span)
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for span in children.get(parent, []):
            attributes = span.attributes or {}
            tokens = ""
            if INPUT_TOKENS_TAG in attributes:
                tokens = f" in={attributes[INPUT_TOKENS_TAG]} out={attributes[OUTPUT_TOKENS_TAG]}"
            name = attributes.get("haystack.component.name", "")
            kind = attributes.get("haystack.component.type", "")
            lines.append(f"{'  ' * depth}{span.name} [{name}: {kind}]{tokens}")
            walk(span.context.span_id, depth + 1)

    walk(None, 0)
    return "\n".join(lines)
