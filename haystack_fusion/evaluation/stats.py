"""
Bootstrap confidence intervals for the evaluation's rates, as pure functions on arrays of per-question values.

Kim et al., Appendix H ("Experimental Results with Confidence Interval") reports "95% confidence intervals obtained
through 1,000 iterations of bootstrapping" (Efron & Tibshirani, 1994) for EM and F1. The same is done here for every
rate of the report: the resampled unit is a question (its 0/1 or [0, 1] score), drawn with replacement as many times
as there are questions, 1,000 times (`BOOTSTRAP_RESAMPLES`); the interval holds the central 95% (`CONFIDENCE`) of the
resampled means.

The resampling is `scipy.stats.bootstrap`; nothing statistical is written by hand. The method is `"percentile"`
(`BOOTSTRAP_METHOD`), the plain reading of Appendix H, which names no correction: the bounds are the 2.5th and 97.5th
percentiles of the 1,000 resampled means (numpy's default linear interpolation). It is also well behaved on the
small 0/1 samples of an evaluation, where scipy's default BCa method can return nan.

Units: the inputs are per-question scores in [0, 1] (EM, F1, accuracy, unknown flags, retrieval hits); the outputs
are percentages x100, like `metrics.summarize`, and differences are percentage points.

The random generator is seeded (`DEFAULT_SEED` unless told otherwise) and built afresh for every interval, so an
interval depends only on its values and the seed, not on which intervals were computed before it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

__all__ = [
    "BOOTSTRAP_METHOD",
    "BOOTSTRAP_RESAMPLES",
    "CONFIDENCE",
    "DEFAULT_SEED",
    "bootstrap_settings",
    "excludes_zero",
    "paired_difference_ci",
    "rate_ci",
]

BOOTSTRAP_RESAMPLES = 1000
CONFIDENCE = 0.95
DEFAULT_SEED = 0
BOOTSTRAP_METHOD = "percentile"

# scipy 1.15 renamed `random_state` to `rng`; scipy>=1.11 is supported, so the keyword is picked from the signature.
_RNG_KEYWORD = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"


def bootstrap_settings(seed: int = DEFAULT_SEED, resamples: int = BOOTSTRAP_RESAMPLES) -> dict[str, Any]:
    """
    The bootstrap's settings, as a report states them.

    :param seed: The seed of the random generator.
    :param resamples: The number of bootstrap resamples.
    :returns: `resamples`, `confidence`, `seed` and `method` (the `scipy.stats.bootstrap` method).
    """
    return {"resamples": resamples, "confidence": CONFIDENCE, "seed": seed, "method": BOOTSTRAP_METHOD}


def _as_percentages(values: Sequence[float | bool] | np.ndarray) -> np.ndarray:
    """Per-question values in [0, 1] as a 1-D float array of percentages (x100)."""
    array = 100.0 * np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise ValueError(f"expected one value per question (a 1-D sequence), got shape {array.shape}")
    return array


def _mean_difference(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    """The bootstrap statistic of a paired difference: mean(a) - mean(b), vectorized along `axis`."""
    return np.asarray(np.mean(a, axis=axis) - np.mean(b, axis=axis))


def _bootstrap(data: tuple[np.ndarray, ...], statistic: Any, *, paired: bool, seed: int, resamples: int) -> Any:
    """`scipy.stats.bootstrap` with the report's settings: percentile method, 95% two-sided, a seeded generator."""
    return stats.bootstrap(
        data,
        statistic,
        n_resamples=resamples,
        vectorized=True,
        paired=paired,
        confidence_level=CONFIDENCE,
        method=BOOTSTRAP_METHOD,
        **{_RNG_KEYWORD: np.random.default_rng(seed)},
    ).confidence_interval


def rate_ci(
    values: Sequence[float | bool] | np.ndarray, *, seed: int = DEFAULT_SEED, resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[float, float] | None:
    """
    The 95% percentile-bootstrap confidence interval of a rate, the mean of per-question values x100.

    Questions are resampled with replacement (Kim et al., Appendix H: 1,000 resamples, 95%), the rate is recomputed
    on each resample, and the bounds are the 2.5th and 97.5th percentiles of those rates (`scipy.stats.bootstrap`,
    method "percentile").

    Edge cases: fewer than two values have no interval (None). When every value is the same, every resample has the
    same mean, so the interval is that rate at both ends; it is returned directly, without resampling.

    :param values: One value per question in [0, 1] (e.g. EM 0/1, F1, or unknown flags as bools), for exactly the
        questions the rate is computed over.
    :param seed: The seed of the random generator.
    :param resamples: The number of bootstrap resamples.
    :returns: (low, high) in percent, or None for fewer than two values.
    :raises ValueError: If `values` is not one-dimensional.
    """
    sample = _as_percentages(values)
    if sample.size < 2:
        return None
    if np.all(sample == sample[0]):
        return (float(sample[0]), float(sample[0]))
    interval = _bootstrap((sample,), np.mean, paired=False, seed=seed, resamples=resamples)
    return (float(interval.low), float(interval.high))


def paired_difference_ci(
    a: Sequence[float | bool] | np.ndarray,
    b: Sequence[float | bool] | np.ndarray,
    *,
    seed: int = DEFAULT_SEED,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> tuple[float, float, float] | None:
    """
    The difference of two rates over the same questions, with its 95% paired-bootstrap confidence interval.

    `a[i]` and `b[i]` are the scores of the same question under two strategies. Each resample draws question
    indices with replacement and takes them for both strategies at once (`scipy.stats.bootstrap` with
    `paired=True`), so the interval reflects the per-question difference and not the spread of each rate on its own;
    the statistic is mean(a) - mean(b). Settings as in `rate_ci` (1,000 resamples, 95%, percentile method; Kim et al.,
    Appendix H). A difference is significant at the 95% level when its interval excludes 0 (`excludes_zero`).

    Edge cases: fewer than two pairs have no interval (None). When every per-question difference is the same (e.g.
    identical arrays), every resample gives that difference, so it is returned at both ends without resampling.

    :param a: One value per question in [0, 1] for the strategy compared.
    :param b: The values of the same questions, in the same order, for the baseline.
    :param seed: The seed of the random generator.
    :param resamples: The number of bootstrap resamples.
    :returns: (difference, low, high) in percentage points (rate of `a` minus rate of `b`), or None for fewer than
        two pairs.
    :raises ValueError: If `a` and `b` are not one-dimensional or differ in length.
    """
    first, second = _as_percentages(a), _as_percentages(b)
    if first.shape != second.shape:
        raise ValueError(f"paired samples must have one value per question each, got {first.size} and {second.size}")
    if first.size < 2:
        return None
    difference = float(np.mean(first) - np.mean(second))
    per_question = first - second
    if np.all(per_question == per_question[0]):
        return (difference, difference, difference)
    interval = _bootstrap((first, second), _mean_difference, paired=True, seed=seed, resamples=resamples)
    return (difference, float(interval.low), float(interval.high))


def excludes_zero(interval: Sequence[float] | None) -> bool:
    """
    Whether a confidence interval lies entirely above or entirely below 0 (the difference is significant).

    :param interval: (low, high), or None for no interval.
    :returns: True when low > 0 or high < 0; False for None.
    """
    if interval is None:
        return False
    low, high = interval[0], interval[1]
    return bool(low > 0 or high < 0)
