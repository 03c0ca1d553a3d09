"""
Tracing of the ChatGenerator calls a component makes inside its `run`: one `haystack.chat_generator.run` span per
call, as Haystack's own components give the generator calls they make, tagged with the call's token counts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from haystack import tracing
from haystack.components.generators.chat.types import ChatGenerator

from haystack_fusion.llm.usage import reply_usage

# The token counts of a call's span, named as OpenTelemetry's semantic conventions for generative AI name them.
INPUT_TOKENS_TAG = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS_TAG = "gen_ai.usage.output_tokens"


@contextlib.contextmanager
def trace_chat_call(
    chat_generator: ChatGenerator, generator_inputs: dict[str, Any], parent_span: tracing.Span | None
) -> Iterator[tracing.Span]:
    """
    Open the tracing span of one ChatGenerator call made inside a component, as Haystack's own components do.

    The span is named `haystack.chat_generator.run` and tagged `haystack.component.name` = "chat_generator" and
    `haystack.component.type` = the generator's class name (the convention of Haystack's
    `components.generators.utils._trace_chat_generator_run`); the inputs are its `haystack.component.input` content
    tag, recorded only when content tracing is on (`HAYSTACK_CONTENT_TRACING_ENABLED`). The caller sets the output
    and the token counts (`record_chat_call`). An exception raised inside the block closes the span as failed.

    :param chat_generator: The ChatGenerator being called.
    :param generator_inputs: Its inputs (`messages`, and `generation_kwargs` when given).
    :param parent_span: The span of the component that fans out. Tracers that follow the context (OpenTelemetry's)
        find it themselves, since the fan-out copies the caller's context into its tasks and threads; the others
        are given it here.
    :returns: The span, as a context manager.
    """
    with tracing.tracer.trace(
        "haystack.chat_generator.run",
        tags={"haystack.component.name": "chat_generator", "haystack.component.type": type(chat_generator).__name__},
        parent_span=parent_span,
    ) as span:
        span.set_content_tag("haystack.component.input", generator_inputs)
        yield span


def record_chat_call(span: tracing.Span, result: dict[str, Any]) -> None:
    """
    Tag a call's span with its result: the `haystack.component.output` content tag (when content tracing is on) and
    the first reply's token counts, `gen_ai.usage.input_tokens` and `gen_ai.usage.output_tokens` (always; 0 when
    the generator reported none).
    """
    span.set_content_tag("haystack.component.output", result)
    usage = reply_usage((result.get("replies") or [None])[0])
    span.set_tags({INPUT_TOKENS_TAG: usage["prompt_tokens"], OUTPUT_TOKENS_TAG: usage["completion_tokens"]})
