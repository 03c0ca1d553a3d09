"""
Liu et al. (KnowLLM 2024, arXiv:2308.12574), Appendix A: the prompts of Concatenation and Post-Fusion (Figure 7), the
one-shot chain-of-thought Pruning and Summary prompts (Figures 8, 9) and the distiller of PF+Concat (section 3.3).

The figures are text extractions of a PDF whose right-hand columns were cut; words visibly cut from a demonstration
are completed from the visible fragments (marked in the comments). The structure follows the figures exactly. Every
template reads `passages` (a `format_passages` block) and `query`.
"""

from __future__ import annotations

from haystack import Document

from haystack_fusion.prompts.templates import ANSWER_LINE_STOP, COT_ANSWER_PATTERN, PromptTemplate, format_passages

ANSWER_FORMAT_EXAMPLES = """Question: Who produced the album that included a re-recording of "Lithium"?
Answer: Butch Vig
Question: What city was the victim of Joseph Druces working in?
Answer: Boston, Massachusetts
Question: In what year was the star of To Hell and Back born?
Answer: 1925"""
"""The three "Answer Format Example" pairs of Figures 7, 8 and 9."""

FORMAT_EXAMPLE_ANSWERS: tuple[str, ...] = ("Butch Vig", "Boston, Massachusetts", "1925")
"""The answers of `ANSWER_FORMAT_EXAMPLES`, which the answer validator rejects unless a passage holds them."""

UNKNOWN_INSTRUCTION = "If don't know the answer, just say unknown"
"""The abstention instruction of Liu et al., section 3.1 (Figure 7 wording, kept verbatim)."""

# Demonstration passages of Figures 8 and 9. The extraction cut each line at the column edge; the completions
# after the cut ("Canadian actor.", "the sequels", "Costas Mandylor ...") are ours.
_DEMO_PASSAGES = [
    Document(content="Peter Outerbridge Peter Outerbridge (born June 30, 1966) is a Canadian actor."),
    Document(
        content="Except the Dying 2008. On March 3, 2015, Acorn Media announced a re-release for all three movies, "
        "set for May 26, 2015."
    ),
    Document(
        content="Saw VI Saw VI is a 2009 American horror film directed by Kevin Greutert from a screenplay written by "
        'Patrick Melton and Marcus Dunstan. It is the sixth installment in the "Saw" franchise and stars Tobin Bell, '
        "Costas Mandylor, Mark Rolston, Betsy Russell, Shawnee Smith and Peter Outerbridge."
    ),
]
_DEMO_CONTEXT = format_passages(_DEMO_PASSAGES)
_DEMO_QUESTION = "Which 2009 movie does Peter Outerbridge feature as William Easton?"
_DEMO_ANSWER = "Saw VI"


def _one_shot_cot_template(*, rationale_format: str, demo_rationale: str) -> str:
    """The shared layout of Figures 8 and 9: task line, answer-format examples, format description (`rationale_format`
    says what the Rationale holds), the one-shot demonstration (`demo_rationale`), then the live context and question
    and "Rationale: Let's think step by step." for the model to continue."""
    return f"""Answer questions with short factoid answers.

{ANSWER_FORMAT_EXAMPLES}

Follow the following format.

Context: sources that may contain relevant content
Question: the question to be answered
Rationale: Let's think step by step. {rationale_format}
Answer: a short factoid answer, often between 1 and 5 words. Make sure generate "Answer:" for the final answer.
{UNKNOWN_INSTRUCTION} as answer.

Context:
{_DEMO_CONTEXT}
Question: {_DEMO_QUESTION}
Rationale: Let's think step by step. {demo_rationale}
Answer: {_DEMO_ANSWER}

Context:
{{{{ passages }}}}
Question: {{{{ query }}}}
Rationale: Let's think step by step."""


FIGURE7 = PromptTemplate(
    "figure7",
    "Liu et al., Appendix A, Figure 7",
    f"""Given the relevant background contexts, answer the current question using one of the context in short \
factoid phrase manner.
{ANSWER_FORMAT_EXAMPLES}
Try your best to guess an extractive answer. {UNKNOWN_INSTRUCTION}
Context: {{{{ passages }}}}
Question: {{{{ query }}}}
Answer:""",
    answer_pattern=r"^\s*(\S*(?:[^\S\n]+\S+)*)",
    demonstrations=FORMAT_EXAMPLE_ANSWERS,
    stop=ANSWER_LINE_STOP,
)
"""The zero-shot prompt of Concatenation, all top-k passages in `passages` (section 3.2.1, Eq. 1), and Post-Fusion,
one passage at a time (Eq. 2). The answer is the first line of the completion (after leading whitespace) without its
trailing whitespace; each whitespace run is read once, so a long run inside the line costs no backtracking."""

PRUNING = PromptTemplate(
    "pruning",
    "Liu et al., Appendix A, Figure 8",
    _one_shot_cot_template(
        rationale_format="a step-by-step deduction that identifies the correct response",
        demo_rationale="The question is asking for the 2009 movie that Peter Outerbridge was in as William Easton. "
        "We can "
        "use process of pruning to figure this out. Source 1 doesn't contain the information. In source 2, it "
        "talks about a made-for-TV movie in 2004. In source 3, it talks about the sixth installment in the "
        '"Saw" franchise. This must be the movie we are looking for.',
    ),
    answer_pattern=COT_ANSWER_PATTERN,
    demonstrations=(*FORMAT_EXAMPLE_ANSWERS, _DEMO_ANSWER),
)
"""The one-shot chain-of-thought Pruning prompt (section 3.2.2): the demonstration's rationale eliminates irrelevant
sources one by one ("Elimination Reasoning Demo")."""

SUMMARY = PromptTemplate(
    "summary",
    "Liu et al., Appendix A, Figure 9",
    _one_shot_cot_template(
        rationale_format="a step-by-step summary that identifies the correct response",
        demo_rationale="The question requires information on the 2009 movie that Peter Outerbridge was in as "
        "William Easton. "
        'From the sources, we can narrow down our focus to Source 3 that mentions "Saw VI", a movie released '
        "in 2009, in which Peter Outerbridge starred. By summarizing these details, the movie from 2009 "
        "featuring Peter Outerbridge is Saw VI.",
    ),
    answer_pattern=COT_ANSWER_PATTERN,
    demonstrations=(*FORMAT_EXAMPLE_ANSWERS, _DEMO_ANSWER),
)
"""The one-shot chain-of-thought Summary prompt (section 3.2.2): the demonstration's rationale summarizes the
relevant sources before answering ("Summary Reasoning Demo")."""

# Figure 7's three answer-format examples, each with a candidate line (the wrong candidates are ours).
_DISTILLER_EXAMPLES = """Question: Who produced the album that included a re-recording of "Lithium"?
Candidate answers: (a) Kurt Cobain (b) Butch Vig
Answer: Butch Vig
Question: What city was the victim of Joseph Druces working in?
Candidate answers: (a) Boston, Massachusetts (b) Salem
Answer: Boston, Massachusetts
Question: In what year was the star of To Hell and Back born?
Candidate answers: (a) 1955 (b) 1925
Answer: 1925"""

DISTILLER = PromptTemplate(
    "distiller",
    "Liu et al., section 3.3",
    f"""Given the relevant background contexts and the candidate answers proposed from them, answer the current \
question using one of the context in short factoid phrase manner.
{_DISTILLER_EXAMPLES}
Pick the candidate answer that the contexts support best, or give a better extractive answer from the contexts. \
{UNKNOWN_INSTRUCTION}
Context: {{{{ passages }}}}
Question: {{{{ query }}}}
Candidate answers:{{% for candidate in candidates %}} ({{{{ "abcdefghijklmnopqrstuvwxyz"[loop.index0 % 26] }}}}) \
{{{{ candidate | replace("\\n", " ") | trim }}}}{{% endfor %}}
Answer:""",
    answer_pattern=(
        r"^\s*(?:\([a-z]\)\s*)?("
        # the answer, read token by token up to the first place where a listed candidate or the line's end starts:
        r"(?:(?!\([a-z]\)\s)\S"  # a character that does not start a label "(b) "
        r"|[^\S\n]+(?!\([a-z]\)\s)(?=\S)"  # a whole run of spaces inside the line, not before a label
        # a trailing run of spaces up to its last character other than space or tab, unless the run goes on past the
        # line's end to a label
        r"|[^\S\n]*[^\S \t\n](?=[ \t]*(?:\n|$))(?![ \t]*\n\s*\([a-z]\)\s)"
        r")*)(?:\s*\([a-z]\)\s[^\n]*)?[ \t]*(?:\n|$)"
    ),
    demonstrations=("Butch Vig", "Boston, Massachusetts", "1925", "Kurt Cobain", "Salem", "1955"),
    stop=ANSWER_LINE_STOP,
)
"""The second round of PF+Concat (section 3.3, Figure 2 bottom). The paper gives no figure: the LLM "is prompted with
the concatenation of the unfiltered passages, along with the question and answer candidates generated from the first
round". We keep Figure 7's structure and add the candidates ("(a) X (b) Y", most votes first: variable `candidates`);
the format examples show a candidate line too, so that a completion-style model answers with one candidate instead of
copying the list. `passages` holds the passages whose post-fusion answer was not unknown. The answer is the first line
without a leading label "(a) " and without further candidates (" (b) ..."): "(a) Rollo (b) Ragnar" picked "Rollo".
Linear time: each run of whitespace is read as one token."""
