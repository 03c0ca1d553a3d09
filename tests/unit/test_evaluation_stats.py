"""
The bootstrap confidence intervals of `haystack_fusion.evaluation.metrics`, against hand-computed cases.

The expected intervals are derived here without scipy: for a small 0/1 sample every resample's mean takes one of a
few values whose probabilities are binomial, and with 1,000 resamples the 2.5th and 97.5th percentiles (numpy's
linear interpolation: sorted positions 24-25 and 974-975) land on a known value unless a count falls many standard
deviations from its expectation. Each case notes the counts it relies on.
"""

from __future__ import annotations

import numpy as np
import pytest

from haystack_fusion.evaluation.metrics import (
    BOOTSTRAP_RESAMPLES,
    CONFIDENCE,
    DEFAULT_SEED,
    bootstrap_settings,
    excludes_zero,
    paired_difference_ci,
    rate_ci,
)


def test_constants_follow_paper_002_appendix_h():
    assert BOOTSTRAP_RESAMPLES == 1000
    assert CONFIDENCE == 0.95
    assert bootstrap_settings(7) == {"resamples": 1000, "confidence": 0.95, "seed": 7, "method": "percentile"}


class TestRateCi:
    def test_two_values_hand_computed(self):
        # Resample means of [0, 1] are 0, 50 or 100 with probabilities 1/4, 1/2, 1/4: about 250 resamples at each
        # end, so both the 2.5th and the 97.5th percentile sit on an extreme.
        assert rate_ci([0, 1]) == (0.0, 100.0)

    def test_one_in_four_hand_computed(self):
        # Resample means of [0, 0, 0, 1] are k/4 with k ~ Binomial(4, 1/4): P(0) = 0.316 (about 316 resamples at 0,
        # >= 26 needed), P(k >= 3) = 0.051 (about 51 at >= 75, >= 26 needed), P(k = 4) = 0.004 (about 4 at 100,
        # <= 24 needed). So the interval is [0, 75], not symmetric around the rate of 25.
        assert rate_ci([0, 0, 0, 1]) == (0.0, 75.0)

    @pytest.mark.parametrize(("values", "expected"), [([1, 1, 1], (100.0, 100.0)), ([0.5, 0.5], (50.0, 50.0))])
    def test_all_equal_values_give_the_rate_at_both_ends(self, values, expected):
        assert rate_ci(values) == expected

    def test_bools_are_rates(self):
        assert rate_ci([False, True]) == (0.0, 100.0)

    @pytest.mark.parametrize("values", [[], [1.0]])
    def test_fewer_than_two_values_have_no_interval(self, values):
        assert rate_ci(values) is None

    def test_the_interval_holds_the_rate(self):
        values = np.random.default_rng(1).integers(0, 2, size=200)
        low, high = rate_ci(values)  # type: ignore[misc]
        assert low < 100 * values.mean() < high
        assert high - low < 20  # about 2 * 1.96 * sqrt(0.25 / 200) = 13.9 points

    def test_same_seed_same_interval_other_seed_other_interval(self):
        values = np.random.default_rng(2).random(50)
        assert rate_ci(values, seed=DEFAULT_SEED) == rate_ci(values, seed=DEFAULT_SEED)
        assert rate_ci(values, seed=1) != rate_ci(values, seed=2)

    def test_rejects_a_table(self):
        with pytest.raises(ValueError, match="1-D"):
            rate_ci([[0, 1], [1, 0]])


class TestPairedDifferenceCi:
    def test_identical_runs_differ_by_nothing(self):
        assert paired_difference_ci([1, 0, 1, 1], [1, 0, 1, 1]) == (0.0, 0.0, 0.0)
        assert not excludes_zero((0.0, 0.0))

    def test_pairing_hand_computed(self):
        # Ten questions, the same answers except the first, which only `a` gets right: the per-question difference
        # is 100 once and 0 nine times. Resampled, the difference is 10 * k with k ~ Binomial(10, 1/10):
        # P(0) = 0.349 (about 349 resamples, >= 26 needed), P(k >= 3) = 0.070 (about 70, >= 26 needed),
        # P(k >= 4) = 0.013 (about 13, <= 24 needed). So the interval is [0, 30]. Unpaired, each rate (50% and 40%
        # on ten questions) would vary by about +-30 points on its own.
        a = [1, 1, 0, 1, 0, 1, 0, 1, 0, 0]
        b = [0, 1, 0, 1, 0, 1, 0, 1, 0, 0]
        assert paired_difference_ci(a, b) == pytest.approx((10.0, 0.0, 30.0))
        assert not excludes_zero((0.0, 30.0))

    def test_a_clear_difference_is_significant(self):
        # 45 questions only `a` gets right, 5 only `b` gets right: +80 points, far from 0.
        a = [1] * 45 + [0] * 5
        b = [0] * 45 + [1] * 5
        difference, low, high = paired_difference_ci(a, b)  # type: ignore[misc]
        assert difference == pytest.approx(80.0)
        assert 50 < low < 80 < high <= 100  # about 80 +- 2 * 8.5 (Binomial(50, 0.9) spread)
        assert excludes_zero((low, high))

    def test_sign_is_a_minus_b(self):
        difference, low, high = paired_difference_ci([0] * 45 + [1] * 5, [1] * 45 + [0] * 5)  # type: ignore[misc]
        assert difference == pytest.approx(-80.0)
        assert high < 0
        assert excludes_zero((low, high))

    def test_constant_difference_without_resampling(self):
        assert paired_difference_ci([1, 1, 1], [0, 0, 0]) == (100.0, 100.0, 100.0)

    def test_same_seed_same_interval(self):
        rng = np.random.default_rng(3)
        a, b = rng.random(40), rng.random(40)
        assert paired_difference_ci(a, b, seed=5) == paired_difference_ci(a, b, seed=5)
        assert paired_difference_ci(a, b, seed=5) != paired_difference_ci(a, b, seed=6)

    @pytest.mark.parametrize(("a", "b"), [([], []), ([1], [0])])
    def test_fewer_than_two_pairs_have_no_interval(self, a, b):
        assert paired_difference_ci(a, b) is None

    def test_lengths_must_match(self):
        with pytest.raises(ValueError, match="one value per question"):
            paired_difference_ci([1, 0], [1, 0, 1])


@pytest.mark.parametrize(
    ("interval", "expected"), [((0.5, 3.0), True), ((-3.0, -0.5), True), ((-1.0, 1.0), False), (None, False)]
)
def test_excludes_zero(interval, expected):
    assert excludes_zero(interval) is expected
