import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from haystack_fusion.answers import (
    DEFAULT_UNKNOWN_PATTERNS,
    UNKNOWN,
    UnknownDetector,
    VoteResult,
    answer_confidence,
    majority_vote,
    normalize_answer,
    token_f1,
    token_logprobs,
    unknown_core,
)
from haystack_fusion.evaluation import metrics

# A mix of real answers, surface variants of one answer, abstentions, failed calls and arbitrary text.
ANSWER_POOL = [
    "Paris",
    "paris.",
    "The Eiffel Tower",
    "eiffel tower",
    "Lyon",
    "unknown",
    "Unknown.",
    "I don't know",
    "",
    "  ",
    "a",
]
# Lead-ins and wrappings ("{}" is the answer) a model puts around an answer.
LEAD_INS = ["", "The answer is ", "the answer is: ", "Answer: ", "**Answer:** ", "Final answer: ", "It is ", "It's "]
WRAPPINGS = ["{}", '"{}"', "'{}'", "“{}”", "**{}**", "*{}*", "`{}`", "({})"]
# Words of real answers that hold "unknown": none starts a clause or an abstention sentence.
ANSWER_WORDS = [
    "the",
    "an",
    "soldier",
    "Pleasures",
    "number",
    "of",
    "people",
    "land",
    "artist",
    "Tomb",
    "1925",
    "Paris",
]

answers_strategy = st.lists(st.one_of(st.none(), st.sampled_from(ANSWER_POOL), st.text(max_size=20)), max_size=12)


class TestNormalizeAnswer:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("The Eiffel Tower", "eiffel tower"),
            ("eiffel tower", "eiffel tower"),
            ("A dog and an apple", "dog and apple"),
            ("Paris, France.", "paris france"),
            ("  Saw   VI\n\t", "saw vi"),
            ('"Butch Vig"', "butch vig"),
            ("1,925", "1925"),
            ("the", ""),
            ("...", ""),
            ("", ""),
            ("Theatre", "theatre"),  # articles only as whole words
            ("an-apple", "anapple"),  # punctuation is removed before articles (as in the SQuAD script)
            ("rock 'n' roll", "rock n roll"),
        ],
    )
    def test_squad_normalization(self, text, expected):
        assert normalize_answer(text) == expected

    def test_matches_official_squad_script(self):
        # The official SQuAD v1.1/v2.0 evaluation script, inlined.
        import re
        import string

        def official(s):
            def remove_articles(text):
                return re.sub(r"\b(a|an|the)\b", " ", text)

            def white_space_fix(text):
                return " ".join(text.split())

            def remove_punc(text):
                exclude = set(string.punctuation)
                return "".join(ch for ch in text if ch not in exclude)

            return white_space_fix(remove_articles(remove_punc(s.lower())))

        for text in ["The  Eiffel-Tower!", "An apple a day", "U.S.A.", "  The 1925 (born) ", "the a an"]:
            assert normalize_answer(text) == official(text)

    @given(st.text())
    @settings(max_examples=300, deadline=None)
    def test_idempotent(self, text):
        once = normalize_answer(text)
        assert normalize_answer(once) == once


class TestUnknownDetector:
    @pytest.mark.parametrize(
        "answer",
        [
            "unknown",
            "Unknown",
            "Unknown.",
            "UNKNOWN!",
            '"unknown"',
            "  unknown  ",
            "I don't know",
            "I do not know.",
            "There is not enough information to answer.",
            "Not enough context",
            "The context does not contain the answer.",
            "The context does not provide the year.",
            "The provided input does not contain the context to answer the question.",
            "The passages do not mention it",
            "It cannot be determined from the passages.",
            "cannot be determined",
            "",
            "   ",
            "...",
            None,
        ],
    )
    def test_abstentions_are_unknown(self, answer):
        assert UnknownDetector().is_unknown(answer)

    @pytest.mark.parametrize(
        "answer", ["Unknown Pleasures", "France", "The Eiffel Tower", "Paris", "1925", "Butch Vig", "known"]
    )
    def test_answers_are_not_unknown(self, answer):
        assert not UnknownDetector().is_unknown(answer)

    @pytest.mark.parametrize(
        "answer",
        [
            'The answer is "unknown".',
            "'unknown'",
            "“Unknown”",
            "The answer is unknown.",
            "Answer: unknown",
            "answer: Unknown",
            "**Answer:** unknown",
            "**Answer**: *unknown*",
            "The final answer is: unknown",
            "It is unknown.",
            "It's unknown.",
            "unknown!",
            "UNKNOWN",
            "**unknown**",
            "_unknown_",
            "`unknown`",
            "unknown.",
            "Answer: I don't know",
            "The answer is: not enough information.",
            "It is not mentioned in the passages.",
            "It is unknown whether he survived.",
            "The answer is unknown, the passages do not say.",
        ],
    )
    def test_wrapped_unknown_and_lead_ins_are_unknown(self, answer):
        assert UnknownDetector().is_unknown(answer)
        assert metrics.is_unknown(answer)

    @pytest.mark.parametrize(
        "answer",
        [
            "the unknown soldier",
            "The Unknown Soldier",
            "Tomb of the Unknown Soldier",
            "Unknown Pleasures",
            '"Unknown Pleasures"',
            "**Unknown Pleasures**",
            "The answer is Unknown Pleasures.",
            "It is the unknown soldier.",
            "Answer: the unknown soldier",
            "an unknown number of people",
            "An unknown number of people died.",
            "Terra incognita means unknown land",
            "unknown land",
            "The answer is unknown land.",
            "unknown artist",
            "The answer isn't known yet to him, it is Paris",
        ],
    )
    def test_unknown_inside_a_longer_answer_is_not_unknown(self, answer):
        assert not UnknownDetector().is_unknown(answer)
        assert not metrics.is_unknown(answer)

    @pytest.mark.parametrize(
        ("cleaned", "core"),
        [
            ('the answer is "unknown"', "unknown"),
            ("answer:** **unknown", "unknown"),
            ("it is unknown", "unknown"),
            ("answer: the answer is unknown", "unknown"),
            ("the unknown soldier", "the unknown soldier"),
            ("it is the unknown soldier", "the unknown soldier"),
            ("answers: unknown", "answers: unknown"),  # "answers" is not a lead-in
            ("it isn't known", "it isn't known"),
            ("", ""),
        ],
    )
    def test_unknown_core(self, cleaned, core):
        assert unknown_core(cleaned) == core

    @given(
        lead_in=st.sampled_from(LEAD_INS),
        wrap=st.sampled_from(WRAPPINGS),
        word=st.sampled_from(["unknown", "Unknown", "UNKNOWN"]),
        end=st.sampled_from(["", ".", "!", ". ", "\n"]),
    )
    @settings(max_examples=200, deadline=None)
    def test_any_wrapping_of_unknown_is_unknown(self, lead_in, wrap, word, end):
        assert UnknownDetector().is_unknown(f"{lead_in}{wrap.format(word)}{end}")

    @given(
        before=st.lists(st.sampled_from(ANSWER_WORDS), max_size=3),
        after=st.lists(st.sampled_from(ANSWER_WORDS), max_size=3),
        lead_in=st.sampled_from(LEAD_INS),
        wrap=st.sampled_from(WRAPPINGS),
        end=st.sampled_from(["", ".", "!"]),
    )
    @settings(max_examples=300, deadline=None)
    def test_any_answer_with_words_around_unknown_is_not_unknown(self, before, after, lead_in, wrap, end):
        if not before and not after:
            return
        span = " ".join([*before, "unknown", *after])
        answer = f"{lead_in}{wrap.format(span)}{end}"
        assert not UnknownDetector().is_unknown(answer)
        assert not metrics.is_unknown(answer)

    def test_unknown_core_is_linear_in_a_long_answer(self):
        # A quadratic loop would take minutes on a megabyte of lead-ins.
        answer = "It is " * 200_000 + '"unknown".'
        assert unknown_core(answer.lower()) == "unknown"
        assert UnknownDetector().is_unknown(answer)

    def test_defaults(self):
        detector = UnknownDetector()
        assert detector.patterns == DEFAULT_UNKNOWN_PATTERNS
        assert UnknownDetector.from_patterns(None) == detector

    def test_custom_patterns_replace_the_defaults(self):
        detector = UnknownDetector.from_patterns([r"^no idea$", r"\bpass\b"])
        assert detector.patterns == (r"^no idea$", r"\bpass\b")
        assert detector.is_unknown("No idea.")
        assert detector.is_unknown("I will pass")
        assert not detector.is_unknown("unknown")  # only the given patterns apply
        assert detector.is_unknown("")  # an empty answer is always unknown

    def test_invalid_regex_raises_value_error(self):
        with pytest.raises(ValueError, match="invalid regular expression"):
            UnknownDetector.from_patterns(["(unclosed"])
        with pytest.raises(ValueError, match="unknown_patterns"):
            UnknownDetector(("[a-",))


class TestMajorityVote:
    def test_surface_variants_vote_together(self):
        result = majority_vote(["The Eiffel Tower", "Louvre", "eiffel tower"])
        assert isinstance(result, VoteResult)
        assert result.answer == "The Eiffel Tower"
        assert result.votes == {"eiffel tower": 2, "louvre": 1}
        assert result.candidates == ["The Eiffel Tower", "Louvre"]
        assert result.best_rank == {"eiffel tower": 0, "louvre": 1}
        assert not result.is_unknown

    def test_surface_form_comes_from_best_ranked_passage(self):
        result = majority_vote(["eiffel tower", "The Eiffel Tower"], ranks=[1, 0])
        assert result.answer == "The Eiffel Tower"

    def test_surface_form_is_stripped(self):
        assert majority_vote(["  Paris \n"]).answer == "Paris"

    def test_tie_goes_to_better_ranked_passage(self):
        assert majority_vote(["Rome", "Paris"]).answer == "Rome"
        assert majority_vote(["Rome", "Paris"], ranks=[1, 0]).answer == "Paris"
        result = majority_vote(["Rome", "Paris", "Paris", "Rome"], ranks=[3, 1, 2, 0])
        assert result.answer == "Rome"
        assert result.votes == {"rome": 2, "paris": 2}

    def test_more_votes_beat_better_rank(self):
        result = majority_vote(["Rome", "Paris", "paris"])
        assert result.answer == "Paris"
        assert list(result.votes) == ["paris", "rome"]

    def test_all_unknown(self):
        result = majority_vote(["unknown", "I don't know", "The context does not contain the answer.", ""])
        assert result.answer == UNKNOWN
        assert result.is_unknown
        assert result.votes == {}
        assert result.candidates == []
        assert result.best_rank == {}

    def test_no_answers(self):
        result = majority_vote([])
        assert result.answer == UNKNOWN
        assert result.is_unknown

    def test_failed_calls_do_not_vote(self):
        result = majority_vote([None, "Lyon", None, None])
        assert result.answer == "Lyon"
        assert result.votes == {"lyon": 1}
        assert result.best_rank == {"lyon": 1}
        assert majority_vote([None, None]).is_unknown

    def test_abstentions_do_not_vote(self):
        result = majority_vote(["unknown", "unknown", "unknown", "Paris"])
        assert result.answer == "Paris"
        assert result.votes == {"paris": 1}

    def test_samples_share_their_passage_rank(self):
        # p = 2 samples per passage: passage 0 gave ("unknown", "Lyon"), passage 1 gave ("Paris", "Paris").
        result = majority_vote(["unknown", "Lyon", "Paris", "Paris"], ranks=[0, 0, 1, 1])
        assert result.answer == "Paris"
        assert result.votes == {"paris": 2, "lyon": 1}
        assert result.best_rank == {"paris": 1, "lyon": 0}
        # Tie between samples of different passages: the better-ranked passage's answer wins, whatever the
        # position of the sample within its passage.
        tie = majority_vote(["unknown", "Lyon", "Paris", "unknown"], ranks=[0, 0, 1, 1])
        assert tie.answer == "Lyon"
        # With equal ranks the first occurrence keeps the surface form.
        assert majority_vote(["Lyon.", "lyon"], ranks=[0, 0]).answer == "Lyon."

    def test_custom_detector(self):
        detector = UnknownDetector.from_patterns([r"^pass$"])
        result = majority_vote(["pass", "unknown", "unknown"], detector=detector)
        assert result.answer == "unknown"  # "unknown" is an ordinary answer for this detector
        assert result.votes == {"unknown": 2}
        assert not result.is_unknown

    @pytest.mark.parametrize("ranks", [[0], [0, 1, 2], []])
    def test_mismatched_ranks_length_raises(self, ranks):
        with pytest.raises(ValueError, match="ranks"):
            majority_vote(["a", "b"], ranks=ranks)

    @given(answers_strategy)
    @settings(max_examples=300, deadline=None)
    def test_winner_has_the_most_votes(self, answers):
        result = majority_vote(answers)
        detector = UnknownDetector()
        expected_counts: dict[str, int] = {}
        for answer in answers:
            if answer is not None and not detector.is_unknown(answer):
                key = normalize_answer(answer)
                expected_counts[key] = expected_counts.get(key, 0) + 1
        assert result.votes == expected_counts
        if result.votes:
            winner_key = next(iter(result.votes))
            assert result.votes[winner_key] == max(result.votes.values())
            assert normalize_answer(result.answer) == winner_key
            assert winner_key  # an answer that normalizes to "" never votes
        assert sum(result.votes.values()) == len([a for a in answers if a is not None and not detector.is_unknown(a)])

    @given(answers_strategy)
    @settings(max_examples=300, deadline=None)
    def test_answer_is_unknown_or_a_voting_input(self, answers):
        result = majority_vote(answers)
        detector = UnknownDetector()
        voting = {answer.strip() for answer in answers if answer is not None and not detector.is_unknown(answer)}
        if result.is_unknown:
            assert result.answer == UNKNOWN
            assert not voting
        else:
            assert result.answer in voting
            assert not detector.is_unknown(result.answer)
        assert len(result.candidates) == len(result.votes)


def _meta(*tokens: tuple[str, float]) -> dict:
    return {"logprobs": {"content": [{"token": token, "logprob": logprob} for token, logprob in tokens]}}


class TestAnswerConfidence:
    def test_geometric_mean_of_the_answer_tokens(self):
        meta = _meta((" Par", -0.1), ("is", -0.3), ("\n", -2.0), ("Question", -1.0))
        assert answer_confidence(meta, "Paris") == pytest.approx(math.exp(-0.2))

    def test_label_and_trailing_period_do_not_count(self):
        meta = _meta(("Answer", -3.0), (":", -3.0), (" Rome", -0.5), (".", -4.0))
        assert answer_confidence(meta, "Rome") == pytest.approx(math.exp(-0.5))

    def test_answer_not_found_counts_the_first_line(self):
        meta = _meta(("\n", -9.0), ("New", -0.2), (" York", -0.4), ("\n", -1.0), ("Other", -5.0))
        assert answer_confidence(meta, "NYC") == pytest.approx(math.exp(-0.3))
        assert answer_confidence(meta) == pytest.approx(math.exp(-0.3))

    def test_works_on_a_plain_list_and_an_answer_meta(self):
        meta = {"logprobs": [{"token": "Paris", "logprob": 0.0}], "all_messages": []}
        assert answer_confidence(meta, "Paris") == pytest.approx(1.0)

    @pytest.mark.parametrize(
        "meta",
        [
            None,
            {},
            {"logprobs": None},
            {"logprobs": {"content": []}},
            {"logprobs": "x"},
            {"logprobs": {"content": [{"token": "a"}]}},
        ],
    )
    def test_no_logprobs(self, meta):
        assert answer_confidence(meta, "Paris") is None
        assert token_logprobs(meta) is None

    def test_only_whitespace_tokens_give_none(self):
        assert answer_confidence(_meta(("\n", -1.0)), None) is None

    @given(st.lists(st.floats(min_value=-50, max_value=0), min_size=1, max_size=20))
    def test_in_unit_interval(self, logprobs):
        meta = _meta(*((f" w{i}", lp) for i, lp in enumerate(logprobs)))
        confidence = answer_confidence(meta)
        assert confidence is not None
        assert 0.0 <= confidence <= 1.0


class TestTokenF1:
    def test_one_copy_shared_with_the_metrics(self):
        assert metrics.token_f1 is token_f1
        assert not hasattr(metrics, "_token_f1")

    @pytest.mark.parametrize(
        ("a", "b", "expected"),
        [
            ("Paris", "paris.", 1.0),
            ("New York", "New Jersey", 0.5),
            ("Gaul", "Roman Gaul", 2 / 3),
            ("Battle of Trafalgar", "Battle of Britain", 2 / 3),
            ("Oslo", "Rome", 0.0),
            ("", "the", 1.0),
            ("", "Rome", 0.0),
        ],
    )
    def test_values_and_symmetry(self, a, b, expected):
        assert token_f1(a, b) == pytest.approx(expected)
        assert token_f1(b, a) == pytest.approx(expected)

    def test_metric_f1_is_the_best_over_golds(self):
        assert metrics.f1("New York", ["New Jersey", "York"]) == pytest.approx(2 / 3)
