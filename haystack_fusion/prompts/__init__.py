"""
Prompt templates (Jinja2, rendered by Haystack's ChatPromptBuilder), one module per paper figure or listing.

`registry` names every template with its source and answer pattern (`PROMPTS`); `rendering` renders them from
templates compiled once per process (`render`); `passages` formats the passage block every template reads.
"""

from haystack_fusion.prompts.passages import DEFAULT_MAX_PASSAGE_CHARS, format_passages, passage_key
from haystack_fusion.prompts.registry import (
    ANSWER_LINE_STOP,
    COT_ANSWER_PATTERN,
    PROMPTS,
    WHOLE_REPLY_PATTERN,
    PromptTemplate,
    extract_answer,
)
from haystack_fusion.prompts.rendering import CompiledPrompt, compiled, render

__all__ = [
    "ANSWER_LINE_STOP",
    "COT_ANSWER_PATTERN",
    "DEFAULT_MAX_PASSAGE_CHARS",
    "PROMPTS",
    "WHOLE_REPLY_PATTERN",
    "CompiledPrompt",
    "PromptTemplate",
    "compiled",
    "extract_answer",
    "format_passages",
    "passage_key",
    "render",
]
