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
    prompt.name: prompt
    for prompt in (
        liu.FIGURE7,
        liu.PRUNING,
        liu.SUMMARY,
        liu.DISTILLER,
        sure.CANDIDATES,
        sure.FEW_SHOT_CANDIDATES,
        sure.CONDITIONAL_SUMMARY,
        sure.FEW_SHOT_SUMMARY,
        sure.GENERIC_SUMMARY,
        sure.VALIDITY,
        sure.RANKING,
        sure.BASE,
        sure.MCQ,
        sure.SUM_AND_PRED,
        chain_of_note.SINGLE_CALL,
        chain_of_note.DOCUMENT_NOTE,
        chain_of_note.SYNTHESIS,
        sure.SUM_ALL,
        conversation.STANDALONE_QUESTION,
    )
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
