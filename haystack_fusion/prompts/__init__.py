"""Prompt templates (Jinja2), one module per paper (`liu`, `sure`, `chain_of_note`) and a chat's follow-up
(`conversation`); `templates` formats passages and renders prompts. `PROMPTS` names them all."""

from haystack_fusion.prompts import chain_of_note, conversation, liu, sure
from haystack_fusion.prompts.chain_of_note import single_call_prompt
from haystack_fusion.prompts.templates import (
    ANSWER_LINE_STOP,
    COT_ANSWER_PATTERN,
    DEFAULT_MAX_PASSAGE_CHARS,
    PASSAGE_LAYOUTS,
    WHOLE_REPLY_PATTERN,
    ChatPrompt,
    ChatTemplate,
    PassageLayout,
    PromptTemplate,
    extract_answer,
    format_passages,
    passage_key,
    render,
    strip_delimiters,
    template_from_dict,
    template_to_dict,
)

PROMPTS: dict[str, PromptTemplate] = {
    value.name: value
    for module in (liu, sure, chain_of_note, conversation)
    for value in vars(module).values()
    if isinstance(value, PromptTemplate)
}
"""Every prompt template of the package, by name."""

__all__ = [
    "ANSWER_LINE_STOP",
    "COT_ANSWER_PATTERN",
    "DEFAULT_MAX_PASSAGE_CHARS",
    "PASSAGE_LAYOUTS",
    "PROMPTS",
    "WHOLE_REPLY_PATTERN",
    "ChatPrompt",
    "ChatTemplate",
    "PassageLayout",
    "PromptTemplate",
    "extract_answer",
    "format_passages",
    "passage_key",
    "render",
    "single_call_prompt",
    "strip_delimiters",
    "template_from_dict",
    "template_to_dict",
]
