"""
Every parser of model output under fuzzing: arbitrary and hostile Unicode, replies built from the
prompts' own vocabulary with nested and unbalanced markers, and huge inputs. A parser must not raise and must return
the shape its docstring promises.

The tests run the "fuzz-ci" profile (few examples, no deadline: the machine is shared and noisy); set
`FUZZ_PROFILE=fuzz-10k` for 10,000 examples per test (`fuzz-50k`: 50,000, for the differential test of the answer
patterns in `test_prompts_registry.py`). Time scaling is measured by `research/benchmarks/fuzz_parsers.py`, which
runs 10,000 replies per parser from the strategies and the `PARSERS` table of `tests.support.fuzzing`, not
by timed tests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from haystack_fusion import notes, sure
from haystack_fusion.answers import (
    answer_confidence,
    majority_vote,
    normalize_answer,
    token_logprobs,
)
from haystack_fusion.notes import classify_note, parse_single_call
from haystack_fusion.prompts import strip_delimiters
from haystack_fusion.prompts.sure import one_line
from haystack_fusion.sure import (
    PREFERENCE_CHOICES,
    VALIDITY_CHOICES,
    choice_probability,
    pairwise_ranking,
    parse_candidates,
    parse_preference,
    parse_validity,
    ranking_pairs,
)
from tests.support.fuzzing import (
    DETECTOR,
    PARSERS,
    check_candidates,
    check_parsed_notes,
    hostile_metas,
    huge_replies,
    is_probability,
    replies,
)
from tests.unit.fuzz_settings import FUZZ, HUGE

"""The settings of every test here; applied per test, so the other test files keep the default profile."""
"""Huge inputs: a few per parser, each of 100,000 to 1,000,000 characters."""


# ---------------------------------------------------------------------------------------------------------------------
# Tests


@pytest.mark.parametrize("name", sorted(PARSERS))
class TestEveryParser:
    @FUZZ
    @given(reply=replies)
    def test_never_raises_and_keeps_its_shape(self, name, reply):
        parser = PARSERS[name]
        assert parser.check(parser.run(reply))

    @HUGE
    @given(reply=huge_replies)
    def test_huge_replies(self, name, reply):
        parser = PARSERS[name]
        assert parser.check(parser.run(reply))


class TestInvariants:
    @FUZZ
    @given(reply=replies)
    def test_normalize_is_idempotent(self, reply):
        assert normalize_answer(normalize_answer(reply)) == normalize_answer(reply)

    @FUZZ
    @given(reply=replies)
    def test_one_line_is_idempotent(self, reply):
        assert one_line(one_line(reply)) == one_line(reply)

    @FUZZ
    @given(reply=replies)
    def test_strip_delimiters_never_adds(self, reply):
        assert len(strip_delimiters(reply)) <= len(reply)

    @FUZZ
    @given(reply=replies, k=st.integers(1, 8))
    def test_candidates_are_distinct_and_at_most_k(self, reply, k):
        assert check_candidates(parse_candidates(reply, k), k)

    @FUZZ
    @given(reply=replies, k=st.integers(0, 8))
    def test_single_call_has_k_notes(self, reply, k):
        assert check_parsed_notes(parse_single_call(reply, k), k)

    @FUZZ
    @given(pair_replies=st.lists(replies, min_size=6, max_size=6))
    def test_ranking_of_parsed_preferences_hands_out_one_point_per_pair(self, pair_replies):
        pairs = ranking_pairs(3)
        scores = pairwise_ranking(
            {pair: parse_preference(reply) for pair, reply in zip(pairs, pair_replies, strict=True)}, 3
        )
        assert math.isclose(sum(scores), 3.0)
        assert all(0.0 <= score <= 2.0 for score in scores)

    @FUZZ
    @given(answers=st.lists(st.one_of(st.none(), replies), max_size=8))
    def test_vote_counts_only_answers_that_do_not_abstain(self, answers):
        vote = majority_vote(answers)
        assert sum(vote.votes.values()) == sum(
            answer is not None and not DETECTOR.is_unknown(answer) for answer in answers
        )


class TestHostileLogprobs:
    @FUZZ
    @given(meta=hostile_metas, answer=st.one_of(st.none(), replies))
    def test_answer_confidence(self, meta, answer):
        assert is_probability(answer_confidence(meta, answer))

    @FUZZ
    @given(meta=hostile_metas)
    def test_token_logprobs(self, meta):
        tokens = token_logprobs(meta)
        assert tokens is None or all(isinstance(token, Mapping) for token in tokens)

    @FUZZ
    @given(meta=hostile_metas, choices=st.sampled_from([VALIDITY_CHOICES, PREFERENCE_CHOICES]))
    def test_choice_probability(self, meta, choices):
        probability = choice_probability(meta, choices)
        assert probability is None or isinstance(probability, float)
        if probability is not None and not math.isnan(probability):
            assert 0.0 <= probability <= 1.0


class TestRegressions:
    """Inputs on which a parser raised or took quadratic time before this file existed."""

    @pytest.mark.parametrize(
        "entry",
        [
            pytest.param({"token": "Paris", "logprob": 1000.0}, id="positive-logprob"),
            pytest.param(
                {"token": "True", "logprob": -0.1, "top_logprobs": [None, "x"]}, id="alternatives-not-mappings"
            ),
            pytest.param({"token": "True", "logprob": -0.1, "top_logprobs": 3}, id="alternatives-not-a-list"),
            pytest.param(
                {"token": "True", "logprob": 800, "top_logprobs": [{"token": "False", "logprob": 900}]},
                id="alternatives-overflow",
            ),
        ],
    )
    def test_malformed_logprobs_do_not_raise(self, entry):
        meta = {"logprobs": {"content": [entry]}}
        assert is_probability(answer_confidence(meta, "Paris"))
        assert is_probability(choice_probability(meta, VALIDITY_CHOICES))

    @pytest.mark.parametrize(
        ("name", "reply"),
        [
            ("parse_candidates", "Paris" + "." * 100_000),  # one "." removed per copy of the candidate
            ("parse_candidates", "Paris" + ",'" * 50_000),
            ("parse_candidates", "Answer" + " " * 100_000 + "x"),  # "answer\s*#?\s*1" in the list markers
            ("parse_preference", "Passage" + " " * 100_000 + "x"),  # "passage\s*(?:#)?\s*[12]"
            ("parse_validity", "Choices: [" * 50_000),  # every unclosed echo scanned to the end of the line
            ("parse_single_call", " " * 100_000 + "x"),  # the answer marker tried at each space of the run
            ("parse_single_call", "Answer: " * 50_000),  # the rest of the line cleaned at each marker
            ("parse_single_call", "Passage" + " " * 100_000 + "x"),  # "passage\s*(?:#)?\s*\d"
            ("parse_single_call", "based on x," + " " * 100_000 + "y"),  # lead-in ",\s*" against the connective's
            ("parse_single_call", "*" * 100_000 + "x"),  # "[*_]*answer" tried at each "*"
            ("parse_single_call", "the answer is x" + "." * 100_000),
            ("parse_single_call", "x\nquestion" + " " * 100_000 + "x"),  # "question\s*[*_]*\s*:"
            ("parse_single_call", "reading notes" + " " * 100_000 + "x"),
            ("parse_document_note", "(a)" + " " * 100_000 + "x"),  # "[ \t]*label?[ \t.*_]*$"
            ("parse_document_note", "_" * 100_000 + "x"),  # "[*_]*relevance" tried at each "_"
            ("classify_note", "Passage" + "\n" * 100_000),
            ("classify_note", "a " * 50_000),  # token lists compared at each position
        ],
    )
    def test_quadratic_inputs_finish(self, name, reply):
        # No timing (noisy machine): before the fixes each of these took seconds to hours.
        parser = PARSERS[name]
        assert parser.check(parser.run(reply))

    def test_classify_note_with_a_long_answer(self):
        note = "Passage #1 says " + "a " * 20_000 + "b"
        assert classify_note(note, "a " * 10_000 + "b") == "direct"
        assert classify_note(note, "a " * 10_000 + "c") == "context"

    @pytest.mark.parametrize(
        ("reply", "answer"),
        [
            ("Answer:**Answer:** Paris", "Paris"),  # a label right after another's "**"
            ("Answer: x Answer:", "x Answer"),  # the last marker gives no answer: the one before does
            ("Passage #1 says 1996.\nAnswer:\n   \nParis", "Paris"),  # the answer on the next non-blank line
            ("**Answer:** Washington D.C..", "Washington D.C."),
        ],
    )
    def test_answer_markers_unchanged(self, reply, answer):
        assert parse_single_call(reply, 1).answer == answer

    @pytest.mark.parametrize(
        ("reply", "candidates"),
        [("(a) D.C. (b) Lyon..", ["D.C.", "Lyon"]), ("(a) ,'Paris.',' (b) “a.b.”", ["Paris", "a.b."])],
    )
    def test_candidate_cleaning_unchanged(self, reply, candidates):
        assert parse_candidates(reply, 2) == candidates

    def test_nested_choices_echo_is_kept(self):
        # An echo with "[" inside its brackets is kept, so its answer is read after it.
        assert parse_validity("Choices: [True, False]. False") is False
        assert parse_validity("Choices: [[True], False] False") is True


def test_fuzzed_parsers_cover_every_parse_function():
    # A new `parse_*` function in the parser modules must join `PARSERS`.
    parse_functions = {name for module in (sure, notes) for name in dir(module) if name.startswith("parse_")}
    assert parse_functions <= set(PARSERS)
