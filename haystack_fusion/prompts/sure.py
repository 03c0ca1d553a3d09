"""
Kim et al. (SuRe, ICLR 2024, arXiv:2404.13081), Appendix A: the prompts of SuRe and of its baselines, Listings 6-13,
passages in the "titled" layout. The listings are written for K = 2 ("two", "(a) xx, (b) yy"); for other K the number
word and the form grow with K. Summaries are shown on one line each, as the listings show them.
"""

from __future__ import annotations

from haystack_fusion.prompts.templates import ANSWER_LINE_STOP, PromptTemplate, number_words

CHOICE_LETTERS = "abcdefghijklmnopqrstuvwxyz"  # "(a)", "(b)", ... (Listings 6, 7, 12); the 27th wraps to "(a)"
DONE_MARKER = "[DONE]"  # Listings 7 and 11's end of a summary

# The Choices line, "(a) Choice 1 (b) Choice 2" (Listings 7 and 12), from the variable `candidates`.
_CHOICES = (
    "{% for candidate in candidates %}{% if not loop.first %} {% endif %}"
    '({{ "' + CHOICE_LETTERS + '"[loop.index0 % 26] }}) {{ candidate.split() | join(" ") }}{% endfor %}'
)

SHORT_ANSWER_PATTERN = (
    r"^\s*(?:\([a-z]\)\s*)?("
    # the answer, read token by token up to the first place where a listed choice or the line's end starts:
    r"(?:(?!\([a-z]\)\s)[^\s.]"  # a character other than a period that does not start a label "(b) "
    # a whole run of spaces and periods inside the line, unless it ends in a space before a label
    r"|(?:[^\S\n]|\.)*(?:\.|[^\S\n](?!\([a-z]\)\s))(?=[^\s.])"
    r"|(?:[^\S\n]|\.)*\.(?=[^\S\n]+\([a-z]\)\s)"  # such a run up to its last period, when spaces and a label follow
    # a trailing run up to its last character other than space, tab or period, unless that character is in spaces
    # that go on past the line's end to a label
    r"|(?:[^\S\n]|\.)*[^\S \t\n](?=[ \t.]*(?:\n|$))(?![ \t]*\n\s*\([a-z]\)\s)"
    # in that last case: the trailing run up to its last period
    r"|(?:[^\S\n]|\.)*\.(?=[^\S\n]*[^\S \t\n][^\S\n]*\n\s*\([a-z]\)\s)"
    r")*)(?:\s*\([a-z]\)\s[^\n]*)?[ \t.]*(?:\n|$)"
)
"""Listings 10-12's answer: the completion's first line without a leading "(a) ", further choices ("France (b)
Germany" picked "France") and a trailing period. Linear time."""

CANDIDATES = PromptTemplate(
    "sure_candidates",
    "Kim et al., Appendix A.1, Listing 6",
    """Below are {{ num_passages }} passages related to the question at the end. After reading the passages, \
provide {{ k_words }} correct candidates for the answer to the question at the end. Each answer should be in the form: \
{{ answer_form }}, and should not exceed 3 words for each candidate.

{{ passages }}

Question: {{ query }}

Answer:""",
)
"""p_can (Eq. 2). Variables: `num_passages`, `k_words` and `answer_form` (`candidate_prompt_variables`), `passages`,
`query`."""

FEW_SHOT_EXAMPLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ('Who produced the album that included a re-recording of "Lithium"?', ("Butch Vig", "Kurt Cobain", "Steve Albini")),
    ("What city was the victim of Joseph Druces working in?", ("Boston, Massachusetts", "Salem", "Cambridge")),
    ("In what year was the star of To Hell and Back born?", ("1925", "1955", "1945")),
)
"""Listing 13's demonstrations: Liu et al.'s answer-format questions (gold answer first), candidates of ours."""

FEW_SHOT_CANDIDATE_ANSWERS: tuple[str, ...] = tuple(answer for _, answers in FEW_SHOT_EXAMPLES for answer in answers)

FEW_SHOT_CANDIDATES = PromptTemplate(
    "sure_few_shot_candidates",
    "Kim et al., Appendix B.5, Listing 13",
    """Below are {{ num_passages }} passages related to the question at the end. We also provide the \
answers for various questions. After reading the passages and question-answer pairs, provide {{ k_words }} correct \
candidates for the answer to the question at the end. Each answer should be in the form: {{ answer_form }}, and should \
not exceed 3 words for each candidate.

{{ passages }}

{% for example in examples %}Question: {{ example.question }}
Answer: {{ example.answer }}

{% endfor %}Question: {{ query }}
Provide {{ k_words }} correct candidates for the answer:""",
    demonstrations=FEW_SHOT_CANDIDATE_ANSWERS,
)
"""Listing 6 with question-answer demonstrations (Appendix B.5), for base models. Variables: as Listing 6, plus
`examples` (`few_shot_examples(k)`)."""

_CONDITIONAL_SUMMARY = (
    """{{ passages }}

Your job is to act as a professional writer. You will write a good-quality passage that can support the given \
prediction about the question only based on the information in the provided supporting passages.

Now, let's start. After you write, please write [DONE] to indicate you are done. Do not write a prefix (e.g., \
"Response:") while writing a passage.

Question: {{ query }}
Choices: """
    + _CHOICES
    + """
Prediction: ({{ \""""
    + CHOICE_LETTERS
    + """"[target % 26] }}) {{ candidates[target].split() | join(" ") }}
Passage:"""
)

CONDITIONAL_SUMMARY = PromptTemplate("sure_summary", "Kim et al., Appendix A.2, Listing 7", _CONDITIONAL_SUMMARY)
"""p_sum (Eq. 3). Variables: `passages`, `query`, `candidates` (all K), `target` (0-based, the supported one)."""

_SUMMARY_HEAD, _SUMMARY_TAIL = _CONDITIONAL_SUMMARY.split("Question: {{ query }}", 1)

# A made-up question (no real answer to copy): a summary is full sentences ending [DONE], not the next choice label.
_FEW_SHOT_SUMMARY_EXAMPLE = """Question: Which river flows through the town of Example?
Choices: (a) River Alpha (b) River Beta
Prediction: (a) River Alpha
Passage: The town of Example was built on both banks of the River Alpha, which flows through its centre, so the \
river that flows through the town is the River Alpha. [DONE]

"""

FEW_SHOT_SUMMARY = PromptTemplate(
    "sure_few_shot_summary",
    "Kim et al., Appendix A.2, Listing 7 (with a demonstration, as Listing 13)",
    _SUMMARY_HEAD + _FEW_SHOT_SUMMARY_EXAMPLE + "Question: {{ query }}" + _SUMMARY_TAIL,
)
"""Listing 7 with one demonstration, for base models, which otherwise continue the Choices list (`summary_is_label`).
Variables: as Listing 7."""

GENERIC_SUMMARY = PromptTemplate(
    "sure_generic_summary",
    "Kim et al., Appendix A.6, Listing 11",
    """{{ passages }}

Your job is to act as a professional writer. You will write a good-quality passage that can support the prediction \
about the question only based on the information in the provided supporting passages.

Now, let's start. After you write, please write [DONE] to indicate you are done. Do not write a prefix (e.g., \
"Response:") while writing a passage.

Question: {{ query }}
Passage:""",
)
"""Generic summarization (section 4.3 "Sum-and-pred (Gen)"). Variables: `passages`, `query`."""

VALIDITY = PromptTemplate(
    "sure_validity",
    "Kim et al., Appendix A.3, Listing 8",
    """Question: {{ query }}

Prediction: {{ prediction | replace("\\n", " ") | trim }}

Passage: {{ summary }}

Does the passage correctly support the prediction? Choices: [True, False]. Answer:""",
)
"""p_val (Eq. 4). Variables: `query`, `prediction` (the candidate), `summary` (its summary, one line)."""

RANKING = PromptTemplate(
    "sure_ranking",
    "Kim et al., Appendix A.4, Listing 9",
    """Question: Given the following passages, determine which one provides a more informative answer to the \
subsequent question.

Passage 1: {{ summary_1 }}

Passage 2: {{ summary_2 }}

Target Question: {{ query }}

Your Task:
Identify which passage (Passage 1 or Passage 2) is more relevant and informative to answer the question at hand. \
Choices: [Passage 1, Passage 2].

Answer:""",
)
"""p_rank (Eq. 5). Variables: `query`, `summary_1`, `summary_2` (one line each)."""

BASE = PromptTemplate(
    "sure_base",
    "Kim et al., Appendix A.5, Listing 10",
    """{{ passages }}

Task description: predict the answer to the following question. Do not exceed 3 words.

Question: {{ query }}

Answer:""",
    answer_pattern=SHORT_ANSWER_PATTERN,
    stop=ANSWER_LINE_STOP,
)
"""Base. Variables: `passages` (titled layout), `query`."""

MCQ = PromptTemplate(
    "sure_mcq",
    "Kim et al., Appendix A.7, Listing 12",
    """{{ passages }}

Task description: predict the answer to the following question. Do not exceed 3 words.

Question: {{ query }}
Choices: """
    + _CHOICES
    + """
Answer:""",
    answer_pattern=SHORT_ANSWER_PATTERN,
    stop=ANSWER_LINE_STOP,
)
"""MCQ prompt: Listing 10 with the Eq. 2 candidates as choices. Variables: `passages`, `query`, `candidates`."""

SUM_AND_PRED = PromptTemplate(
    "sure_sum_and_pred",
    "Kim et al., section 4.3, Table 3",
    """{% for summary in summaries %}Passage #{{ loop.index }} Text: {{ summary | replace("\\n", " ") | \
trim }}

{% endfor %}Task description: predict the answer to the following question. Do not exceed 3 words.

Question: {{ query }}

Answer:""",
    answer_pattern=SHORT_ANSWER_PATTERN,
    stop=ANSWER_LINE_STOP,
)
"""Table 3 "Sum-and-pred (Gen)": Listing 10 over the generic summary (Listing 11). Variables: `summaries`, `query`."""

SUM_ALL = PromptTemplate(
    "sure_sum_all",
    "Kim et al., section 4.3, Table 3",
    """{{ passages }}
{% for summary in summaries %}
Summary #{{ loop.index }}: {{ summary | replace("\\n", " ") | trim }}
{% endfor %}
Task description: predict the answer to the following question. Do not exceed 3 words.

Question: {{ query }}

Answer:""",
    answer_pattern=SHORT_ANSWER_PATTERN,
    stop=ANSWER_LINE_STOP,
)
"""Table 3 "+ Conditional summarizations" (no listing): Listing 10 with the K summaries after the passages.
Variables: `passages`, `summaries`, `query`."""

_PLACEHOLDERS = ("xx", "yy", "zz", "ww", "vv", "uu", "tt", "ss", "rr", "qq")


def candidate_prompt_variables(k: int) -> dict[str, str]:
    """Listing 6's `k_words` and `answer_form` ("two", "(a) xx, (b) yy" for K = 2); ValueError for K below 1."""
    if k < 1:
        raise ValueError(f"The number of candidates must be at least 1, got {k}")
    form = ", ".join(f"({CHOICE_LETTERS[i % 26]}) {_PLACEHOLDERS[i % len(_PLACEHOLDERS)]}" for i in range(k))
    return {"k_words": number_words(k), "answer_form": form}


def few_shot_examples(k: int) -> list[dict[str, str]]:
    """Listing 13's demonstrations (`question`, `answer`) with the first K (at most 3) candidates each."""
    return [
        {"question": question, "answer": ", ".join(f"({CHOICE_LETTERS[i]}) {c}" for i, c in enumerate(candidates[:k]))}
        for question, candidates in FEW_SHOT_EXAMPLES
    ]


def one_line(text: str | None) -> str:
    """A summary as the verification prompts show it: on one line ("" for None)."""
    return " ".join((text or "").split())
