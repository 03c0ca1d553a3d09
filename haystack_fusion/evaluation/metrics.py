"""The papers' evaluation metrics as pure functions: per-question scores and their aggregate over a run, normalized as
`haystack_fusion.answers` (so voting and evaluation agree). Rates carry 95% bootstrap confidence intervals over
questions (Kim et al., Appendix H), "percentile" method (BCa can return nan on small 0/1 samples), seeded afresh."""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from haystack_fusion.answers import UnknownDetector, is_invalid, normalize_answer, token_f1
from haystack_fusion.llm import TRUNCATED_FINISH_REASON

BOOTSTRAP_RESAMPLES = 1000
CONFIDENCE = 0.95
DEFAULT_SEED = 0
BOOTSTRAP_METHOD = "percentile"
# scipy 1.15 renamed `random_state` to `rng` (scipy>=1.11 is supported)
_RNG_KEYWORD = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """Exact match (EM), 1.0 or 0.0, as the official SQuAD script (Liu et al., section 4; Yu et al., section 3.1.3)."""
    return float(normalize_answer(prediction) in {normalize_answer(gold) for gold in golds})


def f1(prediction: str, golds: Sequence[str]) -> float:
    """Token F1 in [0, 1], the best over the gold answers, as the official SQuAD script (the same sections)."""
    return max((token_f1(prediction, gold) for gold in golds), default=0.0)


def accuracy(prediction: str, golds: Sequence[str]) -> float:
    """Substring accuracy (Yu et al., section 3.1.3): 1.0 when a normalized gold answer is in the prediction."""
    normalized = normalize_answer(prediction)
    return float(any(gold_norm and gold_norm in normalized for gold_norm in map(normalize_answer, golds)))


def is_unknown(prediction: str | None, detector: UnknownDetector | None = None) -> bool:
    """Whether a prediction abstains ("" and None too): %Unk (Liu et al., section 4), reject rate (Yu et al., 3.4)."""
    return (detector or UnknownDetector()).is_unknown(prediction)


def gold_in_pool(candidates: Sequence[str], golds: Sequence[str]) -> bool:
    """Whether a candidate of the post-fusion pool exactly matches a gold answer: %NM's condition (Liu et al., 4)."""
    return any(exact_match(candidate, golds) == 1.0 for candidate in candidates)


def retrieval_hit(passages: Sequence[str], golds: Sequence[str]) -> bool:
    """Answer recall@k of one question (Liu et al., section 4.3): a gold answer is in a passage (case-folded)."""
    needles = [needle for gold in golds if (needle := " ".join(gold.casefold().split()))]
    haystacks = [" ".join(passage.casefold().split()) for passage in passages]
    return any(needle in haystack for haystack in haystacks for needle in needles)


@dataclass(frozen=True)
class QuestionScore:
    """The scores and costs of one question under one strategy: `em`, `f1`, `accuracy` in [0, 1]; `pool_has_gold` and
    `majority_correct` None without a post-fusion pool; `seconds` of wall time; outcome flags: `with_answer_outcome`.
    :raises ValueError: If a score is outside [0, 1], a cost is negative or not finite, `pool_has_gold` is True with
        `majority_correct` None, or an answer is both invalid and unknown."""

    id: str
    answerable: bool
    em: float
    f1: float
    accuracy: float
    unknown: bool
    pool_has_gold: bool | None
    majority_correct: bool | None
    retrieval_hit: bool | None
    prompt_tokens: int
    completion_tokens: int
    calls: int
    seconds: float
    empty: bool = False
    invalid: bool = False
    truncated: bool = False
    truncated_calls: int = 0

    def __post_init__(self) -> None:
        for name in ("em", "f1", "accuracy"):
            if not 0.0 <= (value := getattr(self, name)) <= 1.0:
                raise ValueError(f"QuestionScore {self.id!r}: `{name}` must be in [0, 1], got {value!r}")
        for name in ("prompt_tokens", "completion_tokens", "calls", "seconds", "truncated_calls"):
            if not (math.isfinite(value := getattr(self, name)) and value >= 0):
                raise ValueError(f"QuestionScore {self.id!r}: `{name}` must be a finite number >= 0, got {value!r}")
        if self.pool_has_gold and self.majority_correct is None:
            raise ValueError(f"QuestionScore {self.id!r}: `majority_correct` is None but `pool_has_gold` is True")
        if self.invalid and self.unknown:
            raise ValueError(f"QuestionScore {self.id!r}: an invalid answer is not an abstention (`unknown` is True)")


def with_answer_outcome(score: QuestionScore, prediction: str | None, evidence: Mapping[str, Any] | None,
                        usage: Mapping[str, Any] | None = None) -> QuestionScore:  # fmt: skip
    """The score with `empty`, `invalid` (`answers.is_invalid`: then not unknown and EM, F1, accuracy 0.0),
    `truncated_calls` (calls the token cap cut) and `truncated` (the final reply, or any call, was cut) set."""
    evidence = evidence or {}
    recorded = evidence.get("usage") if isinstance(evidence.get("usage"), Mapping) else {}
    truncated_calls = max(int((usage or {}).get("truncated") or 0), int((recorded or {}).get("truncated") or 0))
    truncated = (evidence.get("finish_reason") == TRUNCATED_FINISH_REASON if "finish_reason" in evidence
                 else truncated_calls > 0)  # fmt: skip
    invalid = is_invalid(dict(evidence))
    changes: dict[str, Any] = {"empty": not (prediction or "").strip(), "invalid": invalid, "truncated": truncated,
                               "truncated_calls": truncated_calls}  # fmt: skip
    if invalid:
        changes.update(unknown=False, em=0.0, f1=0.0, accuracy=0.0)
    return dataclasses.replace(score, **changes)


def outcome_counts(scores: Sequence[QuestionScore]) -> dict[str, int]:
    """How many of a run's final answers were not answers, and how many were answered."""
    return {"answered_count": sum(not (s.empty or s.invalid or s.unknown) for s in scores),
            **{f"{flag}_count": sum(getattr(s, flag) for s in scores) for flag in ("unknown", "empty", "invalid",
                                                                                   "truncated")},
            "truncated_calls": sum(s.truncated_calls for s in scores)}  # fmt: skip


RATES: dict[str, Callable[[Sequence[QuestionScore]], list[Any]]] = {
    "em": lambda ss: [s.em for s in ss if s.answerable], "f1": lambda ss: [s.f1 for s in ss if s.answerable],
    "accuracy": lambda ss: [s.accuracy for s in ss if s.answerable],
    "unknown_rate": lambda ss: [s.unknown for s in ss if s.answerable],
    "reject_rate": lambda ss: [s.unknown for s in ss if not s.answerable],
    "recall_at_k": lambda ss: [s.retrieval_hit for s in ss if s.answerable and s.retrieval_hit is not None],
}  # fmt: skip
"""The rates of `summarize`: the mean of these per-question values x100 (`summarize_with_intervals`: their CI)."""


def summarize(scores: Sequence[QuestionScore]) -> dict[str, float | int | None]:
    """The figures of a report, unrounded: the `RATES` in percent (None for an empty denominator), `nm_rate` (%NM, Liu
    et al., section 4: nm_count / pool_has_gold_count, None without a pool), costs per question (section 4.2) and
    `latency_p50`, `latency_p95` in seconds. :raises ValueError: If `scores` is empty."""
    if not scores:
        raise ValueError("`scores` is empty: there is nothing to summarize (the run scored no question)")
    answerable = [score for score in scores if score.answerable]
    n = len(scores)
    rates = {key: 100.0 * sum(v) / len(v) if (v := values(scores)) else None for key, values in RATES.items()}
    has_pool = any(score.pool_has_gold is not None for score in scores)
    with_gold = [score for score in answerable if score.pool_has_gold]
    nm_count = sum(1 for score in with_gold if score.majority_correct is False)
    prompt_tokens = sum(score.prompt_tokens for score in scores)
    completion_tokens = sum(score.completion_tokens for score in scores)
    seconds = [score.seconds for score in scores]
    return {
        "questions": n, "answerable": len(answerable), "unanswerable": n - len(answerable),
        **{key: rates[key] for key in ("em", "f1", "accuracy", "unknown_rate")},
        "nm_rate": (100.0 * nm_count / len(with_gold) if with_gold else None) if has_pool else None,
        "nm_count": nm_count if has_pool else None, "pool_has_gold_count": len(with_gold) if has_pool else None,
        "reject_rate": rates["reject_rate"], "recall_at_k": rates["recall_at_k"],
        "calls_per_question": sum(score.calls for score in scores) / n,
        "prompt_tokens_per_question": prompt_tokens / n, "completion_tokens_per_question": completion_tokens / n,
        "tokens_per_question": (prompt_tokens + completion_tokens) / n,
        "latency_p50": float(np.percentile(seconds, 50)), "latency_p95": float(np.percentile(seconds, 95)),
    }  # fmt: skip


def bootstrap_settings(seed: int = DEFAULT_SEED, resamples: int = BOOTSTRAP_RESAMPLES) -> dict[str, Any]:
    """The bootstrap's settings as a report states them: `resamples`, `confidence`, `seed` and `method`."""
    return {"resamples": resamples, "confidence": CONFIDENCE, "seed": seed, "method": BOOTSTRAP_METHOD}


def _sample(values: Sequence[float | bool] | np.ndarray, scale: float = 100.0) -> np.ndarray:
    array = scale * np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise ValueError(f"expected one value per question (a 1-D sequence), got shape {array.shape}")
    return array


def _bootstrap(data: tuple[np.ndarray, ...], statistic: Any, *, paired: bool, seed: int, resamples: int,
               vectorized: bool = True) -> tuple[float, float]:  # fmt: skip
    interval = stats.bootstrap(data, statistic, n_resamples=resamples, vectorized=vectorized, paired=paired,
                               confidence_level=CONFIDENCE, method=BOOTSTRAP_METHOD,
                               **{_RNG_KEYWORD: np.random.default_rng(seed)}).confidence_interval  # fmt: skip
    return float(interval.low), float(interval.high)


def rate_ci(values: Sequence[float | bool] | np.ndarray, *, seed: int = DEFAULT_SEED,
            resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float] | None:  # fmt: skip
    """The 95% bootstrap CI (low, high) of a rate, the mean of per-question values in [0, 1] x100, in percent; None
    for fewer than two values. :raises ValueError: If `values` is not one-dimensional."""
    return mean_ci(_sample(values), seed=seed, resamples=resamples)


def mean_ci(values: Sequence[float] | np.ndarray, *, seed: int = DEFAULT_SEED,
            resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float] | None:  # fmt: skip
    """`rate_ci` of values in their own unit (e.g. US dollars), not x100. :raises ValueError: As `rate_ci`."""
    sample = _sample(values, 1.0)
    if sample.size < 2:
        return None
    if np.all(sample == sample[0]):
        return (float(sample[0]), float(sample[0]))
    return _bootstrap((sample,), np.mean, paired=False, seed=seed, resamples=resamples)


def paired_difference_ci(a: Sequence[float | bool] | np.ndarray, b: Sequence[float | bool] | np.ndarray, *,
                         seed: int = DEFAULT_SEED, resamples: int = BOOTSTRAP_RESAMPLES,
                         ) -> tuple[float, float, float] | None:  # fmt: skip
    """The difference of two rates over the same questions (`a` minus `b`, one value in [0, 1] per question, same
    order) with its 95% paired-bootstrap CI: (difference, low, high) in percentage points; None for fewer than two
    pairs. :raises ValueError: If `a` and `b` are not one-dimensional or differ in length."""
    first, second = _sample(a), _sample(b)
    if first.shape != second.shape:
        raise ValueError(f"paired samples must have one value per question each, got {first.size} and {second.size}")
    if first.size < 2:
        return None
    difference = float(np.mean(first) - np.mean(second))
    if np.all(first - second == (first - second)[0]):
        return (difference, difference, difference)
    low, high = _bootstrap(
        (first, second), lambda x, y, axis=-1: np.mean(x, axis=axis) - np.mean(y, axis=axis),
        paired=True, seed=seed, resamples=resamples,
    )  # fmt: skip
    return (difference, low, high)


def summarize_with_intervals(scores: Sequence[QuestionScore], *, seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """`summarize`, with `<key>_ci` (`rate_ci` as a list, or None) after each rate of `RATES`."""
    summary: dict[str, Any] = {}
    for key, value in summarize(scores).items():
        summary[key] = value
        if key in RATES:
            summary[f"{key}_ci"] = list(interval) if (interval := rate_ci(RATES[key](scores), seed=seed)) else None
    return summary


def excludes_zero(interval: Sequence[float] | None) -> bool:
    """Whether an interval (low, high) lies entirely above or below 0 (a significant difference); False for None."""
    return interval is not None and bool(interval[0] > 0 or interval[1] < 0)
