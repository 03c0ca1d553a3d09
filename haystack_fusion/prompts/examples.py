"""
Few-shot material shared by the prompts of Liu et al. (Appendix A, Figures 7-9), kept in one place.

The paper's figures are text extractions of a PDF whose right-hand columns were cut; where a demonstration passage
or rationale is visibly truncated, the missing words are completed here from the visible fragments and marked in
the comments. The structure (task line, three answer-format examples, format description, one-shot demonstration,
then the live context and question) follows the figures exactly.
"""

from __future__ import annotations

from haystack import Document

from haystack_fusion.prompts.passages import format_passages

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
DEMO_PASSAGES = [
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
DEMO_CONTEXT = format_passages(DEMO_PASSAGES)
DEMO_QUESTION = "Which 2009 movie does Peter Outerbridge feature as William Easton?"
DEMO_ANSWER = "Saw VI"


def one_shot_cot_template(*, rationale_format: str, demo_rationale: str) -> str:
    """
    The shared layout of the one-shot chain-of-thought prompts (Liu et al., Figures 8 and 9).

    Task line, the three answer-format examples, the "Follow the following format." description, the one-shot
    demonstration over `DEMO_PASSAGES`, then the live `passages` and `query` and "Rationale: Let's think step by
    step." for the model to continue.

    :param rationale_format: What the Rationale field holds, as the figure's format description says it.
    :param demo_rationale: The demonstration's rationale after "Let's think step by step.".
    :returns: The Jinja template text (variables `passages`, `query`).
    """
    return f"""Answer questions with short factoid answers.

{ANSWER_FORMAT_EXAMPLES}

Follow the following format.

Context: sources that may contain relevant content
Question: the question to be answered
Rationale: Let's think step by step. {rationale_format}
Answer: a short factoid answer, often between 1 and 5 words. Make sure generate "Answer:" for the final answer.
{UNKNOWN_INSTRUCTION} as answer.

Context:
{DEMO_CONTEXT}
Question: {DEMO_QUESTION}
Rationale: Let's think step by step. {demo_rationale}
Answer: {DEMO_ANSWER}

Context:
{{{{ passages }}}}
Question: {{{{ query }}}}
Rationale: Let's think step by step."""


_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def number_words(n: int) -> str:
    """
    A count as the papers' prompts write it: "two" candidates (Kim et al., Listing 6), "five" passages (Yu et al.,
    Appendix A.5).

    :param n: A count (>= 0).
    :returns: The number in words up to ten, else in digits.
    """
    return _NUMBER_WORDS[n] if 0 <= n < len(_NUMBER_WORDS) else str(n)
