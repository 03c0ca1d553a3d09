from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from haystack_fusion.answers import (
    DEMONSTRATION,
    PASSAGE_MARKUP,
    UnknownDetector,
    invalid_meta,
    normalize_answer,
)
from haystack_fusion.evaluation.metrics import (
    QuestionScore,
    accuracy,
    exact_match,
    f1,
    gold_in_pool,
    is_unknown,
    outcome_counts,
    retrieval_hit,
    summarize,
    with_answer_outcome,
)
from tests.unit.scores import DEMO, outcome_score

BASE = QuestionScore(
    id="q",
    answerable=True,
    em=0.0,
    f1=0.0,
    accuracy=0.0,
    unknown=False,
    pool_has_gold=None,
    majority_correct=None,
    retrieval_hit=None,
    prompt_tokens=0,
    completion_tokens=0,
    calls=1,
    seconds=1.0,
)


def score(**changes: object) -> QuestionScore:
    return replace(BASE, **changes)  # type: ignore[arg-type]


WORDS = ["the", "a", "an", "cat", "sat", "down", "Paris", "paris.", "Tower", "x", "", " "]
answer_text = st.one_of(st.lists(st.sampled_from(WORDS), max_size=6).map(" ".join), st.text(max_size=15))


class TestExactMatch:
    @pytest.mark.parametrize(
        ("prediction", "gold"),
        [
            ("The Eiffel Tower", "eiffel tower"),  # case and article
            ("Paris, France.", "paris france"),  # punctuation
            ("  Saw   VI\n", "saw vi"),  # whitespace
            ("an apple", "Apple"),
            ("Butch Vig!", '"Butch Vig"'),
        ],
    )
    def test_normalized_match(self, prediction: str, gold: str) -> None:
        assert exact_match(prediction, [gold]) == 1.0

    @pytest.mark.parametrize(
        ("prediction", "gold"),
        [
            ("Theater", "ater"),  # "the" is removed only as a word
            ("Anna", "na"),  # "an" only as a word
            ("Athens", "thens"),  # "a" only as a word
            ("Paris France", "Paris"),
        ],
    )
    def test_articles_only_as_words(self, prediction: str, gold: str) -> None:
        assert exact_match(prediction, [gold]) == 0.0

    def test_max_over_golds(self) -> None:
        assert exact_match("JFK", ["John F. Kennedy", "jfk"]) == 1.0
        assert exact_match("Kennedy", ["John F. Kennedy", "jfk"]) == 0.0

    def test_no_golds(self) -> None:
        assert exact_match("Paris", []) == 0.0

    def test_empty_prediction(self) -> None:
        assert exact_match("", ["Paris"]) == 0.0
        # Official script: both normalize to "" and are equal.
        assert exact_match("", ["The"]) == 1.0


class TestF1:
    def test_partial_overlap_by_hand(self) -> None:
        # "the cat sat" -> [cat, sat]; "cat sat down" -> [cat, sat, down]: P = 2/2, R = 2/3, F1 = 2PR/(P+R) = 0.8
        assert f1("the cat sat", ["cat sat down"]) == pytest.approx(0.8)

    def test_repeated_tokens_use_multiset_overlap(self) -> None:
        # [cat, cat, cat] vs [cat, dog]: overlap 1, P = 1/3, R = 1/2, F1 = 2 * (1/6) / (5/6) = 0.4
        assert f1("cat cat cat", ["cat dog"]) == pytest.approx(0.4)

    def test_max_over_golds(self) -> None:
        assert f1("the cat sat", ["dog", "cat sat down", "cat"]) == pytest.approx(0.8)
        assert f1("cat", ["dog", "cat sat down", "cat"]) == 1.0

    def test_no_overlap(self) -> None:
        assert f1("dog", ["cat"]) == 0.0

    def test_empty_sides(self) -> None:
        assert f1("", ["Paris"]) == 0.0
        assert f1("Paris", ["the"]) == 0.0
        assert f1("a", ["The!"]) == 1.0  # both normalize to no tokens

    def test_no_golds(self) -> None:
        assert f1("Paris", []) == 0.0

    @settings(max_examples=200, deadline=None)
    @given(prediction=answer_text, gold=answer_text)
    def test_em_le_f1_and_bounds_single_gold(self, prediction: str, gold: str) -> None:
        em, f = exact_match(prediction, [gold]), f1(prediction, [gold])
        assert em in (0.0, 1.0)
        assert 0.0 <= f <= 1.0
        assert em <= f
        if normalize_answer(gold):  # empty golds are ignored by accuracy but still match by EM
            assert accuracy(prediction, [gold]) >= em

    @settings(max_examples=100, deadline=None)
    @given(prediction=answer_text, golds=st.lists(answer_text, max_size=4))
    def test_bounds_several_golds(self, prediction: str, golds: list[str]) -> None:
        assert 0.0 <= exact_match(prediction, golds) <= f1(prediction, golds) <= 1.0


class TestAccuracy:
    def test_gold_substring_of_prediction(self) -> None:
        assert accuracy("It was built by Gustave Eiffel in 1889.", ["gustave eiffel"]) == 1.0

    def test_normalized_before_substring_test(self) -> None:
        assert accuracy("The answer is: THE Eiffel-Tower", ["Eiffel Tower"]) == 0.0  # hyphen removed, not spaced
        assert accuracy("The answer is: THE Eiffel Tower!", ["the eiffel tower"]) == 1.0

    def test_prediction_inside_gold_is_not_enough(self) -> None:
        assert accuracy("Eiffel", ["Gustave Eiffel"]) == 0.0

    def test_empty_golds_ignored(self) -> None:
        assert accuracy("anything", ["", "the", "  "]) == 0.0
        assert accuracy("anything", []) == 0.0
        assert accuracy("Paris", ["", "paris"]) == 1.0

    def test_exact_match_is_accurate(self) -> None:
        assert accuracy("Paris", ["paris"]) == 1.0


class TestIsUnknown:
    @pytest.mark.parametrize("prediction", ["unknown", "Unknown.", "I don't know", "", None])
    def test_abstentions(self, prediction: str | None) -> None:
        assert is_unknown(prediction) is True

    def test_answers(self) -> None:
        assert is_unknown("Paris") is False
        assert is_unknown("Unknown Pleasures") is False

    def test_custom_detector(self) -> None:
        detector = UnknownDetector((r"^pass$",))
        assert is_unknown("pass", detector) is True
        assert is_unknown("unknown", detector) is False


class TestGoldInPool:
    def test_candidate_matches_gold(self) -> None:
        assert gold_in_pool(["Lyon", "The Paris"], ["paris"]) is True

    def test_no_match_partial_not_enough(self) -> None:
        assert gold_in_pool(["Lyon", "Paris France"], ["paris"]) is False

    def test_empty(self) -> None:
        assert gold_in_pool([], ["paris"]) is False
        assert gold_in_pool(["paris"], []) is False


class TestRetrievalHit:
    def test_case_insensitive_and_whitespace_collapsed(self) -> None:
        passages = ["Nothing here.", "The tower was designed by\n  GUSTAVE   Eiffel in 1889."]
        assert retrieval_hit(passages, ["Gustave Eiffel"]) is True

    def test_miss(self) -> None:
        assert retrieval_hit(["The tower is in Paris."], ["Lyon", "Gustave Eiffel"]) is False

    def test_punctuation_kept(self) -> None:
        assert retrieval_hit(["Born in St. Louis."], ["St Louis"]) is False

    def test_empty_inputs(self) -> None:
        assert retrieval_hit([], ["Paris"]) is False
        assert retrieval_hit(["Paris"], ["", "  "]) is False


class TestQuestionScore:
    @pytest.mark.parametrize(
        "changes",
        [{"em": 1.5}, {"f1": -0.1}, {"accuracy": 2.0}, {"calls": -1}, {"seconds": float("nan")}, {"prompt_tokens": -3}],
    )
    def test_invalid_values(self, changes: dict[str, object]) -> None:
        with pytest.raises(ValueError, match="QuestionScore 'q'"):
            score(**changes)

    def test_pool_with_gold_needs_majority(self) -> None:
        with pytest.raises(ValueError, match="majority_correct"):
            score(pool_has_gold=True, majority_correct=None)

    def test_frozen(self) -> None:
        with pytest.raises(AttributeError):
            BASE.em = 1.0  # type: ignore[misc]


class TestSummarize:
    def test_empty_raises(self) -> None:
        with pytest.raises(ValueError, match="empty"):
            summarize([])

    def test_keys(self) -> None:
        assert list(summarize([BASE])) == [
            "questions",
            "answerable",
            "unanswerable",
            "em",
            "f1",
            "accuracy",
            "unknown_rate",
            "nm_rate",
            "nm_count",
            "pool_has_gold_count",
            "reject_rate",
            "recall_at_k",
            "calls_per_question",
            "prompt_tokens_per_question",
            "completion_tokens_per_question",
            "tokens_per_question",
            "latency_p50",
            "latency_p95",
        ]

    def test_answer_metrics_over_answerable_only(self) -> None:
        scores = [
            score(id="1", em=1.0, f1=1.0, accuracy=1.0),
            score(id="2", em=0.0, f1=0.5, accuracy=1.0),
            score(id="3", em=0.0, f1=0.0, accuracy=0.0, unknown=True),
            score(id="4", em=0.0, f1=0.0, accuracy=0.0),
            # Unanswerable: its scores must not enter em / f1 / accuracy / unknown_rate.
            score(id="5", answerable=False, em=1.0, f1=1.0, accuracy=1.0, unknown=True),
        ]
        result = summarize(scores)
        assert (result["questions"], result["answerable"], result["unanswerable"]) == (5, 4, 1)
        assert result["em"] == pytest.approx(25.0)
        assert result["f1"] == pytest.approx(37.5)
        assert result["accuracy"] == pytest.approx(50.0)
        assert result["unknown_rate"] == pytest.approx(25.0)
        assert result["reject_rate"] == pytest.approx(100.0)

    def test_no_answerable(self) -> None:
        result = summarize([score(answerable=False, unknown=True)])
        assert result["em"] is None
        assert result["f1"] is None
        assert result["accuracy"] is None
        assert result["unknown_rate"] is None
        assert result["recall_at_k"] is None

    def test_nm_none_without_pools(self) -> None:
        result = summarize([score(id="1"), score(id="2", em=1.0)])
        assert result["nm_rate"] is None
        assert result["nm_count"] is None
        assert result["pool_has_gold_count"] is None

    def test_nm_counts_only_pools_with_gold(self) -> None:
        scores = [
            score(id="right", pool_has_gold=True, majority_correct=True),
            score(id="wrong", pool_has_gold=True, majority_correct=False),
            score(id="wrong2", pool_has_gold=True, majority_correct=False),
            score(id="no-gold", pool_has_gold=False, majority_correct=False),  # not counted
            score(id="no-pool"),  # not counted
            score(id="unanswerable", answerable=False, pool_has_gold=False, majority_correct=False),
        ]
        result = summarize(scores)
        assert result["pool_has_gold_count"] == 3
        assert result["nm_count"] == 2
        assert result["nm_rate"] == pytest.approx(200 / 3)

    def test_nm_all_majorities_right(self) -> None:
        result = summarize([score(pool_has_gold=True, majority_correct=True)])
        assert result["nm_rate"] == 0.0
        assert result["nm_count"] == 0

    def test_nm_pools_without_gold(self) -> None:
        result = summarize([score(pool_has_gold=False, majority_correct=False)])
        assert result["nm_rate"] is None
        assert result["nm_count"] == 0
        assert result["pool_has_gold_count"] == 0

    def test_reject_rate_none_without_unanswerable(self) -> None:
        assert summarize([score(unknown=True)])["reject_rate"] is None

    def test_reject_rate_counts_paraphrases(self) -> None:
        predictions = ["unknown", "I don't know.", "The context does not provide the year.", "1889"]
        scores = [
            score(id=str(i), answerable=False, unknown=is_unknown(prediction))
            for i, prediction in enumerate(predictions)
        ]
        assert summarize(scores)["reject_rate"] == pytest.approx(75.0)

    def test_recall_at_k_over_measured_answerable(self) -> None:
        scores = [
            score(id="1", retrieval_hit=True),
            score(id="2", retrieval_hit=False),
            score(id="3", retrieval_hit=None),  # not measured
            score(id="4", answerable=False, retrieval_hit=False),  # unanswerable: not counted
        ]
        assert summarize(scores)["recall_at_k"] == pytest.approx(50.0)
        assert summarize([BASE])["recall_at_k"] is None

    def test_costs_per_question(self) -> None:
        scores = [
            score(id="1", prompt_tokens=100, completion_tokens=10, calls=5),
            score(id="2", prompt_tokens=300, completion_tokens=30, calls=1),
            score(id="3", answerable=False, prompt_tokens=200, completion_tokens=20, calls=0),
        ]
        result = summarize(scores)
        assert result["prompt_tokens_per_question"] == pytest.approx(200.0)
        assert result["completion_tokens_per_question"] == pytest.approx(20.0)
        assert result["tokens_per_question"] == pytest.approx(220.0)
        assert result["calls_per_question"] == pytest.approx(2.0)

    def test_latency_percentiles(self) -> None:
        # Linear interpolation over 1..10 (numpy's default): p50 = 5.5; p95 at position 9 * 0.95 = 8.55 -> 9.55.
        scores = [score(id=str(s), seconds=float(s)) for s in (7, 2, 10, 1, 5, 3, 9, 4, 8, 6)]
        result = summarize(scores)
        assert result["latency_p50"] == pytest.approx(5.5)
        assert result["latency_p95"] == pytest.approx(9.55)

    def test_latency_equal_values_do_not_overshoot(self) -> None:
        # statistics.quantiles returns 86.4537668164575 here, one ulp above the maximum.
        result = summarize([score(id="1", seconds=86.45376681645749), score(id="2", seconds=86.45376681645749)])
        assert result["latency_p50"] == result["latency_p95"] == 86.45376681645749

    def test_latency_single_question(self) -> None:
        result = summarize([score(seconds=2.5)])
        assert result["latency_p50"] == 2.5
        assert result["latency_p95"] == 2.5

    @settings(max_examples=100, deadline=None)
    @given(
        st.lists(
            st.builds(
                QuestionScore,
                id=st.just("q"),
                answerable=st.booleans(),
                em=st.sampled_from([0.0, 1.0]),
                f1=st.floats(0.0, 1.0),
                accuracy=st.sampled_from([0.0, 1.0]),
                unknown=st.booleans(),
                pool_has_gold=st.none() | st.booleans(),
                majority_correct=st.booleans(),
                retrieval_hit=st.none() | st.booleans(),
                prompt_tokens=st.integers(0, 10_000),
                completion_tokens=st.integers(0, 1_000),
                calls=st.integers(0, 50),
                seconds=st.floats(0.0, 100.0),
            ),
            min_size=1,
            max_size=20,
        )
    )
    def test_bounds(self, scores: list[QuestionScore]) -> None:
        result = summarize(scores)
        assert result["answerable"] + result["unanswerable"] == result["questions"] == len(scores)  # type: ignore[operator]
        for key in ("em", "f1", "accuracy", "unknown_rate", "nm_rate", "reject_rate", "recall_at_k"):
            value = result[key]
            assert value is None or 0.0 <= value <= 100.0 + 1e-9, key
        latencies = [s.seconds for s in scores]
        assert min(latencies) <= result["latency_p50"] <= result["latency_p95"] <= max(latencies)  # type: ignore[operator]
        if result["nm_count"] is not None:
            assert 0 <= result["nm_count"] <= result["pool_has_gold_count"] <= result["answerable"]  # type: ignore[operator]


class TestWithAnswerOutcome:
    def test_an_old_record_scores_as_it_did(self):
        old = outcome_score()
        assert with_answer_outcome(old, "Paris", {"usage": {"calls": 1}}) == old

    def test_a_blank_abstention_is_empty_and_unknown(self):
        got = with_answer_outcome(outcome_score(em=0.0, f1=0.0, accuracy=0.0, unknown=True), "  ", {})
        assert (got.empty, got.unknown, got.invalid, got.truncated) == (True, True, False, False)

    def test_an_invalid_answer_is_not_unknown_and_scores_zero(self):
        # An empty prediction matches a gold answer that normalizes to "" ("The"): a rejected one must not.
        before = outcome_score(em=1.0, f1=1.0, accuracy=1.0, unknown=True)
        got = with_answer_outcome(before, "", invalid_meta(DEMO, DEMONSTRATION))
        assert (got.invalid, got.empty, got.unknown) == (True, True, False)
        assert (got.em, got.f1, got.accuracy) == (0.0, 0.0, 0.0)

    @pytest.mark.parametrize(
        ("evidence", "usage", "truncated", "calls"),
        [
            ({"finish_reason": "length"}, None, True, 0),  # the answer's own reply was cut
            ({"finish_reason": "stop", "usage": {"truncated": 2}}, None, False, 2),  # others were, not the answer's
            ({"usage": {"truncated": 1}}, None, True, 1),  # no one reply: any cut call
            ({"usage": {"truncated": 1}}, {"truncated": 3}, True, 3),  # a run's usage and the record's: the larger
            ({}, {"calls": 4}, False, 0),
        ],
    )
    def test_truncation(self, evidence, usage, truncated, calls):
        got = with_answer_outcome(outcome_score(), "Paris", evidence, usage)
        assert (got.truncated, got.truncated_calls) == (truncated, calls)

    def test_applying_it_twice_changes_nothing(self):
        evidence = {**invalid_meta("<passage", PASSAGE_MARKUP), "usage": {"truncated": 1}}
        once = with_answer_outcome(outcome_score(unknown=True), "", evidence)
        assert with_answer_outcome(once, "", evidence) == once

    def test_an_answer_cannot_be_invalid_and_unknown(self):
        with pytest.raises(ValueError, match="invalid answer is not an abstention"):
            outcome_score(invalid=True, unknown=True)
        with pytest.raises(ValueError, match="truncated_calls"):
            outcome_score(truncated_calls=-1)


class TestOutcomeCounts:
    def test_hand_computed(self):
        scores = [
            outcome_score(id="answered"),
            outcome_score(id="answered-cut", truncated=True, truncated_calls=2),
            outcome_score(id="unknown", unknown=True),
            outcome_score(id="blank", unknown=True, empty=True, truncated_calls=1),
            outcome_score(id="invalid", empty=True, invalid=True, answerable=False),
        ]
        assert outcome_counts(scores) == {
            "answered_count": 2,
            "unknown_count": 2,
            "empty_count": 2,
            "invalid_count": 1,
            "truncated_count": 1,
            "truncated_calls": 3,
        }
