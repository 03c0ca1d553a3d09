"""
Prompt templates (Jinja2, rendered by Haystack's ChatPromptBuilder), one module per paper figure or listing.

Every template reads the passages as one pre-formatted string variable `passages` (see `format_passages`), so
passage text is never evaluated as template syntax, and carries the pattern that extracts the answer from the reply.
`render` compiles each template text once per process and reuses it for every prompt (the hot path of a fan-out
renders one prompt per passage), with output identical to a fresh ChatPromptBuilder's.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any

from haystack.components.builders import ChatPromptBuilder
from haystack.dataclasses import ChatMessage
from jinja2 import Template

from haystack_fusion.prompts import chain_of_note, distiller, examples, figure7, figure8_pruning, figure9_summary, sure
from haystack_fusion.prompts.passages import DEFAULT_MAX_PASSAGE_CHARS, format_passages, passage_key

WHOLE_REPLY_PATTERN = r"^\s*((?:\S(?:[\s\S]*\S)?)?)"
"""Prompts whose reply a component parses itself (SuRe's candidates, summaries, validity, ranking): the whole reply,
from its first to its last character that is not whitespace. Linear time (`WHOLE_REPLY_FINGERPRINT_PATTERN` was
quadratic in a run of whitespace inside the reply)."""

WHOLE_REPLY_FINGERPRINT_PATTERN = r"^\s*([\s\S]*?)\s*$"
"""The pattern before it was made linear, kept as the text that identifies the parser in evaluation fingerprints
(`PromptTemplate.fingerprint_pattern`): `WHOLE_REPLY_PATTERN` extracts the same first group from every reply
(tests/unit/test_answer_patterns.py, a differential test), so committed runs resume."""

ANSWER_LINE_STOP: tuple[str, ...] = ("\n",)
"""The stop sequence of prompts whose answer is the first line of the reply (Figure 7, the distiller, Listings 10 and
12, Chain-of-Note's synthesis): generation ends with the answer line, instead of running on into text the answer
pattern throws away (issue 16)."""

STOP_SEQUENCES_VERSION = "1"
"""Identifies the prompts' `stop` sequences in evaluation fingerprints (`evaluation.runner`): bump it when one
changes."""

COT_ANSWER_PATTERN = r"Answer:[ \t]*([^\n]*)"
"""Chain-of-thought prompts (Figures 8-9): the answer is the rest of the first "Answer:" line of the completion."""


@dataclass(frozen=True)
class PromptTemplate:
    """
    One prompt of a paper: its Jinja text, where it comes from, and how to read the answer from the reply.

    :param name: Registry name, e.g. "figure7".
    :param source: The paper location it implements, e.g. "paper 000, Appendix A, Figure 7".
    :param text: The Jinja template; variables `passages` and `query` (and `candidates` for the distiller).
    :param answer_pattern: A regular expression whose first group is the answer (as Haystack's AnswerBuilder reads
        it); no match gives an empty answer, which counts as unknown.
    :param fingerprint_pattern: The pattern text that identifies the parser in evaluation fingerprints
        (`evaluation.records.prompt_hashes`); empty (the default) means `answer_pattern`. A pattern rewritten without
        changing what it extracts (e.g. made linear-time) keeps the text it replaced here, so the records of
        committed runs still match and resume; the rewrite must be shown to give the same first group on every reply
        (tests/unit/test_answer_patterns.py does it for the patterns here). A change of what is extracted must change
        this text too.
    :param demonstrations: The answers of the template's own few-shot demonstrations, which the answer validator
        rejects when the passages do not contain them (`validation.check_answer`); empty for a prompt without
        demonstrations or whose reply is not an answer. Not part of the fingerprint: the template text holds them.
    :param stop: Stop sequences that end the reply once the answer is written (`ANSWER_LINE_STOP` for a prompt
        whose answer is the reply's first line), added to the generator's own with `stop_sequences` on
        (`llm_calls.stop_kwargs`); empty for a prompt whose reply runs over several lines. With `stop_sequences` on,
        the evaluation fingerprints `STOP_SEQUENCES_VERSION` instead of hashing these.
    """

    name: str
    source: str
    text: str
    answer_pattern: str
    fingerprint_pattern: str = ""
    demonstrations: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.fingerprint_pattern:
            object.__setattr__(self, "fingerprint_pattern", self.answer_pattern)

    def chat_template(self) -> list[ChatMessage]:
        """The template as the one user message that ChatPromptBuilder takes."""
        return [ChatMessage.from_user(self.text)]

    def builder(self) -> ChatPromptBuilder:
        """A Haystack ChatPromptBuilder for this template, every variable required."""
        return ChatPromptBuilder(template=self.chat_template(), required_variables="*")

    def extract_answer(self, reply: str | None) -> str:
        """
        Read the answer from a reply, as AnswerBuilder does with `answer_pattern`.

        :param reply: The reply text; None (no text) gives "".
        :returns: The first group of the first match, stripped; "" when the pattern does not match.
        """
        return extract_answer(self.answer_pattern, reply)


def extract_answer(pattern: str, reply: str | None) -> str:
    """
    Read an answer from a reply with a pattern, the way Haystack's AnswerBuilder reads `pattern`.

    :param pattern: A regular expression with at most one group; the group (else the whole match) is the answer.
    :param reply: The reply text; None (no text) gives "".
    :returns: The answer, stripped; "" when the pattern does not match.
    """
    match = re.search(pattern, reply or "")
    if not match:
        return ""
    return (match.group(1) if match.groups() else match.group(0)).strip()


PROMPTS: dict[str, PromptTemplate] = {
    prompt.name: prompt
    for prompt in (
        PromptTemplate(
            "figure7",
            "paper 000, Appendix A, Figure 7",
            figure7.TEMPLATE,
            figure7.ANSWER_PATTERN,
            figure7.FINGERPRINT_PATTERN,
            examples.FORMAT_EXAMPLE_ANSWERS,
            stop=ANSWER_LINE_STOP,
        ),
        PromptTemplate(
            "pruning",
            "paper 000, Appendix A, Figure 8",
            figure8_pruning.TEMPLATE,
            COT_ANSWER_PATTERN,
            demonstrations=(*examples.FORMAT_EXAMPLE_ANSWERS, examples.DEMO_ANSWER),
        ),
        PromptTemplate(
            "summary",
            "paper 000, Appendix A, Figure 9",
            figure9_summary.TEMPLATE,
            COT_ANSWER_PATTERN,
            demonstrations=(*examples.FORMAT_EXAMPLE_ANSWERS, examples.DEMO_ANSWER),
        ),
        PromptTemplate(
            "distiller",
            "paper 000, section 3.3",
            distiller.TEMPLATE,
            distiller.ANSWER_PATTERN,
            distiller.FINGERPRINT_PATTERN,
            distiller.DEMONSTRATION_ANSWERS,
            stop=ANSWER_LINE_STOP,
        ),
        PromptTemplate(
            "sure_candidates",
            "paper 002, Appendix A.1, Listing 6",
            sure.CANDIDATES,
            WHOLE_REPLY_PATTERN,
            WHOLE_REPLY_FINGERPRINT_PATTERN,
        ),
        PromptTemplate(
            "sure_few_shot_candidates",
            "paper 002, Appendix B.5, Listing 13",
            sure.FEW_SHOT_CANDIDATES,
            WHOLE_REPLY_PATTERN,
            WHOLE_REPLY_FINGERPRINT_PATTERN,
            sure.FEW_SHOT_CANDIDATE_ANSWERS,
        ),
        PromptTemplate(
            "sure_summary",
            "paper 002, Appendix A.2, Listing 7",
            sure.CONDITIONAL_SUMMARY,
            WHOLE_REPLY_PATTERN,
            WHOLE_REPLY_FINGERPRINT_PATTERN,
        ),
        PromptTemplate(
            "sure_few_shot_summary",
            "paper 002, Appendix A.2, Listing 7 (with a demonstration, as Listing 13)",
            sure.FEW_SHOT_SUMMARY,
            WHOLE_REPLY_PATTERN,
            WHOLE_REPLY_FINGERPRINT_PATTERN,
        ),
        PromptTemplate(
            "sure_generic_summary",
            "paper 002, Appendix A.6, Listing 11",
            sure.GENERIC_SUMMARY,
            WHOLE_REPLY_PATTERN,
            WHOLE_REPLY_FINGERPRINT_PATTERN,
        ),
        PromptTemplate(
            "sure_validity",
            "paper 002, Appendix A.3, Listing 8",
            sure.VALIDITY,
            WHOLE_REPLY_PATTERN,
            WHOLE_REPLY_FINGERPRINT_PATTERN,
        ),
        PromptTemplate(
            "sure_ranking",
            "paper 002, Appendix A.4, Listing 9",
            sure.RANKING,
            WHOLE_REPLY_PATTERN,
            WHOLE_REPLY_FINGERPRINT_PATTERN,
        ),
        PromptTemplate(
            "sure_base",
            "paper 002, Appendix A.5, Listing 10",
            sure.BASE,
            sure.SHORT_ANSWER_PATTERN,
            sure.SHORT_ANSWER_FINGERPRINT_PATTERN,
            stop=ANSWER_LINE_STOP,
        ),
        PromptTemplate(
            "sure_mcq",
            "paper 002, Appendix A.7, Listing 12",
            sure.MCQ,
            sure.SHORT_ANSWER_PATTERN,
            sure.SHORT_ANSWER_FINGERPRINT_PATTERN,
            stop=ANSWER_LINE_STOP,
        ),
        PromptTemplate(
            "sure_sum_and_pred",
            "paper 002, section 4.3, Table 3",
            sure.SUM_AND_PRED,
            sure.SHORT_ANSWER_PATTERN,
            sure.SHORT_ANSWER_FINGERPRINT_PATTERN,
            stop=ANSWER_LINE_STOP,
        ),
        PromptTemplate(
            "con_single_call",
            "paper 004, Appendix A.5, Table 6",
            chain_of_note.SINGLE_CALL,
            WHOLE_REPLY_PATTERN,
            WHOLE_REPLY_FINGERPRINT_PATTERN,
            chain_of_note.DEMONSTRATION_ANSWERS,
        ),
        PromptTemplate(
            "con_document_note",
            "paper 004, section 2.3.1, Appendix A.5",
            chain_of_note.DOCUMENT_NOTE,
            WHOLE_REPLY_PATTERN,
            WHOLE_REPLY_FINGERPRINT_PATTERN,
        ),
        PromptTemplate(
            "con_synthesis",
            "paper 004, Appendix A.5 (steps 4-5)",
            chain_of_note.SYNTHESIS,
            chain_of_note.ANSWER_PATTERN,
            chain_of_note.FINGERPRINT_PATTERN,
            chain_of_note.DEMONSTRATION_ANSWERS,
            stop=ANSWER_LINE_STOP,
        ),
        PromptTemplate(
            "sure_sum_all",
            "paper 002, section 4.3, Table 3",
            sure.SUM_ALL,
            sure.SHORT_ANSWER_PATTERN,
            sure.SHORT_ANSWER_FINGERPRINT_PATTERN,
            stop=ANSWER_LINE_STOP,
        ),
    )
}
"""Every prompt template of the package, by name."""


def validate_query(query: str) -> str:
    """
    Check a question before any LLM call.

    :param query: The question.
    :returns: The question, stripped.
    :raises ValueError: If the question is empty or only whitespace.
    """
    if not isinstance(query, str) or not query.strip():
        raise ValueError(f"`query` must be a non-empty question, got {query!r}")
    return query.strip()


@dataclass(frozen=True)
class CompiledPrompt:
    """
    A template text compiled once: what `render` reuses for every prompt of that text.

    :param builder: The ChatPromptBuilder made for the text (`PromptTemplate.builder()`'s settings), built once; it
        found the template's variables.
    :param variables: The variables the text uses, all required, sorted.
    :param template: The text compiled by the builder's own Jinja environment (Haystack's sandbox and extensions),
        so rendering it gives what `builder.run` gives. A compiled Jinja template is immutable: rendering it from
        many threads at once is safe.
    """

    builder: ChatPromptBuilder
    variables: tuple[str, ...]
    template: Template


_COMPILED: dict[str, CompiledPrompt] = {}
_COMPILED_LOCK = threading.Lock()


def compiled(prompt: PromptTemplate) -> CompiledPrompt:
    """
    The compiled form of a template's text, built on first use and cached for the process, keyed by the text.

    Thread-safe: concurrent first uses build it once (under a lock); later uses only read the cache.

    :param prompt: The template.
    :returns: Its `CompiledPrompt`.
    """
    found = _COMPILED.get(prompt.text)
    if found is not None:
        return found
    with _COMPILED_LOCK:
        found = _COMPILED.get(prompt.text)
        if found is None:
            builder = prompt.builder()
            # ChatPromptBuilder.run compiles its template text with this environment on every call; compile it once.
            template = builder._env.from_string(prompt.text)
            found = CompiledPrompt(builder=builder, variables=tuple(sorted(builder.variables)), template=template)
            _COMPILED[prompt.text] = found
        return found


def render(prompt: PromptTemplate, **variables: Any) -> list[ChatMessage]:
    """
    Render a template as Haystack's ChatPromptBuilder does, from the template compiled once (`compiled`).

    The messages equal `prompt.builder().run(**variables)["prompt"]` (same text, role and meta), without building a
    builder and compiling the Jinja text for every prompt (1-3 ms each on a 2-core machine, against about 0.06 ms
    rendered from the compiled template: `benchmarks/fan_out.py`). Safe to call from many threads at once.

    :param prompt: The template.
    :param variables: Its variables (`passages` as a `format_passages` string, `query`, ...); every variable the
        template uses is required, as `PromptTemplate.builder()` requires them.
    :returns: The prompt as a list of one user ChatMessage.
    :raises ValueError: If a variable the template uses is missing (the message names it).
    """
    compiled_prompt = compiled(prompt)
    missing = [name for name in compiled_prompt.variables if name not in variables]
    if missing:
        raise ValueError(
            f"Missing required input variables of prompt {prompt.name!r}: {', '.join(missing)}. "
            f"Required variables: {list(compiled_prompt.variables)}. Provided variables: {sorted(variables)}."
        )
    return [ChatMessage.from_user(compiled_prompt.template.render(variables))]


__all__ = [
    "COT_ANSWER_PATTERN",
    "DEFAULT_MAX_PASSAGE_CHARS",
    "PROMPTS",
    "WHOLE_REPLY_FINGERPRINT_PATTERN",
    "WHOLE_REPLY_PATTERN",
    "CompiledPrompt",
    "PromptTemplate",
    "compiled",
    "extract_answer",
    "format_passages",
    "passage_key",
    "render",
    "validate_query",
]
