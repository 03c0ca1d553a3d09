"""
Model replies for fuzzing, and the table of every function of the package that reads model output.

`replies` is a hypothesis strategy of replies a parser must survive: arbitrary and hostile Unicode, replies built
from the prompts' own vocabulary with nested and unbalanced markers; `huge_replies` gives 100,000 to 1,000,000
characters. `PARSERS` names each parser of model output with how to call it on a reply and the shape it must return.
The unit tests and the parser benchmark run the same table. Needs hypothesis (the `dev` extra).

### Usage example
```python
from hypothesis import given
from tests.support.fuzzing import PARSERS, replies


@given(reply=replies)
def test_never_raises(reply):
    for parser in PARSERS.values():
        assert parser.check(parser.run(reply))
```
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from haystack_fusion.answers import (
    UnknownDetector,
    VoteResult,
    answer_confidence,
    clean_answer,
    majority_vote,
    normalize_answer,
)
from haystack_fusion.components.candidate_summarizer import clean_summary
from haystack_fusion.notes import RELEVANCE_LABELS, ParsedNotes, classify_note, parse_document_note, parse_single_call
from haystack_fusion.prompts import PROMPTS, extract_answer, strip_delimiters
from haystack_fusion.prompts.sure import one_line
from haystack_fusion.sure import (
    PREFERENCE_CHOICES,
    VALIDITY_CHOICES,
    choice_probability,
    parse_candidates,
    parse_preference,
    parse_validity,
    summary_is_label,
)

HOSTILE_CHARACTERS = (
    "\x00\x01\x07\x08\x0b\x0c\x1b\x1f\x7f\x85"  # control characters, NEL
    "\u00a0\u2000\u2003\u3000\u2028\u2029"  # no-break, em, ideographic spaces; line and paragraph separators
    "\u200b\u200c\u200d\u2060\ufeff"  # zero-width space / non-joiner / joiner, word joiner, BOM
    "\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"  # directional marks, embeddings, isolates
    "\u0301\u0308\u0336\u20dd"  # combining marks
    "İıßẞﬁ\u212a\u017f"  # case mappings that change length or fold to ASCII (Kelvin sign, long s)
    "１２١٢߁𝟏𝐀"  # digits and letters outside ASCII (\d matches the digits)
    "“”‘’„«»`*_#>[](){}<>|\\/\"'.,;:!?-–—"  # quotes and punctuation the parsers strip or split on
    "👍🏽\U0001f600\U000e0041"  # emoji with a modifier, a tag character
)

VOCABULARY = (
    # SuRe candidates (Listing 6) and list markers
    "(a)", "(b) ", "(c)", "(z)", "a)", "b.", "A.", "1.", "2)", "(1)", "(2)", "(1000)", "Candidate 1:", "Option B:",
    "- ", "* ", "• ", "[DONE]", "[ done ]", "Answer:", "**Answer:**", "Final answer:", "Candidates:",
    # validity (Listing 8) and ranking (Listing 9)
    "True", "False", "true.", "not true", "isn't false", "yes", "No", "Choices: [True, False].", "Choices: [",
    "Passage 1", "Passage 2", "Passage #2", "passage2", "Passage No. 1", "passage one", "the first", "second one",
    "both", "neither", "Passage 1 and Passage 2", "1", "2", "[1]", "(2)",
    # Chain-of-Note notes and labels
    "Passage #1", "Passage #3", "Wikipedia passage #2", "Passages #1 and #3", "Passages #2-#4", "Document 2", "[1, 3]",
    "Based on the information given in above passages, the answer is", "the answer is", "The final answer is",
    ", so", "therefore", "Reading notes:", "Question:", "Task Description:", "Relevance:", "**Relevance:**",
    "(a) answers directly", "(b) useful context", "(c) irrelevant", "Label:", "not relevant", "does not mention",
    "but", "nothing to do with", "unknown", "I don't know", "The context does not provide the answer.",
    # passage delimiters (prompts/templates.py)
    '<passage key="deadbeef">', '</passage key="deadbeef">', "<passage key=", "</passage>", '[1] <passage key="0a">',
    # answers, abbreviations, separators
    "Paris", "Lyon", "1996", "Washington, D.C.", "U.S.", "The Eiffel Tower", "a", "an", "the",
    " ", "  ", "\n", "\n\n", "\t", "\r\n", ",", ";", ":", ".", "...", "!", "?", "'", '"', "**", "__", "#", ">",
)  # fmt: skip

NESTING = [("(", ")"), ("[", "]"), ("**", "**"), ('<passage key="ab">', '</passage key="ab">'), ("(a) ", " (b) ")]

hostile_text = st.text(alphabet=st.sampled_from(HOSTILE_CHARACTERS), max_size=60)
"""Only the characters parsers trip over."""
any_text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=200)
"""Arbitrary Unicode text (no lone surrogates: they cannot be encoded, so no model replies with one)."""
vocabulary_reply = st.lists(
    st.one_of(st.sampled_from(VOCABULARY), hostile_text.filter(lambda text: len(text) < 6), st.text(max_size=6)),
    max_size=40,
).map("".join)
"""Replies made of the prompts' own words and markers, mixed with hostile characters."""
nested_reply = st.recursive(
    st.sampled_from(VOCABULARY),
    lambda inner: st.one_of(
        st.tuples(st.sampled_from(NESTING), inner).map(lambda pair: pair[0][0] + pair[1] + pair[0][1]),
        st.tuples(st.sampled_from(NESTING), inner).map(lambda pair: pair[0][0] + pair[1]),  # unbalanced
        st.lists(inner, min_size=2, max_size=4).map("".join),
        st.tuples(inner, st.integers(2, 30)).map(lambda pair: pair[0] * pair[1]),  # repeated
    ),
    max_leaves=12,
)
"""Markers inside markers, balanced or not, and repeated."""
replies = st.one_of(any_text, hostile_text, vocabulary_reply, nested_reply)

ADVERSARIAL_UNITS = (
    " ", "\n", "\t ", ".", "*", "_", ",", "a", "a.", "1", "(a) ", "(a)", "a) ", "1. ", "(1) ", "Answer: ", "answer",
    "**", "Passage ", "Passage #", "passage 1, ", "<passage key=", '<passage key="ab">', "Choices: [", "the answer is ",
    ", so ", "based on ", "Relevance: ", "Question: ", "reading notes ", "the ", "not ", "[DONE]", "True ", "\u200b",
)  # fmt: skip
"""Units whose repetition makes a greedy pattern backtrack, each quantifier against the next."""


def huge_reply(unit: str, characters: int, head: str = "", tail: str = "") -> str:
    """`head`, then `unit` repeated to about `characters` characters, then `tail`."""
    return head + unit * max(1, characters // len(unit)) + tail


huge_replies = st.builds(
    huge_reply,
    unit=st.sampled_from(ADVERSARIAL_UNITS),
    characters=st.integers(100_000, 1_000_000),
    head=st.sampled_from(["", "Passage", "Answer:", "question", "(a)", "x", "based on x,", "relevance"]),
    tail=st.sampled_from(["", "x", "!", ":", "1", "é", "\n"]),
)


def meta_from(reply: str) -> dict[str, Any]:
    """
    A reply's text as OpenAI-style token log-probabilities: the text cut into tokens (whitespace + word), each with a
    log-probability and alternatives that spell choices, so that `answer_confidence` and `choice_probability` read it.
    """
    tokens = re.findall(r"\s*\S+|\s+", reply)
    return {
        "logprobs": {
            "content": [
                {
                    "token": token,
                    "logprob": -(index % 7) / 3,
                    "top_logprobs": [{"token": alternative, "logprob": -1.5} for alternative in (" True", "2", "no")],
                }
                for index, token in enumerate(tokens)
            ]
        }
    }


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.sampled_from(["True", " 1", "Passage", "false"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["token", "logprob", "x"]), inner),
    max_leaves=10,
)
token_entries = st.fixed_dictionaries(
    {"token": st.one_of(st.sampled_from([" True", "false", "1", " Passage", "2.", "\n"]), st.text(max_size=6))},
    optional={
        "logprob": st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**6), 10**6)),
        "top_logprobs": st.one_of(
            st.lists(st.one_of(json_values, st.dictionaries(st.just("token"), json_values))), json_values
        ),
        "bytes": json_values,
    },
)
hostile_metas = st.one_of(
    st.none(),
    st.dictionaries(st.sampled_from(["logprobs", "content", "usage"]), json_values),
    st.builds(lambda entries: {"logprobs": {"content": entries}}, st.lists(token_entries, max_size=8)),
    st.builds(lambda entries: {"logprobs": entries}, st.lists(token_entries, max_size=8)),
)
"""Log-probabilities as a generator might misreport them: wrong types, missing keys, NaN, infinities, huge values."""

# ---------------------------------------------------------------------------------------------------------------------
# The parsers and the shape each promises


def is_probability(value: Any) -> bool:
    return value is None or (isinstance(value, float) and 0.0 <= value <= 1.0)


def check_candidates(result: Any, k: int) -> bool:
    keys = [normalize_answer(candidate) for candidate in result]
    return (
        isinstance(result, list)
        and all(isinstance(candidate, str) for candidate in result)
        and len(result) <= k
        and all(keys)
        and len(set(keys)) == len(keys)
    )


def check_parsed_notes(result: Any, k: int) -> bool:
    return (
        isinstance(result, ParsedNotes)
        and len(result.notes) == len(result.mentioned) == k
        and all(isinstance(note, str) and "\n" not in note for note in result.notes)
        and all(isinstance(flag, bool) for flag in result.mentioned)
        and isinstance(result.answer, str)
        and result.answer == " ".join(result.answer.split())
    )


def check_vote(result: Any) -> bool:
    return (
        isinstance(result, VoteResult)
        and isinstance(result.answer, str)
        and len(result.candidates) == len(result.votes) == len(result.best_rank)
        and all(count >= 1 for count in result.votes.values())
    )


@dataclass(frozen=True)
class Parser:
    """One parser of model output: how to call it on a reply, and what it must return."""

    call: Callable[[Any], Any]
    """Runs the parser on what `prepare` made of a reply."""
    check: Callable[[Any], bool]
    prepare: Callable[[str], Any] = lambda reply: reply
    """The parser's input made from a reply (log-probabilities for the parsers that read them); not timed by
    the parser benchmark."""

    def run(self, reply: str) -> Any:
        return self.call(self.prepare(reply))


DETECTOR = UnknownDetector()

# The patterns that read answers out of replies (prompts/*.py), by the prompts that use them.
_ANSWER_PATTERNS: dict[str, str] = {}
for _prompt in PROMPTS.values():
    _ANSWER_PATTERNS.setdefault(_prompt.answer_pattern, _prompt.name)

PARSERS: dict[str, Parser] = {
    # answers.py
    "normalize_answer": Parser(normalize_answer, lambda result: isinstance(result, str)),
    "clean_answer": Parser(clean_answer, lambda result: isinstance(result, str)),
    "UnknownDetector.is_unknown": Parser(DETECTOR.is_unknown, lambda result: isinstance(result, bool)),
    "majority_vote": Parser(lambda reply: majority_vote(reply.splitlines()), check_vote),
    "answer_confidence": Parser(
        lambda meta_and_answer: answer_confidence(*meta_and_answer),
        is_probability,
        prepare=lambda reply: (meta_from(reply), reply[len(reply) // 3 : len(reply) // 2]),
    ),
    # sure.py
    "parse_candidates": Parser(lambda reply: parse_candidates(reply, 3), lambda result: check_candidates(result, 3)),
    "parse_validity": Parser(parse_validity, lambda result: isinstance(result, bool)),
    "parse_preference": Parser(parse_preference, lambda result: result in (1, 2, None)),
    "summary_is_label": Parser(
        lambda reply: summary_is_label(reply, ["Paris", reply[:20]]), lambda result: isinstance(result, bool)
    ),
    "choice_probability": Parser(
        lambda meta: (choice_probability(meta, VALIDITY_CHOICES), choice_probability(meta, PREFERENCE_CHOICES)),
        lambda result: all(is_probability(value) for value in result),
        prepare=meta_from,
    ),
    # notes.py
    "parse_single_call": Parser(
        lambda reply: parse_single_call(reply, 4), lambda result: check_parsed_notes(result, 4)
    ),
    "parse_document_note": Parser(
        parse_document_note,
        lambda result: isinstance(result[0], str) and "\n" not in result[0] and result[1] in (*RELEVANCE_LABELS, None),
    ),
    "classify_note": Parser(
        lambda reply: classify_note(reply, reply[: len(reply) // 2]), lambda result: result in RELEVANCE_LABELS
    ),
    # prompts: the passage delimiters a reply echoes, the one-line form of a summary, the answer patterns
    "strip_delimiters": Parser(strip_delimiters, lambda result: isinstance(result, str)),
    "one_line": Parser(one_line, lambda result: isinstance(result, str) and result == " ".join(result.split())),
    # components/candidate_summarizer.py (read only here)
    "clean_summary": Parser(clean_summary, lambda result: isinstance(result, str) and result == result.strip()),
    **{
        f"extract_answer[{name}]": Parser(
            functools.partial(extract_answer, pattern),
            lambda result: isinstance(result, str) and result == result.strip(),
        )
        for pattern, name in _ANSWER_PATTERNS.items()
    },
}
"""Every function of the package that reads model output, by name; the parser benchmark runs the same table."""
