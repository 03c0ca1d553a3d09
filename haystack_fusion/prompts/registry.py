r"""
The prompt registry: every prompt template of the package, with its source in the papers and its answer pattern.

Every template reads the passages as one pre-formatted string variable `passages` (see `format_passages`), so
passage text is never evaluated as template syntax, and carries the pattern that extracts the answer from the reply.
One module per paper figure or listing holds the texts (`figure7`, `sure`, `chain_of_note`, ...); this module names
them (`PROMPTS`).

### Usage example
```python
from haystack_fusion.prompts import PROMPTS

prompt = PROMPTS["figure7"]
print(prompt.source)  # Liu et al., Appendix A, Figure 7
print(prompt.extract_answer("  Paris\nThe passages say so."))  # Paris
```
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from haystack.components.builders import ChatPromptBuilder
from haystack.dataclasses import ChatMessage

from haystack_fusion.prompts import (
    chain_of_note,
    conversation,
    distiller,
    examples,
    figure7,
    figure8_pruning,
    figure9_summary,
    sure,
)

WHOLE_REPLY_PATTERN = r"^\s*((?:\S(?:[\s\S]*\S)?)?)"
"""Prompts whose reply a component parses itself (SuRe's candidates, summaries, validity, ranking): the whole reply,
from its first to its last character that is not whitespace. Linear time: a run of whitespace inside the reply costs no
backtracking."""

ANSWER_LINE_STOP: tuple[str, ...] = ("\n",)
"""The stop sequence of prompts whose answer is the first line of the reply (Figure 7, the distiller, Listings 10 and
12, Chain-of-Note's synthesis): generation ends with the answer line, instead of running on into text the answer
pattern throws away."""

COT_ANSWER_PATTERN = r"Answer:[ \t]*([^\n]*)"
"""Chain-of-thought prompts (Figures 8-9): the answer is the rest of the first "Answer:" line of the completion."""


@dataclass(frozen=True)
class PromptTemplate:
    """
    One prompt of a paper: its Jinja text, where it comes from, and how to read the answer from the reply.

    :param name: Registry name, e.g. "figure7".
    :param source: The paper location it implements, e.g. "Liu et al., Appendix A, Figure 7".
    :param text: The Jinja template; variables `passages` and `query` (and `candidates` for the distiller).
    :param answer_pattern: A regular expression whose first group is the answer (as Haystack's AnswerBuilder reads
        it); no match gives an empty answer, which counts as unknown.
    :param demonstrations: The answers of the template's own few-shot demonstrations, which the answer validator
        rejects when the passages do not contain them (`validation.check_answer`); empty for a prompt without
        demonstrations or whose reply is not an answer.
    :param stop: Stop sequences that end the reply once the answer is written (`ANSWER_LINE_STOP` for a prompt
        whose answer is the reply's first line), added to the generator's own; empty for a prompt whose reply runs
        over several lines.
    """

    name: str
    source: str
    text: str
    answer_pattern: str
    demonstrations: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()

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
            "Liu et al., Appendix A, Figure 7",
            figure7.TEMPLATE,
            figure7.ANSWER_PATTERN,
            demonstrations=examples.FORMAT_EXAMPLE_ANSWERS,
            stop=ANSWER_LINE_STOP,
        ),
        PromptTemplate(
            "pruning",
            "Liu et al., Appendix A, Figure 8",
            figure8_pruning.TEMPLATE,
            COT_ANSWER_PATTERN,
            demonstrations=(*examples.FORMAT_EXAMPLE_ANSWERS, examples.DEMO_ANSWER),
        ),
        PromptTemplate(
            "summary",
            "Liu et al., Appendix A, Figure 9",
            figure9_summary.TEMPLATE,
            COT_ANSWER_PATTERN,
            demonstrations=(*examples.FORMAT_EXAMPLE_ANSWERS, examples.DEMO_ANSWER),
        ),
        PromptTemplate(
            "distiller",
            "Liu et al., section 3.3",
            distiller.TEMPLATE,
            distiller.ANSWER_PATTERN,
            demonstrations=distiller.DEMONSTRATION_ANSWERS,
            stop=ANSWER_LINE_STOP,
        ),
        PromptTemplate(
            "sure_candidates",
            "Kim et al., Appendix A.1, Listing 6",
            sure.CANDIDATES,
            WHOLE_REPLY_PATTERN,
        ),
        PromptTemplate(
            "sure_few_shot_candidates",
            "Kim et al., Appendix B.5, Listing 13",
            sure.FEW_SHOT_CANDIDATES,
            WHOLE_REPLY_PATTERN,
            demonstrations=sure.FEW_SHOT_CANDIDATE_ANSWERS,
        ),
        PromptTemplate(
            "sure_summary",
            "Kim et al., Appendix A.2, Listing 7",
            sure.CONDITIONAL_SUMMARY,
            WHOLE_REPLY_PATTERN,
        ),
        PromptTemplate(
            "sure_few_shot_summary",
            "Kim et al., Appendix A.2, Listing 7 (with a demonstration, as Listing 13)",
            sure.FEW_SHOT_SUMMARY,
            WHOLE_REPLY_PATTERN,
        ),
        PromptTemplate(
            "sure_generic_summary",
            "Kim et al., Appendix A.6, Listing 11",
            sure.GENERIC_SUMMARY,
            WHOLE_REPLY_PATTERN,
        ),
        PromptTemplate(
            "sure_validity",
            "Kim et al., Appendix A.3, Listing 8",
            sure.VALIDITY,
            WHOLE_REPLY_PATTERN,
        ),
        PromptTemplate(
            "sure_ranking",
            "Kim et al., Appendix A.4, Listing 9",
            sure.RANKING,
            WHOLE_REPLY_PATTERN,
        ),
        PromptTemplate(
            "sure_base",
            "Kim et al., Appendix A.5, Listing 10",
            sure.BASE,
            sure.SHORT_ANSWER_PATTERN,
            stop=ANSWER_LINE_STOP,
        ),
        PromptTemplate(
            "sure_mcq",
            "Kim et al., Appendix A.7, Listing 12",
            sure.MCQ,
            sure.SHORT_ANSWER_PATTERN,
            stop=ANSWER_LINE_STOP,
        ),
        PromptTemplate(
            "sure_sum_and_pred",
            "Kim et al., section 4.3, Table 3",
            sure.SUM_AND_PRED,
            sure.SHORT_ANSWER_PATTERN,
            stop=ANSWER_LINE_STOP,
        ),
        PromptTemplate(
            "con_single_call",
            "Yu et al., Appendix A.5, Table 6",
            chain_of_note.SINGLE_CALL,
            WHOLE_REPLY_PATTERN,
            demonstrations=chain_of_note.DEMONSTRATION_ANSWERS,
        ),
        PromptTemplate(
            "con_document_note",
            "Yu et al., section 2.3.1, Appendix A.5",
            chain_of_note.DOCUMENT_NOTE,
            WHOLE_REPLY_PATTERN,
        ),
        PromptTemplate(
            "con_synthesis",
            "Yu et al., Appendix A.5 (steps 4-5)",
            chain_of_note.SYNTHESIS,
            chain_of_note.ANSWER_PATTERN,
            demonstrations=chain_of_note.DEMONSTRATION_ANSWERS,
            stop=ANSWER_LINE_STOP,
        ),
        PromptTemplate(
            "sure_sum_all",
            "Kim et al., section 4.3, Table 3",
            sure.SUM_ALL,
            sure.SHORT_ANSWER_PATTERN,
            stop=ANSWER_LINE_STOP,
        ),
        PromptTemplate(
            "standalone_question",
            "this package: a follow-up in a chat rewritten as a standalone question (no paper has a chat)",
            conversation.TEMPLATE,
            conversation.ANSWER_PATTERN,
            stop=ANSWER_LINE_STOP,
        ),
    )
}
"""Every prompt template of the package, by name."""
