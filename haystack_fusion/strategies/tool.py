"""A registered strategy over your own retriever as one tool for a Haystack `Agent`: a question in, text out."""

from __future__ import annotations

from typing import Any

from haystack import Pipeline
from haystack.components.generators.chat.types import ChatGenerator
from haystack.tools import PipelineTool

from haystack_fusion.strategies.answerer import FusionAnswerer
from haystack_fusion.strategies.registry import get_strategy
from haystack_fusion.strategies.run import answers_run, chat_text, evidence_line

_QUERY = {"query": {"type": "string", "description": "The question to answer from the documents."}}
_PARAMETERS = {"type": "object", "properties": _QUERY, "required": ["query"]}  # not the retriever's top_k or filters


def strategy_tool(
    strategy: str,
    *,
    retriever: Any,
    chat_generator: ChatGenerator,
    name: str | None = None,
    description: str | None = None,
    settings: dict[str, Any] | None = None,
) -> PipelineTool:
    """
    A Haystack `Agent`'s tool answering a question from your documents with a registered strategy: a `PipelineTool` over
    `retriever` (not yet in a pipeline) -> `FusionAnswerer(strategy=..., settings=...)`, whose one parameter is `query`
    and whose result is `tool_text`; it serializes with the Agent. `name` None: "answer_with_<strategy>"; `description`
    None: `Strategy.description`.

    :raises ValueError: If the strategy is not registered, or `settings` holds a field `FusionAnswerer` does not take.
    :raises PipelineError: If the retriever is already in a pipeline.
    """
    description = description or get_strategy(strategy).description
    answerer = FusionAnswerer(strategy=strategy, chat_generator=chat_generator, settings=settings)
    pipeline = Pipeline()
    pipeline.add_component("retriever", retriever)
    pipeline.add_component("answerer", answerer)
    pipeline.connect("retriever.documents", "answerer.documents")
    return PipelineTool(
        pipeline,
        name=name or f"answer_with_{strategy}",
        description=description,
        input_mapping={"query": ["retriever.query", "answerer.query"]},
        output_mapping={"retriever.documents": "documents", "answerer.answers": "answers"},
        parameters=_PARAMETERS,
        outputs_to_string={"handler": tool_text},
    )


def tool_text(result: dict[str, Any]) -> str:
    """The text a strategy tool gives the agent from its `answers` and `documents`: the answer (or what the checks
    rejected), "Sources:" with a line "[i] title: text" per cited passage in rank order (`chat_text`), then "Evidence:
    ..." if any."""
    run = answers_run(result.get("answers") or [], result.get("documents") or [])
    evidence = evidence_line(run)
    return chat_text(run) + (f"\n\nEvidence: {evidence}" if evidence else "")
