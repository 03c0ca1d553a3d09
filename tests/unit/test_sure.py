import pytest
from hypothesis import given
from hypothesis import strategies as st

from haystack_fusion.answers import normalize_answer
from haystack_fusion.prompts import PROMPTS, render
from haystack_fusion.sure import (
    PREFERENCE_CHOICES,
    VALIDITY_CHOICES,
    choice_probability,
    pairwise_ranking,
    parse_candidates,
    parse_preference,
    parse_validity,
    ranking_pairs,
    select,
)

# Pieces of real replies, mixed with arbitrary text by the property-based tests.
REPLY_PIECES = ["(a)", "(b)", "a)", "b)", "1.", "2)", "- ", "* ", "\n", ", ", "; ", "Paris", "paris.", "The", "[DONE]"]
replies = st.one_of(st.text(), st.lists(st.one_of(st.sampled_from(REPLY_PIECES), st.text(max_size=5))).map("".join))


class TestParseCandidates:
    @pytest.mark.parametrize(
        ("reply", "expected"),
        [
            pytest.param("(a) Paris, (b) Lyon", ["Paris", "Lyon"], id="listing-6-form"),
            pytest.param(" (a) France, (b) Germany", ["France", "Germany"], id="embedded-model-reply"),
            pytest.param(
                " (a) (b) (c) (d) (e) (f) (g) (h) (i) (j) (k) (l) (m) (n) (o) (p) (q) (r) (s) (t) (u) (v) (w) (x) (y) "
                "(z) (a) (b) (c) (d) (q",
                [],
                id="markers-only-loop-from-embedded-model",
            ),
            pytest.param(
                " (a) Danes, (b) Norse-Gaels, (c) Swedes, (d) Danes, (e) Swedes, (f",
                ["Danes", "Norse-Gaels"],
                id="repeating-list-cut-off",
            ),
            pytest.param("(a) Paris (b) Lyon", ["Paris", "Lyon"], id="no-comma"),
            pytest.param("a) Paris b) Lyon", ["Paris", "Lyon"], id="closing-paren-only"),
            pytest.param("(A) Paris; (B) Lyon", ["Paris", "Lyon"], id="upper-case-semicolon"),
            pytest.param("(a)\nParis\n(b)\nLyon", ["Paris", "Lyon"], id="marker-on-own-line"),
            pytest.param("a. Paris\nb. Lyon", ["Paris", "Lyon"], id="dotted-letters"),
            pytest.param("1. Paris\n2. Lyon", ["Paris", "Lyon"], id="numbered-lines"),
            pytest.param("1) Paris 2) Lyon", ["Paris", "Lyon"], id="numbered-inline"),
            pytest.param("(1) Paris (2) Lyon", ["Paris", "Lyon"], id="numbered-parens"),
            pytest.param("Candidate 1: Paris\nCandidate 2: Lyon", ["Paris", "Lyon"], id="candidate-n-labels"),
            pytest.param("- Paris\n- Lyon", ["Paris", "Lyon"], id="dash-bullets"),
            pytest.param("* Paris", ["Paris"], id="star-bullet-single"),
            pytest.param("• Paris\n• Lyon\nThese are cities.", ["Paris", "Lyon"], id="bullets-then-prose"),
            pytest.param("Paris\nLyon", ["Paris", "Lyon"], id="one-per-line"),
            pytest.param("Here are two candidates:\nParis\nLyon", ["Paris", "Lyon"], id="header-line-dropped"),
            pytest.param("Paris, Lyon", ["Paris", "Lyon"], id="comma-separated"),
            pytest.param("Paris; Lyon, France", ["Paris", "Lyon, France"], id="semicolons-before-commas"),
            pytest.param(
                "(a) Boston, Massachusetts (b) Springfield, Illinois",
                ["Boston, Massachusetts", "Springfield, Illinois"],
                id="no-comma-split-with-markers",
            ),
            pytest.param("(a) Washington, D.C. (b) Lyon.", ["Washington, D.C.", "Lyon"], id="abbreviation-kept"),
            pytest.param("(a) \"Paris\". (b) 'Lyon';", ["Paris", "Lyon"], id="quotes-and-punctuation"),
            pytest.param("**Answer:** (a) **Paris**, (b) *Lyon*", ["Paris", "Lyon"], id="markdown"),
            pytest.param("Answer: (a) Paris, (b) Lyon", ["Paris", "Lyon"], id="answer-prefix"),
            pytest.param("Candidates: Paris, Lyon", ["Paris", "Lyon"], id="candidates-prefix"),
            pytest.param("Sure! Here they are: (a) Paris (b) Lyon", ["Paris", "Lyon"], id="preamble-dropped"),
            pytest.param("Paris (b) Lyon", ["Paris", "Lyon"], id="first-marker-missing"),
            pytest.param("Paris, (b) Lyon", ["Paris", "Lyon"], id="first-marker-missing-comma"),
            pytest.param("(a) Paris (b) Lyon [DONE]", ["Paris", "Lyon"], id="done-inline"),
            pytest.param("(a) Paris\n(b) Lyon\n\nBoth are in passage 3.", ["Paris", "Lyon"], id="explanation"),
            pytest.param("(a) Paris (b) Lyon (c) Nice", ["Paris", "Lyon"], id="more-than-k"),
            pytest.param("(a) Paris", ["Paris"], id="fewer-than-k"),
            pytest.param("(a) Paris (b) paris. (c) The Paris (d) Lyon", ["Paris", "Lyon"], id="duplicates"),
            pytest.param("(a) Saint   Louis\t(b) New  York", ["Saint Louis", "New York"], id="whitespace-collapsed"),
            pytest.param("(a) 1945 (b) World War 2", ["1945", "World War 2"], id="numbers-inside-letters"),
            pytest.param("(a) The (b) Lyon", ["Lyon"], id="empty-after-normalization"),
            pytest.param("A. Lincoln", ["A. Lincoln"], id="lone-initial-is-not-a-marker"),
            pytest.param("", [], id="empty"),
            pytest.param("  \n\t", [], id="whitespace"),
            pytest.param("[DONE]", [], id="done-only"),
        ],
    )
    def test_reply_shapes(self, reply, expected):
        assert parse_candidates(reply, 2) == expected

    def test_none_is_empty(self):
        assert parse_candidates(None, 2) == []

    def test_k_one_keeps_a_comma_answer_whole(self):
        assert parse_candidates("Boston, Massachusetts", 1) == ["Boston, Massachusetts"]
        assert parse_candidates("Boston, Massachusetts", 2) == ["Boston", "Massachusetts"]

    def test_first_spelling_kept(self):
        assert parse_candidates("(a) the Eiffel Tower (b) Eiffel tower (c) Louvre", 3) == ["the Eiffel Tower", "Louvre"]

    def test_long_candidate_not_truncated(self):
        long = "one two three four five six seven eight nine ten eleven twelve"
        assert parse_candidates(f"(a) {long} (b) Lyon", 2) == [long, "Lyon"]

    @pytest.mark.parametrize("k", [0, -1])
    def test_k_below_one_raises(self, k):
        with pytest.raises(ValueError, match="k"):
            parse_candidates("(a) Paris", k)

    @given(reply=replies, k=st.integers(min_value=1, max_value=5))
    def test_never_raises_and_respects_the_contract(self, reply, k):
        candidates = parse_candidates(reply, k)
        assert len(candidates) <= k
        assert all(candidate and candidate == candidate.strip() for candidate in candidates)
        keys = [normalize_answer(candidate) for candidate in candidates]
        assert all(keys)
        assert len(set(keys)) == len(keys)


def format_choices(candidates: list[str]) -> str:
    """The Choices line as the MCQ prompt (Listing 12) renders it; Listing 7 shares the Jinja."""
    text = render(PROMPTS["sure_mcq"], passages="", query="q", candidates=candidates)[0].text
    return text.split("Choices: ", 1)[1].split("\n", 1)[0].strip()


class TestFormatChoices:
    def test_listing_7_form(self):
        assert format_choices(["Paris", "Lyon"]) == "(a) Paris (b) Lyon"

    def test_newlines_collapsed(self):
        assert format_choices(["New\nYork  City"]) == "(a) New York City"

    def test_empty(self):
        assert format_choices([]) == ""

    def test_letters_wrap_after_z(self):
        choices = format_choices([str(i) for i in range(28)])
        assert choices.startswith("(a) 0 (b) 1")
        assert choices.endswith("(z) 25 (a) 26 (b) 27")

    def test_round_trip(self):
        candidates = ["Boston, Massachusetts", "Lyon"]
        assert parse_candidates(format_choices(candidates), 2) == candidates


class TestParseValidity:
    @pytest.mark.parametrize(
        ("reply", "expected"),
        [
            ("True", True),
            ("true.", True),
            ("Answer: TRUE", True),
            ("False", False),
            ("False. The passage supports (b), not (a).", False),
            ("Choices: [True, False]. Answer: False", False),
            ("not true", False),
            ("It isn't true.", False),
            ("not false", True),
            ("Yes, it does.", True),
            ("No.", False),
            ("No, but true in part.", True),
            ("untrue", False),
            ("The passage supports the prediction.", False),
            ("", False),
            (None, False),
        ],
    )
    def test_replies(self, reply, expected):
        assert parse_validity(reply) is expected

    @given(reply=st.one_of(st.none(), st.text()))
    def test_never_raises(self, reply):
        assert isinstance(parse_validity(reply), bool)


class TestParsePreference:
    @pytest.mark.parametrize(
        ("reply", "expected"),
        [
            ("Passage 1", 1),
            ("Passage 2.", 2),
            ("passage2", 2),
            ("Passage #1", 1),
            ("Passage one", 1),
            ("[Passage 2]", 2),
            ("**Passage 2**", 2),
            ("Answer: Passage 1", 1),
            ("Choices: [Passage 1, Passage 2]. Answer: Passage 2", 2),
            ("1", 1),
            ("2.", 2),
            ("(2)", 2),
            ("The first passage", 1),
            ("The second one is more informative.", 2),
            ("Passage 2 is more informative than Passage 1.", 2),
            ("Passage 1 is better, although both are relevant.", 1),
            ("I think Passage 2 is more relevant.", 2),
            ("The answer is the second.", 2),
            ("Passage 1 and Passage 2 are equally informative.", None),
            ("Both passages are relevant, but Passage 2 is more informative.", None),
            ("Neither passage answers the question.", None),
            ("1 or 2", None),
            ("Passage 12", None),
            ("I cannot decide.", None),
            ("", None),
            (None, None),
        ],
    )
    def test_replies(self, reply, expected):
        assert parse_preference(reply) == expected

    @given(reply=st.one_of(st.none(), st.text()))
    def test_never_raises(self, reply):
        assert parse_preference(reply) in (1, 2, None)


class TestRankingPairs:
    def test_order(self):
        assert ranking_pairs(3) == [(0, 1), (1, 0), (0, 2), (2, 0), (1, 2), (2, 1)]

    @pytest.mark.parametrize(("k", "length"), [(0, 0), (1, 0), (2, 2), (4, 12)])
    def test_length(self, k, length):
        assert len(ranking_pairs(k)) == length

    def test_negative_k_raises(self):
        with pytest.raises(ValueError, match="k"):
            ranking_pairs(-1)


class TestPairwiseRanking:
    def test_both_orders_agree(self):
        assert pairwise_ranking({(0, 1): 1, (1, 0): 2}, 2) == [1.0, 0.0]

    def test_order_bias_splits(self):
        # Each order prefers whichever summary is shown first.
        assert pairwise_ranking({(0, 1): 1, (1, 0): 1}, 2) == [0.5, 0.5]

    def test_no_preference_and_missing_pairs_give_half(self):
        assert pairwise_ranking({(0, 1): None, (1, 0): None}, 2) == [0.5, 0.5]
        assert pairwise_ranking({}, 3) == [1.0, 1.0, 1.0]

    def test_single_call_for_a_pair(self):
        assert pairwise_ranking({(1, 0): 1}, 2) == [0.0, 1.0]

    def test_one_order_undecided(self):
        assert pairwise_ranking({(0, 1): 1, (1, 0): None}, 2) == [0.75, 0.25]

    def test_k3_hand_computed(self):
        preferences = {
            (0, 1): 2, (1, 0): 1,  # s1 beats s0 in both orders: r_pair(s0, s1) = 0
            (0, 2): 1, (2, 0): 1,  # order bias: r_pair(s0, s2) = 0.5
            (1, 2): 1, (2, 1): None,  # s1 wins once, one undecided: r_pair(s1, s2) = (1 + 0.5) / 2
        }  # fmt: skip
        # s0: 0 + 0.5; s1: 1 + 0.75; s2: 0.5 + 0.25
        assert pairwise_ranking(preferences, 3) == [0.5, 1.75, 0.75]

    @pytest.mark.parametrize(
        "preferences",
        [{(0, 2): 1}, {(0, 0): 1}, {(-1, 0): 1}, {(0, 1): 3}],
        ids=["index-out-of-range", "self-pair", "negative-index", "bad-value"],
    )
    def test_invalid_raises(self, preferences):
        with pytest.raises(ValueError, match="pair"):
            pairwise_ranking(preferences, 2)

    @given(data=st.data(), k=st.integers(min_value=0, max_value=6))
    def test_each_pair_hands_out_one_point(self, data, k):
        pairs = ranking_pairs(k)
        present = data.draw(st.lists(st.sampled_from(pairs), unique=True) if pairs else st.just([]))
        preferences = {pair: data.draw(st.sampled_from([1, 2, None])) for pair in present}
        scores = pairwise_ranking(preferences, k)
        assert len(scores) == k
        assert sum(scores) == pytest.approx(k * (k - 1) / 2)
        assert all(0.0 <= score <= max(k - 1, 0) for score in scores)


class TestSelect:
    def test_orders_by_validity_plus_ranking(self):
        assert select([1.0, 1.0, 0.0], [0.5, 1.75, 0.75]) == [1, 0, 2]

    def test_ties_go_to_the_earlier_candidate(self):
        assert select([1.0, 1.0], [0.5, 0.5]) == [0, 1]
        assert select([0.0, 1.0, 1.0], [1.0, 0.0, 0.0]) == [0, 1, 2]

    def test_validity_changes_the_winner(self):
        ranking = pairwise_ranking({(0, 1): 1, (1, 0): None}, 2)  # [0.75, 0.25]
        assert select([1.0, 1.0], ranking)[0] == 0
        assert select([0.0, 1.0], ranking)[0] == 1

    def test_float_noise_does_not_break_a_tie(self):
        assert select([0.0, 0.0], [0.1 + 0.2, 0.3]) == [0, 1]

    def test_accepts_bools(self):
        assert select([False, True], [0.0, 0.0]) == [1, 0]

    def test_empty(self):
        assert select([], []) == []

    def test_length_mismatch_raises(self):
        with pytest.raises(ValueError, match="entries"):
            select([1.0], [0.0, 1.0])

    def test_non_finite_raises(self):
        with pytest.raises(ValueError, match="finite"):
            select([float("nan")], [0.0])


class TestChoiceProbability:
    @staticmethod
    def meta(*steps):
        return {
            "logprobs": {
                "content": [
                    {"token": t, "logprob": lp, "top_logprobs": [{"token": a, "logprob": b} for a, b in alts]}
                    for t, lp, alts in steps
                ]
            }
        }

    def test_reads_the_first_decision_token(self):
        import math

        meta = self.meta(
            ("Answer", -0.1, []),
            (":", -0.1, []),
            (" True", math.log(0.7), [(" True", math.log(0.7)), ("True", math.log(0.1)), (" False", math.log(0.2))]),
            (" False", -1.0, []),
        )
        assert choice_probability(meta, VALIDITY_CHOICES) == pytest.approx(0.8)

    def test_chosen_side_only(self):
        assert choice_probability(self.meta(("No", -0.1, [])), VALIDITY_CHOICES) == 0.0
        assert choice_probability(self.meta((" 1", -0.1, [(" one", -9.0)])), PREFERENCE_CHOICES) == 1.0

    def test_none_without_logprobs_or_decision(self):
        assert choice_probability({}, VALIDITY_CHOICES) is None
        assert choice_probability(self.meta(("maybe", -0.1, [])), VALIDITY_CHOICES) is None


class TestProbabilityPreferences:
    def test_float_outcomes(self):
        assert pairwise_ranking({(0, 1): 0.8, (1, 0): 0.4}, 2) == pytest.approx([0.7, 0.3])

    def test_int_and_float_mix(self):
        assert pairwise_ranking({(0, 1): 1, (1, 0): 0.0}, 2) == pytest.approx([1.0, 0.0])

    @pytest.mark.parametrize("value", [1.5, -0.1, 2.0])
    def test_out_of_range(self, value):
        with pytest.raises(ValueError, match=r"probability|preference"):
            pairwise_ranking({(0, 1): value}, 2)
