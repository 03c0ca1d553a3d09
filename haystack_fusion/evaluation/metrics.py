"""
The papers' evaluation metrics as pure functions: per-question scores and their aggregate over a run.

Per question: exact match and token F1 (Liu et al., section 4 "Evaluation Metrics"; the official SQuAD evaluation,
Rajpurkar et al., 2016), substring accuracy (Yu et al., section 3.1.3), the unknown test behind %Unk and the reject
rate (Liu et al., section 3.1 and section 4; Yu et al., section 3.4), whether the post-fusion candidate pool holds a
gold answer (behind %NM, Liu et al., section 4) and whether retrieval found an answer-bearing passage (answer
recall@k, Liu et al., section 4.3).

Aggregate: `summarize` turns a list of `QuestionScore` into the figures a report prints, as percentages (x100) where
the papers report percentages, unrounded.

Answers that are not answers: `with_answer_outcome` sets a score's flags from the record: `empty` (a blank prediction),
`invalid` (the answer validator rejected it, `validation.is_invalid`; such an answer is not an abstention, so it is
never `unknown`, and it scores 0 on answerable questions) and `truncated` (the token cap cut the reply);
`outcome_counts` counts them over a run.

Normalization and the unknown test are not redefined here: they come from `haystack_fusion.answers`
(`normalize_answer`, the official SQuAD normalization, and `UnknownDetector`, the one abstention rule), so voting
and evaluation always agree on what "the same answer" and "unknown" mean.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from haystack_fusion.answers import UnknownDetector, normalize_answer, token_f1
from haystack_fusion.llm import TRUNCATED_FINISH_REASON
from haystack_fusion.validation import is_invalid

__all__ = [
    "QuestionScore",
    "accuracy",
    "exact_match",
    "f1",
    "gold_in_pool",
    "is_unknown",
    "outcome_counts",
    "retrieval_hit",
    "summarize",
    "with_answer_outcome",
]


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """
    Exact match (EM) of a prediction against the acceptable answers.

    Liu et al., section 4 "Evaluation Metrics": "A generated response is considered correct if, after normalization,
    it matches any candidate in a list of acceptable answers. The normalization process entails converting the text
    to lowercase and omitting articles, punctuation, and redundant whitespaces" (the official SQuAD evaluation,
    Rajpurkar et al., 2016; Yu et al., section 3.1.3 uses the same definition). Normalization is
    `haystack_fusion.answers.normalize_answer`.

    Unit: 1.0 (match) or 0.0 per question; `summarize` reports the mean x100.

    Edge cases: no gold answers -> 0.0 (nothing is acceptable). As in the official script, normalized strings are
    compared as they are, so an empty prediction matches a gold answer that normalizes to the empty string
    (e.g. "The").

    :param prediction: The predicted answer.
    :param golds: The acceptable answers.
    :returns: 1.0 when the normalized prediction equals one normalized gold answer, else 0.0.
    """
    normalized = normalize_answer(prediction)
    return float(any(normalized == normalize_answer(gold) for gold in golds))


def f1(prediction: str, golds: Sequence[str]) -> float:
    """
    Token F1 of a prediction, the best over the acceptable answers.

    Liu et al., section 4 "Evaluation Metrics" (the standard F1 of Rajpurkar et al., 2016); Yu et al., section 3.1.3:
    F1 "treats the prediction and ground truth as bags of tokens". As in the official SQuAD script: both sides are
    normalized with `normalize_answer` and split on whitespace; the overlap is the size of the multiset
    intersection (Counter `&`); precision = overlap / prediction tokens, recall = overlap / gold tokens,
    F1 = 2PR / (P + R) (`haystack_fusion.answers.token_f1`, the one copy, which overlap voting uses too).

    Unit: a fraction in [0, 1] per question; `summarize` reports the mean x100.

    Edge cases: when either side has no tokens after normalization, F1 is 1.0 if both are empty and 0.0 otherwise
    (official script); no gold answers -> 0.0. F1 is never below EM for the same gold answers.

    :param prediction: The predicted answer.
    :param golds: The acceptable answers.
    :returns: The maximum token F1 over `golds`.
    """
    return max((token_f1(prediction, gold) for gold in golds), default=0.0)


def accuracy(prediction: str, golds: Sequence[str]) -> float:
    """
    Substring accuracy: a gold answer occurs in the prediction.

    Yu et al., section 3.1.3: "Accuracy considers a prediction correct if any substring of the prediction exactly
    matches any of the provided correct answers" (after Mallen et al., 2023), used there because EM is too strict
    for verbose models. Both sides are normalized with `normalize_answer` first; the test is a character-level
    substring test on the normalized strings (no token boundaries, as in Mallen et al.).

    Unit: 1.0 or 0.0 per question; `summarize` reports the mean x100.

    Edge cases: gold answers that normalize to the empty string are ignored (the empty string is a substring of
    everything); no usable gold answer -> 0.0. An exact match is always accurate.

    :param prediction: The predicted answer.
    :param golds: The acceptable answers.
    :returns: 1.0 when a non-empty normalized gold answer is a substring of the normalized prediction, else 0.0.
    """
    normalized = normalize_answer(prediction)
    return float(any(gold_norm and gold_norm in normalized for gold_norm in map(normalize_answer, golds)))


def is_unknown(prediction: str | None, detector: UnknownDetector | None = None) -> bool:
    """
    Whether a prediction abstains ("unknown" or a paraphrase), the test behind %Unk and the reject rate.

    Liu et al., section 3.1 defines the unknown output and section 4 "Evaluation Metrics" counts it (%Unk); Yu et al.,
    section 3.4 counts rejections (reject rate). Delegates to `haystack_fusion.answers.UnknownDetector`, the one
    abstention rule that voting and routing use too.

    Edge cases: an empty answer and None (a failed call) are unknown.

    :param prediction: The predicted answer, or None for a failed call.
    :param detector: The detector to use; defaults to `UnknownDetector()` (the default patterns).
    :returns: True when the prediction abstains.
    """
    return (detector or UnknownDetector()).is_unknown(prediction)


def gold_in_pool(candidates: Sequence[str], golds: Sequence[str]) -> bool:
    """
    Whether the post-fusion candidate pool holds a correct answer, the condition of %NM.

    Liu et al., section 4 "Evaluation Metrics": %NM counts "instances where the correct answer is within the generated
    answer list but isn't the majority selection"; "within" is an exact match (`exact_match`) of some gold answer.

    :param candidates: The candidate answers (e.g. `VoteResult.candidates`).
    :param golds: The acceptable answers.
    :returns: True when a candidate matches a gold answer; False for an empty pool or no gold answers.
    """
    return any(exact_match(candidate, golds) == 1.0 for candidate in candidates)


def _casefold_collapsed(text: str) -> str:
    return " ".join(text.casefold().split())


def retrieval_hit(passages: Sequence[str], golds: Sequence[str]) -> bool:
    """
    Whether one of the retrieved passages contains a gold answer string (answer recall@k for one question).

    Liu et al., section 4.3 relates the results to the "retrieval recall" of the Top-k passages; this is the usual
    answer recall@k: a question is a hit when a gold answer occurs verbatim in one of its k passages. The test is
    case-insensitive (`str.casefold`) on text whose whitespace runs are collapsed to one space; punctuation and
    articles are kept (passages are not answers, and removing them would create false hits across word boundaries).
    It is a plain substring test, not the token-level match of DPR's `has_answer`.

    Edge cases: gold answers that are empty after stripping are ignored; no passages or no usable gold -> False.

    :param passages: The texts of the retrieved passages (the top-k).
    :param golds: The acceptable answers.
    :returns: True when a gold answer occurs in one of the passages.
    """
    needles = [needle for needle in map(_casefold_collapsed, golds) if needle]
    if not needles:
        return False
    haystacks = [_casefold_collapsed(passage) for passage in passages]
    return any(needle in haystack for haystack in haystacks for needle in needles)


@dataclass(frozen=True)
class QuestionScore:
    """
    The scores and costs of one question under one strategy, the input of `summarize`.

    :param id: The question id.
    :param answerable: Whether the question has a gold answer (False for questions the system should reject).
    :param em: `exact_match` of the final answer, 0.0 or 1.0.
    :param f1: `f1` of the final answer, in [0, 1].
    :param accuracy: `accuracy` of the final answer, 0.0 or 1.0.
    :param unknown: Whether the final answer abstains (`is_unknown`).
    :param pool_has_gold: Whether the post-fusion candidate pool holds a gold answer (`gold_in_pool`); None when
        the strategy has no post-fusion pool.
    :param majority_correct: Whether the majority answer of that pool is correct (EM); None when there is no pool.
    :param retrieval_hit: Whether a retrieved passage contains a gold answer (`retrieval_hit`); None when not
        measured (e.g. the passages were given, not retrieved).
    :param prompt_tokens: Prompt tokens spent on the question, over all LLM calls.
    :param completion_tokens: Completion tokens spent on the question, over all LLM calls.
    :param calls: Number of LLM calls made for the question.
    :param seconds: Wall-clock seconds spent answering the question.
    :param empty: Whether the final answer is blank (a rejected answer, a failed call, an empty reply).
    :param invalid: Whether the answer validator rejected the final answer (`validation.is_invalid` of the record's
        evidence): not an abstention, so never `unknown` too.
    :param truncated: Whether the token cap cut the reply the final answer was read from (see `with_answer_outcome`).
    :param truncated_calls: How many of the question's LLM calls the token cap cut (usage `truncated`).
    :raises ValueError: If a score is outside [0, 1], a cost is negative or not finite, the pool says it holds a
        gold answer without saying whether the majority answer is correct, or an answer is both invalid and unknown.
    """

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
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"QuestionScore {self.id!r}: `{name}` must be in [0, 1], got {value!r}")
        for name in ("prompt_tokens", "completion_tokens", "calls", "seconds", "truncated_calls"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"QuestionScore {self.id!r}: `{name}` must be a finite number >= 0, got {value!r}")
        if self.pool_has_gold and self.majority_correct is None:
            raise ValueError(
                f"QuestionScore {self.id!r}: `majority_correct` is None but `pool_has_gold` is True; "
                "a question with a candidate pool must say whether its majority answer is correct"
            )
        if self.invalid and self.unknown:
            raise ValueError(
                f"QuestionScore {self.id!r}: an invalid answer is not an abstention, so `unknown` must be False "
                "(`with_answer_outcome` sets both)"
            )


def with_answer_outcome(
    score: QuestionScore,
    prediction: str | None,
    evidence: Mapping[str, Any] | None,
    usage: Mapping[str, Any] | None = None,
) -> QuestionScore:
    """
    A question's score with the flags of answers that are not answers set from its record.

    - `empty`: the prediction is blank after stripping whitespace.
    - `invalid`: the evidence says the answer validator rejected the answer (`answer_source == "invalid"`,
      `validation.is_invalid`). A rejected answer is not an abstention: `unknown` becomes False, so it counts neither
      in %Unk nor as a correct rejection of an unanswerable question, and EM, F1 and accuracy become 0.0 (the
      empty prediction would otherwise match a gold answer that normalizes to the empty string).
    - `truncated_calls`: the calls the token cap cut, usage `truncated` (`llm.reply_usage`), the larger of
      `usage`'s and `evidence["usage"]`'s (a run passes the first, a record keeps the second).
    - `truncated`: when the evidence has `finish_reason` (the final answer's own reply, for strategies whose answer
      is one reply read by an answer builder), whether it is "length"; otherwise whether any call of the question
      was cut (`truncated_calls > 0`): an answer voted from several replies or chosen by SuRe has no one reply.

    A record with no `answer_source == "invalid"` and no `truncated` count scores as it is, with `empty` set and
    `truncated` False. Applying it twice changes nothing.

    :param score: The question's score (`unknown` as `is_unknown` gave it).
    :param prediction: The final answer as recorded.
    :param evidence: The record's evidence (`QuestionRecord.evidence`, or a strategy run's), or None.
    :param usage: The question's summed usage, when it is not in `evidence["usage"]`.
    :returns: The score with `empty`, `invalid`, `truncated` and `truncated_calls` set, and `unknown`, `em`, `f1`,
        `accuracy` as above.
    """
    evidence = evidence or {}
    recorded = evidence.get("usage") if isinstance(evidence.get("usage"), Mapping) else {}
    truncated_calls = max(int((usage or {}).get("truncated") or 0), int((recorded or {}).get("truncated") or 0))
    if "finish_reason" in evidence:
        truncated = evidence.get("finish_reason") == TRUNCATED_FINISH_REASON
    else:
        truncated = truncated_calls > 0
    invalid = is_invalid(dict(evidence))
    changes: dict[str, Any] = {
        "empty": not (prediction or "").strip(),
        "invalid": invalid,
        "truncated": truncated,
        "truncated_calls": truncated_calls,
    }
    if invalid:
        changes.update(unknown=False, em=0.0, f1=0.0, accuracy=0.0)
    return dataclasses.replace(score, **changes)


def outcome_counts(scores: Sequence[QuestionScore]) -> dict[str, int]:
    """
    How many of a run's final answers were not answers, over all its questions (answerable or not).

    The kinds overlap: a rejected answer is blank, so it counts as `empty` and `invalid`; a blank answer that was
    not rejected (a failed call, an empty reply) is `empty` and `unknown` (`is_unknown` of a blank answer).

    :param scores: The per-question scores of one run (with `with_answer_outcome` applied).
    :returns: `answered_count` (answers neither empty, invalid nor unknown), `unknown_count` (abstentions),
        `empty_count`, `invalid_count`, `truncated_count` (answers whose reply the token cap cut) and
        `truncated_calls` (LLM calls the cap cut, summed over the questions).
    """
    return {
        "answered_count": sum(not (s.empty or s.invalid or s.unknown) for s in scores),
        "unknown_count": sum(s.unknown for s in scores),
        "empty_count": sum(s.empty for s in scores),
        "invalid_count": sum(s.invalid for s in scores),
        "truncated_count": sum(s.truncated for s in scores),
        "truncated_calls": sum(s.truncated_calls for s in scores),
    }


def _percent(flags: Sequence[float | bool]) -> float | None:
    """Mean of 0/1 (or [0, 1]) values x100; None for no values."""
    return 100.0 * sum(flags) / len(flags) if flags else None


def _percentile(values: Sequence[float], percent: float) -> float:
    """
    Percentile by linear interpolation between order statistics.

    The same definition as `statistics.quantiles(values, n=100, method="inclusive")` and numpy's default
    `percentile`: position (n - 1) * percent / 100 in the sorted values. Computed directly so the result stays
    between its two neighbours (the stdlib formula can overshoot the maximum by one ulp when they are equal).
    """
    ordered = sorted(values)
    position = (len(ordered) - 1) * percent / 100
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    low, high = ordered[below], ordered[above]
    return float(min(max(low + (high - low) * (position - below), low), high))


def summarize(scores: Sequence[QuestionScore]) -> dict[str, float | int | None]:
    """
    Aggregate per-question scores into the figures of a report; nothing is rounded.

    Keys, in order (percentages are x100; a rate whose denominator is empty is None):

    - `questions`, `answerable`, `unanswerable`: counts.
    - `em`, `f1`, `accuracy`: mean x100 over answerable questions only (Liu et al., section 4; Yu et al.,
      section 3.1.3). Unanswerable questions have no gold answer to match and are scored by `reject_rate`.
    - `unknown_rate` (%Unk): share x100 of answerable questions whose final answer is unknown. Liu et al., section 4
      defines %Unk as "the proportion of times the LLM indicates it cannot answer based on the given input" and
      reports it (Tables 1 and 2) on answerable QA data, so it is measured on answerable questions. An answer the
      validator rejected (`invalid`) is not unknown (`with_answer_outcome`).
    - `nm_rate` (%NM), `nm_count`, `pool_has_gold_count`: Liu et al., section 4 defines %NM as "the error rate
      through majority vote ... instances where the correct answer is within the generated answer list but isn't
      the majority selection". `pool_has_gold_count` counts answerable questions whose post-fusion pool holds a
      gold answer (`pool_has_gold` True); `nm_count` counts those among them whose majority answer is wrong
      (`majority_correct` False). The paper does not give the denominator, so `nm_rate` is the conditional reading,
      100 * nm_count / pool_has_gold_count (how often voting loses a correct answer it had); the other reading, a
      share of all answerable questions, is 100 * nm_count / answerable. Questions whose pool has no gold answer
      are not counted. All three are None when no question has a pool (every `pool_has_gold` is None, e.g. the
      concatenation strategy); `nm_rate` is also None when no pool holds a gold answer.
    - `reject_rate`: share x100 of unanswerable questions answered unknown; None when there are no unanswerable
      questions. Yu et al., section 3.4 evaluates unknown robustness "based on reject rate (RR), i.e., number of
      rejected ..." (the text extraction breaks off there), on questions beyond the model's knowledge; it is read as
      rejected questions / unanswerable questions. What counts as a rejection is the `unknown` flag, i.e.
      `UnknownDetector`, so paraphrases such as "I don't know" count.
    - `recall_at_k`: share x100 of answerable questions with a retrieval hit, over those where it was measured
      (`retrieval_hit` not None; Liu et al., section 4.3); None when never measured.
    - `calls_per_question`, `prompt_tokens_per_question`, `completion_tokens_per_question`, `tokens_per_question`
      (prompt + completion): means over all questions (Liu et al., section 4.2 compares token usage).
    - `latency_p50`, `latency_p95`: percentiles of `seconds`, in seconds, by linear interpolation between order
      statistics (the definition of `statistics.quantiles(n=100, method="inclusive")` and of numpy's default
      `percentile`: position (n - 1) * p / 100 in the sorted values); with a single question, its seconds.

    :param scores: The per-question scores of one run.
    :returns: The figures, keyed as above.
    :raises ValueError: If `scores` is empty.
    """
    if not scores:
        raise ValueError("`scores` is empty: there is nothing to summarize (the run scored no question)")
    answerable = [score for score in scores if score.answerable]
    unanswerable = [score for score in scores if not score.answerable]
    n = len(scores)

    has_pool = any(score.pool_has_gold is not None for score in scores)
    with_gold = [score for score in answerable if score.pool_has_gold]
    nm_count = sum(1 for score in with_gold if score.majority_correct is False)
    measured = [score.retrieval_hit for score in answerable if score.retrieval_hit is not None]
    prompt_tokens = sum(score.prompt_tokens for score in scores)
    completion_tokens = sum(score.completion_tokens for score in scores)
    seconds = [score.seconds for score in scores]

    return {
        "questions": n,
        "answerable": len(answerable),
        "unanswerable": len(unanswerable),
        "em": _percent([score.em for score in answerable]),
        "f1": _percent([score.f1 for score in answerable]),
        "accuracy": _percent([score.accuracy for score in answerable]),
        "unknown_rate": _percent([score.unknown for score in answerable]),
        "nm_rate": (100.0 * nm_count / len(with_gold) if with_gold else None) if has_pool else None,
        "nm_count": nm_count if has_pool else None,
        "pool_has_gold_count": len(with_gold) if has_pool else None,
        "reject_rate": _percent([score.unknown for score in unanswerable]),
        "recall_at_k": _percent(measured),
        "calls_per_question": sum(score.calls for score in scores) / n,
        "prompt_tokens_per_question": prompt_tokens / n,
        "completion_tokens_per_question": completion_tokens / n,
        "tokens_per_question": (prompt_tokens + completion_tokens) / n,
        "latency_p50": _percentile(seconds, 50),
        "latency_p95": _percentile(seconds, 95),
    }
