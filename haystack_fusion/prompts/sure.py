"""
Kim et al. (SuRe, ICLR 2024, arXiv:2404.13081), Appendix A: the prompts of SuRe and of its baselines, Listings 6-13.

The wording and layout follow the listings; passages are listed in the "titled" layout of `format_passages`
("Passage #i Title: ..." / "Passage #i Text: ..."), each text inside its delimited block. The listings are written for
K = 2 ("provide two correct candidates", "(a) xx, (b) yy"); for other K the number word and the form grow with K.
Summaries are model output: they are shown on one line each (whitespace collapsed), as the listings show them.
"""

from __future__ import annotations

from haystack_fusion.prompts.templates import ANSWER_LINE_STOP, PromptTemplate, number_words

CHOICE_LETTERS = "abcdefghijklmnopqrstuvwxyz"
"""Candidate labels "(a)", "(b)", ... (Listings 6, 7, 12); the 27th candidate wraps to "(a)" again."""

DONE_MARKER = "[DONE]"
"""What Listings 7 and 11 ask the model to write after the summary; it is cut from the summary with what follows."""

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
"""Listings 10-12 end with "Answer:": the answer is the first line of the completion, without a leading choice label
"(a) ", without further listed choices (" (b) ...": a model that answers "France (b) Germany" picked "France") and
without a trailing period. Linear time: each run of whitespace and periods is read as one token."""

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
"""p_can (Eq. 2). Variables: `num_passages` (N), `k_words` ("two" for K = 2), `answer_form` ("(a) xx, (b) yy" for
K = 2): both from `candidate_prompt_variables(k)`, `passages` (titled layout), `query`."""

FEW_SHOT_EXAMPLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ('Who produced the album that included a re-recording of "Lithium"?', ("Butch Vig", "Kurt Cobain", "Steve Albini")),
    ("What city was the victim of Joseph Druces working in?", ("Boston, Massachusetts", "Salem", "Cambridge")),
    ("In what year was the star of To Hell and Back born?", ("1925", "1955", "1945")),
)
"""Demonstrations for Listing 13: Liu et al.'s three answer-format questions (their gold answer first), each with
further plausible candidates of ours, so that a completion-style model sees the "(a) xx, (b) yy" form filled in."""

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
"""Listing 6 with question-answer demonstrations (Appendix B.5, Table 9), for base models that continue text rather
than follow instructions. Variables: as Listing 6, plus `examples` (`question`, `answer` = the K candidates in the
answer form) from `few_shot_examples(k)`."""

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
"""p_sum (Eq. 3). Variables: `passages`, `query`, `candidates` (all K), `target` (0-based index of the candidate this
summary supports)."""

_SUMMARY_HEAD, _SUMMARY_TAIL = _CONDITIONAL_SUMMARY.split("Question: {{ query }}", 1)

# A made-up question whose names ("River Alpha") cannot be mistaken for a real answer or copied into one, showing that
# a summary is a passage of full sentences that ends with [DONE], not the next choice label.
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
"""Listing 7 with one demonstration before the question, for base models (as Listing 13 does for Listing 6): without
it, a base model continues the Choices / Prediction list and returns a candidate's label as its "summary"
(`haystack_fusion.sure.summary_is_label`). Variables: as Listing 7."""

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
"""Table 3 "Sum-and-pred (Gen)": Listing 10 with the generic summary (Listing 11) in place of the passages.
Variables: `summaries` (the one generic summary; empty when nothing was retrieved), `query`."""

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
"""Table 3 "+ Conditional summarizations": Listing 10 with all K conditional summaries appended after the passages
as "Summary #k:" lines (the paper shows no listing for it). Variables: `passages`, `summaries`, `query`."""

_PLACEHOLDERS = ("xx", "yy", "zz", "ww", "vv", "uu", "tt", "ss", "rr", "qq")


def candidate_prompt_variables(k: int) -> dict[str, str]:
    """The K-dependent words of Listing 6, `k_words` and `answer_form`: "two" and "(a) xx, (b) yy" for K = 2;
    ValueError for K below 1."""
    if k < 1:
        raise ValueError(f"The number of candidates must be at least 1, got {k}")
    form = ", ".join(f"({CHOICE_LETTERS[i % 26]}) {_PLACEHOLDERS[i % len(_PLACEHOLDERS)]}" for i in range(k))
    return {"k_words": number_words(k), "answer_form": form}


def few_shot_examples(k: int) -> list[dict[str, str]]:
    """The three Listing 13 demonstrations for K candidates (`question`, `answer`): each answer is "(a) .., (b) .."
    with the first K (at most three) candidates of `FEW_SHOT_EXAMPLES`."""
    return [
        {"question": question, "answer": ", ".join(f"({CHOICE_LETTERS[i]}) {c}" for i, c in enumerate(candidates[:k]))}
        for question, candidates in FEW_SHOT_EXAMPLES
    ]


def one_line(text: str | None) -> str:
    """A summary as the verification prompts show it: whitespace collapsed to single spaces ("" for None)."""
    return " ".join((text or "").split())
