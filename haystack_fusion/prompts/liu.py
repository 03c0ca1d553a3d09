"""
Liu et al. (KnowLLM 2024, arXiv:2308.12574), Appendix A: Figure 7 (Concatenation and Post-Fusion), Figures 8-9
(Pruning, Summary) and the distiller of PF+Concat (section 3.3). Words the PDF's extraction cut from a demonstration
are completed (marked in the comments). Every template reads `passages` and `query`.
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
UNKNOWN_INSTRUCTION = "If don't know the answer, just say unknown"  # section 3.1, Figure 7's wording verbatim

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
    """The shared layout of Figures 8 and 9, with what the Rationale holds and the demonstration's rationale."""
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
"""Concatenation's prompt, all top-k passages (section 3.2.1, Eq. 1), and Post-Fusion's, one passage (Eq. 2). The
answer is the completion's first line, stripped (linear time)."""

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
"""Pruning (section 3.2.2): the demonstration eliminates irrelevant sources one by one."""

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
"""Summary (section 3.2.2): the demonstration summarizes the relevant sources before answering."""

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
"""PF+Concat's second round (section 3.3; no figure: "the concatenation of the unfiltered passages, along with the
question and answer candidates generated from the first round"): Figure 7 with `candidates` ("(a) X (b) Y", most votes
first), also in the format examples. The answer is the first line without a leading "(a) " or further candidates
("(a) Rollo (b) Ragnar" picked "Rollo"); linear time."""
