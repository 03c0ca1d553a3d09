"""
Yu et al. (Chain-of-Note, arXiv:2311.09210), Appendix A.5 and Table 6: NoteTaker's prompts. The single call is A.5's
task with Table 6's first case as a demonstration (for base models; the paper prompts GPT-4 zero-shot). The
per-document mode (ours) asks for one note and relevance label (section 2.3.1) per passage, then steps 4-5.
"""

from __future__ import annotations

from haystack import Document
from haystack.dataclasses import ChatMessage

from haystack_fusion.prompts.templates import (
    ANSWER_LINE_STOP,
    DEFAULT_MAX_PASSAGE_CHARS,
    PromptTemplate,
    format_passages,
    number_words,
    render,
)

STEP_5_PARAMETRIC = "5. If no passage is relevant, directly provide answer without considering the passages."  # A.5
STEP_5_UNKNOWN = '5. If no passage is relevant, answer "unknown".'  # without parametric knowledge (Figure 2 (c))

_DEMO_QUESTION = "When was the last Summer Olympics in the USA?"
_DEMO_DOCUMENTS = [
    Document(
        content="In Chicago's 2016 Summer Olympics bid, the games would have been held from July 22 to August 7, with "
        "the Paralympics held between August 12 and 28. The plan emphasized use of Chicago Park District ...",
        meta={"title": "Chicago bid for the 2016 Summer Olympics"},
    ),
    Document(
        content="The 1996 Olympics are the most recent edition of the Summer Olympics to be held in the United States. "
        "Los Angeles will host the 2028 Summer Olympics, 32 years after the games were held in Atlanta. ...",
        meta={"title": "1996 Summer Olympics"},
    ),
]
_DEMO_NOTES = [
    "Passage #1 discusses Chicago's bid for the 2016 Summer Olympics, but does not mention whether it is a successful "
    "bid.",
    "Passage #2 confirms that the 1996 Summer Olympics were the most recent edition of the Summer Olympics to be held "
    "in the United States.",
]
ANSWER_LEAD = "Based on the information given in above passages, the answer is"  # as Table 6's outputs state it
_DEMO_ANSWER = "1996"
_DEMO_IRRELEVANT = Document(
    content="Sourdough bread is leavened by a culture of wild yeast and lactic acid bacteria rather than by baker's "
    "yeast.",
    meta={"title": "Sourdough"},
)
"""Ours: note type (c), irrelevant (Table 6 shows types (a) and (b))."""

SINGLE_CALL = PromptTemplate(
    "con_single_call",
    "Yu et al., Appendix A.5, Table 6",
    f"""Task Description:
1. Read the given question and {{{{ k_words }}}} Wikipedia passages to gather relevant information.
2. Write reading notes summarizing the key points from these passages.
3. Discuss the relevance of the given question and Wikipedia passages.
4. If some passages are relevant to the given question, provide a brief answer based on the passages.
{{{{ step_5 }}}}

Question: {_DEMO_QUESTION}
{format_passages(_DEMO_DOCUMENTS, layout="titled")}
Reading notes: {" ".join(_DEMO_NOTES)} {ANSWER_LEAD} {_DEMO_ANSWER}

Question: {{{{ query }}}}
{{{{ passages }}}}
Reading notes:""",
    demonstrations=(_DEMO_ANSWER,),
)
"""Appendix A.5 (RALM with CoN). Variables: `single_call_variables`'s."""

DOCUMENT_NOTE = PromptTemplate(
    "con_document_note",
    "Yu et al., section 2.3.1, Appendix A.5",
    f"""Task Description: Read the given question and Wikipedia passage, write a reading note on what the \
passage says about the question, and judge its relevance: (a) answers directly, (b) useful context, or (c) irrelevant.

Question: {_DEMO_QUESTION}
{format_passages(_DEMO_DOCUMENTS[:1], layout="titled")}
Reading note: {_DEMO_NOTES[0].replace("Passage #1", "The passage")}
Relevance: (b) useful context

Question: {_DEMO_QUESTION}
{format_passages(_DEMO_DOCUMENTS[1:], layout="titled")}
Reading note: {_DEMO_NOTES[1].replace("Passage #2", "The passage")}
Relevance: (a) answers directly

Question: {_DEMO_QUESTION}
{format_passages([_DEMO_IRRELEVANT], layout="titled")}
Reading note: The passage is about sourdough bread and says nothing about the Olympics.
Relevance: (c) irrelevant

Question: {{{{ query }}}}
{{{{ passages }}}}
Reading note:""",
)
"""Per-document mode, round 1: a note and relevance label on one passage. Variables: `query`, `passages`."""

SYNTHESIS = PromptTemplate(
    "con_synthesis",
    "Yu et al., Appendix A.5 (steps 4-5)",
    f"""Task Description:
4. If some passages are relevant to the given question, provide a brief answer based on the passages.
{{{{ step_5 }}}}

Question: {_DEMO_QUESTION}
Reading notes:
Passage #1 (useful context): {_DEMO_NOTES[0].replace("Passage #1 ", "")}
Passage #2 (answers directly): {_DEMO_NOTES[1].replace("Passage #2 ", "")}
{ANSWER_LEAD} {_DEMO_ANSWER}

Question: {{{{ query }}}}
Reading notes:
{{% for note in notes %}}Passage #{{{{ loop.index }}}} ({{{{ note.label }}}}): {{{{ note.note }}}}
{{% endfor %}}{ANSWER_LEAD}""",
    answer_pattern=r"^\s*((?:[^\n]*[^ \t.\n])?)[ \t.]*(?:\n|$)",
    demonstrations=(_DEMO_ANSWER,),
    stop=ANSWER_LINE_STOP,
)
"""Per-document mode, round 2: steps 4-5 over round 1's notes. Variables: `step_5`, `query`, `notes` (`label` in
words, `note`). The answer is the completion's first line without a final period; linear time."""

RELEVANCE_WORDS = {"direct": "answers directly", "context": "useful context", "irrelevant": "irrelevant"}


def single_call_variables(
    query: str,
    documents: list[Document],
    *,
    allow_parametric_knowledge: bool = True,
    max_passage_chars: int | None = DEFAULT_MAX_PASSAGE_CHARS,
) -> dict[str, str]:
    """`SINGLE_CALL`'s variables: `query`, `passages`, `k_words` ("five" in the paper) and `step_5`."""
    return {
        "query": query,
        "passages": format_passages(documents, max_passage_chars, layout="titled"),
        "k_words": number_words(len(documents)),
        "step_5": STEP_5_PARAMETRIC if allow_parametric_knowledge else STEP_5_UNKNOWN,
    }


def single_call_prompt(
    query: str,
    documents: list[Document],
    *,
    allow_parametric_knowledge: bool = True,
    max_passage_chars: int | None = DEFAULT_MAX_PASSAGE_CHARS,
) -> list[ChatMessage]:
    """`SINGLE_CALL` rendered with `single_call_variables`, as one user ChatMessage."""
    variables = single_call_variables(
        query, documents, allow_parametric_knowledge=allow_parametric_knowledge, max_passage_chars=max_passage_chars
    )
    return render(SINGLE_CALL, **variables)
