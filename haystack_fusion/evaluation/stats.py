"""
Bootstrap confidence intervals for the evaluation's rates, as pure functions on per-question values.

Kim et al., Appendix H reports "95% confidence intervals obtained through 1,000 iterations of bootstrapping" for EM
and F1; the report does the same for every rate. The resampled unit is a question; `scipy.stats.bootstrap` does the
resampling with the "percentile" method (Appendix H names no correction, and scipy's default BCa can return nan on
small 0/1 samples). Inputs are per-question scores in [0, 1]; outputs are percentages x100 (differences: percentage
points). The generator is seeded afresh for every interval, so an interval depends only on its values and the seed.
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
    """The bootstrap's settings as a report states them: `resamples`, `confidence`, `seed` and `method`."""
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
    The 95% percentile-bootstrap confidence interval of a rate, the mean of per-question values x100 (Kim et al.,
    Appendix H: 1,000 resamples of the questions).

    :param values: One value per question in [0, 1], for exactly the questions the rate is computed over.
    :returns: (low, high) in percent; None for fewer than two values; the rate at both ends when all values are equal.
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
    The difference of two rates over the same questions, with its 95% paired-bootstrap confidence interval: each
    resample takes the same questions for both (`scipy.stats.bootstrap(paired=True)`), settings as in `rate_ci`.

    :param a: One value per question in [0, 1] for the strategy compared.
    :param b: The values of the same questions, in the same order, for the baseline.
    :returns: (difference, low, high) in percentage points, `a` minus `b`; None for fewer than two pairs; the
        difference at both ends when every per-question difference is the same.
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
    """Whether an interval (low, high) lies entirely above or below 0 (a significant difference); False for None."""
    if interval is None:
        return False
    low, high = interval[0], interval[1]
    return bool(low > 0 or high < 0)
