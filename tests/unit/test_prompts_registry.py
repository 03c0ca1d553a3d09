"""
The prompt registry's answer patterns and `extract_answer`, and a differential test of the linear-time patterns.

Five answer patterns of `haystack_fusion/prompts` (the whole reply, figure7, the distiller, SuRe's short answer,
Chain-of-Note's synthesis) read every run of whitespace once, where the plain reading with a lazy group is quadratic in
such a run. Here both are run on the same replies and must agree on everything a reader sees: whether the pattern
matches, the first group as Haystack's AnswerBuilder reads it (`match.group(1)`, unstripped), `extract_answer`'s
answer, and the answer of a real AnswerBuilder.

The test runs the fuzz profile of `fuzz_settings.py` ("fuzz-ci" in CI); `FUZZ_PROFILE=fuzz-50k` runs 50,000
replies.
"""

from __future__ import annotations

import re

import pytest
from haystack.components.builders import AnswerBuilder
from hypothesis import example, given
from hypothesis import strategies as st

from haystack_fusion.prompts import (
    COT_ANSWER_PATTERN,
    PROMPTS,
    WHOLE_REPLY_PATTERN,
    extract_answer,
    sure,
)
from tests.support.fuzzing import ADVERSARIAL_UNITS, HOSTILE_CHARACTERS, VOCABULARY, replies
from tests.unit.fuzz_settings import FUZZ

REFERENCE: dict[str, str] = {
    "whole_reply": r"^\s*([\s\S]*?)\s*$",
    "figure7": r"^\s*([^\n]*?)\s*(?:\n|$)",
    "distiller": r"^\s*(?:\([a-z]\)\s*)?([^\n]*?)(?:\s*\([a-z]\)\s[^\n]*)?[ \t]*(?:\n|$)",
    "sure_short_answer": r"^\s*(?:\([a-z]\)\s*)?([^\n]*?)(?:\s*\([a-z]\)\s[^\n]*)?[ \t.]*(?:\n|$)",
    "chain_of_note": r"^\s*([^\n]*?)[ \t.]*(?:\n|$)",
}
"""The plain reading of each answer pattern, with a lazy group: easy to check by eye, quadratic in a run of spaces."""

REWRITTEN: dict[str, tuple[str, str]] = {
    "whole_reply": (REFERENCE["whole_reply"], WHOLE_REPLY_PATTERN),
    "figure7": (REFERENCE["figure7"], PROMPTS["figure7"].answer_pattern),
    "distiller": (REFERENCE["distiller"], PROMPTS["distiller"].answer_pattern),
    "sure_short_answer": (REFERENCE["sure_short_answer"], sure.SHORT_ANSWER_PATTERN),
    "chain_of_note": (REFERENCE["chain_of_note"], PROMPTS["con_synthesis"].answer_pattern),
}
"""(reference pattern, the package's pattern) by name."""

PIECES = (
    " ", "  ", "\t", "\n", "\n\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\xa0", "\u1680", "\u2000",
    "\u2009", "\u2028", "\u2029", "\u202f", "\u3000", "\u200b", "\ufeff", ".", "..", ". ", " .", "(", ")", "a", "b",
    "z", "A", "1", "é", "(a)", "(b)", "(z)", "(A)", "(ab)", "(a) ", "(b) ", " (b) ", "(c)\n", "(c)\t", "(d)\xa0",
    "(e).", "Paris", "France", "Answer:", "the answer is", "x",
)  # fmt: skip
"""What the patterns read: whitespace of every kind (Unicode spaces, line and paragraph separators, `\\r`), periods,
choice labels with and without the whitespace a label needs, and words."""

pattern_replies = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)
"""Short replies made of the pieces the patterns' branches turn on."""
run_replies = st.builds(
    lambda head, unit, count, tail: head + unit * count + tail,
    head=pattern_replies,
    unit=st.sampled_from(PIECES + ADVERSARIAL_UNITS),
    count=st.integers(0, 300),
    tail=pattern_replies,
)
"""Long runs of one piece (the inputs that make the reference patterns backtrack) between short replies."""
hostile_replies = st.lists(st.sampled_from((*HOSTILE_CHARACTERS, *VOCABULARY, *PIECES)), max_size=30).map("".join)
all_replies = st.one_of(pattern_replies, run_replies, hostile_replies, replies, st.text(max_size=50))

_BUILDERS = {name: (AnswerBuilder(pattern=old), AnswerBuilder(pattern=new)) for name, (old, new) in REWRITTEN.items()}


def _first_group(pattern: str, reply: str) -> tuple[str | None, int | None]:
    """What AnswerBuilder's pattern reading sees: the first group (None: no match) and `lastindex`."""
    match = re.search(pattern, reply)
    return (None, None) if match is None else (match.group(1), match.lastindex)


def _answer_builder(builder: AnswerBuilder, reply: str) -> str | None:
    return builder.run(query="q", replies=[reply])["answers"][0].data


@FUZZ
@given(reply=all_replies)
@example(reply="")
@example(reply="a" + " " * 1000 + "b")
@example(reply="Paris. \r\n(b) Lyon")
@example(reply="(a) x.\xa0 \n\n (b) y")
@example(reply="(a) (b) c")
@example(reply="x . \u2028\n(c)\tz")
def test_patterns_extract_what_the_reference_patterns_do(reply):
    for name, (old, new) in REWRITTEN.items():
        assert _first_group(new, reply) == _first_group(old, reply), name
        assert extract_answer(new, reply) == extract_answer(old, reply), name
        old_builder, new_builder = _BUILDERS[name]
        assert _answer_builder(new_builder, reply) == _answer_builder(old_builder, reply), name


@pytest.mark.parametrize("name", sorted(REWRITTEN))
def test_long_whitespace_runs(name):
    # The inputs the reference patterns are quadratic in, at a size they still finish in well under a second.
    old, new = REWRITTEN[name]
    for unit in (" ", "\t", ". ", " .", "\xa0 ", "\r"):
        for head, tail in (("a", "b"), ("(a) x", "\n(b) y"), ("x", "(b) y"), ("x", ""), ("", "\n")):
            reply = head + unit * 3000 + tail
            assert _first_group(new, reply) == _first_group(old, reply), (unit, head, tail)


def test_every_prompt_uses_a_tested_pattern():
    tested = {new for _, new in REWRITTEN.values()}
    untested = {prompt.name for prompt in PROMPTS.values() if prompt.answer_pattern not in tested}
    assert untested == {"pruning", "summary"}  # the chain-of-thought prompts: a plain "Answer:" line


class TestExtractAnswer:
    @pytest.mark.parametrize(
        ("reply", "expected"),
        [
            ("Paris", "Paris"),
            (" Paris \n", "Paris"),
            ("Paris\nQuestion: Where is Lyon?\nAnswer: France", "Paris"),
            ("\n\n Butch Vig\nmore", "Butch Vig"),
            ("Boston, Massachusetts", "Boston, Massachusetts"),
            ("", ""),
            (None, ""),
        ],
    )
    def test_figure7_first_line(self, reply, expected):
        assert PROMPTS["figure7"].extract_answer(reply) == expected

    @pytest.mark.parametrize("name", ["pruning", "summary"])
    @pytest.mark.parametrize(
        ("reply", "expected"),
        [
            (" Source 3 mentions it.\nAnswer: Saw VI\n\nContext: more", "Saw VI"),
            ("Rationale.\nAnswer:  Saw VI  \nAnswer: other", "Saw VI"),
            ("Step by step.\nAnswer: unknown", "unknown"),
            ("Step by step. It is Saw VI.", ""),
            ("", ""),
            (None, ""),
        ],
    )
    def test_cot_answer_line(self, name, reply, expected):
        assert PROMPTS[name].answer_pattern == COT_ANSWER_PATTERN
        assert PROMPTS[name].extract_answer(reply) == expected

    @pytest.mark.parametrize(
        ("reply", "expected"),
        [
            ("(a) Rollo (b) Ragnar", "Rollo"),
            ("(b) Ragnar", "Ragnar"),
            ("Rollo", "Rollo"),
            (" Rollo\nQuestion: next", "Rollo"),
            ("Boston, Massachusetts", "Boston, Massachusetts"),
            ("unknown", "unknown"),
        ],
    )
    def test_distiller(self, reply, expected):
        assert PROMPTS["distiller"].extract_answer(reply) == expected

    def test_pattern_without_group(self):
        assert extract_answer(r"\d+", "born in 1925 or 1926") == "1925"
        assert extract_answer(r"\d+", "no digits") == ""


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (" France (b) Germany", "France"),
        (" (a) France", "France"),
        (" Paris.\nQuestion: next", "Paris"),
        ("", ""),
    ],
)
def test_sure_short_answer_pattern(reply, expected):
    assert extract_answer(PROMPTS["sure_mcq"].answer_pattern, reply) == expected
