"""
Answer normalization, unknown detection, answer confidence, token F1 and voting: pure functions shared by every
component, so voting, routing and evaluation agree on what "the same answer" (the official SQuAD normalization) and
"unknown" (Liu et al., section 3.1) mean.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

UNKNOWN = "unknown"
"""The literal answer the prompts ask for when the passages do not answer the question (Liu et al., section 3.1)."""

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)

DEFAULT_UNKNOWN_PATTERNS: tuple[str, ...] = (
    r"^unknown$",
    r"^(unanswerable|not answerable|no answer|n/?a)$",
    r"\b(it|this|that|the answer) (is|remains) (unknown|unclear|not known)\b",
    r"^(not|never) (mentioned|specified|stated|given|provided|known)\b",
    r"^no (information|info|data|context)\b",
    r"\b(cannot|can't|can not|unable to) (answer|tell|say|determine)\b",
    r"\b(could not|couldn't|cannot|can't) find (the|an|any) answer\b",
    r"\b(i|we) (do not|don't|dont|cannot|can't|cant) (know|tell|say|answer|determine)\b",
    r"\b(i am|i'm) (not sure|unsure|unable)\b",
    r"\bnot enough (information|context|data|detail)",
    r"\b(insufficient|no relevant|no sufficient) (information|context|data)\b",
    r"\b(context|contexts|passage|passages|text|texts|input|document|documents|source|sources|information)"
    r" (does not|doesn't|do not|don't|did not|didn't) (contain|provide|mention|include|say|specify|give|state"
    r"|answer|have)",
    r"\b(cannot|can't|can not|could not|unable to) be (answered|determined|found|inferred)\b",
    r"\b(not|never) (mentioned|specified|provided|stated|given) in the\b",
    r"\bno (information|mention|answer) (is |was )?(given|provided|available|about|on|of)\b",
)
"""Regular expressions (searched in the cleaned answer) that mark an abstention: the literal "unknown" the prompts ask
for (Liu et al., section 3.1, Figure 7) and the usual paraphrases ("I don't know", "not enough information", "the
context does not contain ...", which section 3.1 quotes)."""


def normalize_answer(text: str) -> str:
    """
    Normalize an answer as the official SQuAD evaluation does (Liu et al., section 4; Rajpurkar et al., 2016):
    lowercase, no punctuation, no articles "a", "an", "the", whitespace collapsed; "" when nothing else is left.
    """
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def clean_answer(answer: str) -> str:
    """The answer the unknown patterns are searched in: lowercased, without surrounding whitespace, quotes, asterisks
    and trailing punctuation."""
    return answer.strip().strip("\"'`*").rstrip(".!;: ").strip().lower()


TRIM_CHARACTERS = " \t\n\r\"'`“”‘’„«»*_"
"""What `trim_answer` strips from both ends: whitespace, quotes and markdown emphasis."""
_ASCII_LETTERS = frozenset(string.ascii_letters)


def trim_answer(text: str) -> str:
    """
    An answer or candidate read from a reply (whitespace already collapsed), trimmed of surrounding whitespace, quotes,
    markdown emphasis and trailing ".,;:", repeatedly; a trailing abbreviation such as "D.C." keeps its period. Linear
    time in the text's length.
    """
    start, end = 0, len(text)
    previous = None
    while (start, end) != previous:
        previous = (start, end)
        for chars in (TRIM_CHARACTERS, ",;:"):
            while start < end and text[start] in chars:
                start += 1
            while end > start and text[end - 1] in chars:
                end -= 1
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        if end > start and text[end - 1] == "." and not _ends_with_abbreviation(text, start, end):
            end -= 1
    return text[start:end]


def _ends_with_abbreviation(text: str, start: int, end: int) -> bool:
    """Whether `text[start:end]` ends with an abbreviation of 2+ letters ("U.S.", "D.C."), preceded by whitespace or
    nothing; in time linear in the abbreviation's length."""
    first = end
    while first - 2 >= start and text[first - 1] == "." and text[first - 2] in _ASCII_LETTERS:
        first -= 2
    return end - first >= 4 and (first == start or text[first - 1].isspace())


@dataclass(frozen=True)
class UnknownDetector:
    """
    Decides whether an answer is an abstention ("unknown"), the one rule every component shares: an empty answer is
    unknown, else `clean_answer` of it is searched with each pattern.

    ### Usage example
    ```python
    from haystack_fusion.answers import UnknownDetector

    detector = UnknownDetector()
    detector.is_unknown("Unknown.")  # True
    detector.is_unknown("The context does not provide the year.")  # True
    detector.is_unknown("Unknown Pleasures")  # False
    ```

    :param patterns: Regular expressions searched in the cleaned answer; defaults to `DEFAULT_UNKNOWN_PATTERNS`.
    :raises ValueError: If a pattern is not a valid regular expression.
    """

    patterns: tuple[str, ...] = DEFAULT_UNKNOWN_PATTERNS
    _compiled: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        compiled = []
        for pattern in self.patterns:
            try:
                compiled.append(re.compile(pattern))
            except re.error as error:
                raise ValueError(
                    f"`unknown_patterns` holds an invalid regular expression {pattern!r}: {error}"
                ) from error
        object.__setattr__(self, "patterns", tuple(self.patterns))
        object.__setattr__(self, "_compiled", tuple(compiled))

    @classmethod
    def from_patterns(cls, patterns: Sequence[str] | None) -> UnknownDetector:
        """Build a detector from a component's `unknown_patterns` parameter (None means the defaults)."""
        return cls() if patterns is None else cls(tuple(patterns))

    def is_unknown(self, answer: str | None) -> bool:
        """Whether an answer abstains: None (a failed call), empty, or matching a pattern."""
        if answer is None:
            return True
        cleaned = clean_answer(answer)
        if not normalize_answer(cleaned):
            return True
        return any(pattern.search(cleaned) for pattern in self._compiled)


@dataclass(frozen=True)
class VoteResult:
    """
    The outcome of majority voting over per-passage answers (Liu et al., Eq. 2).

    :param answer: The winning answer as the model wrote it (from the best-ranked passage that gave it), or "unknown"
        when nothing voted.
    :param votes: Normalized answer -> votes, winner first, then by votes and best passage rank; no abstentions.
    :param candidates: The candidate pool: one surface form per normalized answer, in the order of `votes`.
    :param best_rank: Normalized answer -> 0-based rank of the best-ranked passage that gave it.
    """

    answer: str
    votes: dict[str, int]
    candidates: list[str]
    best_rank: dict[str, int]

    @property
    def is_unknown(self) -> bool:
        """True when no answer got a vote (every passage abstained or failed)."""
        return not self.votes


def majority_vote(
    answers: Sequence[str | None], ranks: Sequence[int] | None = None, detector: UnknownDetector | None = None
) -> VoteResult:
    """
    Majority vote over answers, one per passage (or per sample), as in Liu et al., Eq. 2.

    Answers are compared after `normalize_answer`; abstentions (by the detector, default `UnknownDetector()`) and failed
    calls (None) do not vote; a tie goes to the better-ranked passage; with no vote the answer is "unknown".

    :param answers: The answers in passage order; None marks a failed call.
    :param ranks: The 0-based retrieval rank of each answer's passage (p samples of a passage share it); defaults to
        the position.
    :returns: A `VoteResult`.
    :raises ValueError: If `ranks` and `answers` differ in length.
    """
    detector = detector or UnknownDetector()
    if ranks is None:
        ranks = range(len(answers))
    elif len(ranks) != len(answers):
        raise ValueError(f"`ranks` has {len(ranks)} entries but `answers` has {len(answers)}")
    counts: dict[str, int] = {}
    best_rank: dict[str, int] = {}
    surface: dict[str, str] = {}
    for answer, rank in zip(answers, ranks, strict=True):
        if answer is None or detector.is_unknown(answer):
            continue
        key = normalize_answer(answer)
        counts[key] = counts.get(key, 0) + 1
        if key not in best_rank or rank < best_rank[key]:
            best_rank[key] = rank
            surface[key] = answer.strip()
    order = sorted(counts, key=lambda key: (-counts[key], best_rank[key]))
    return VoteResult(
        answer=surface[order[0]] if order else UNKNOWN,
        votes={key: counts[key] for key in order},
        candidates=[surface[key] for key in order],
        best_rank={key: best_rank[key] for key in order},
    )


def token_f1(prediction: str, gold: str) -> float:
    """
    Official SQuAD token F1 between two answers (Liu et al., section 4; Rajpurkar et al., 2016): tokens of
    `normalize_answer`, overlap = multiset intersection, F1 = 2PR / (P + R); 1.0 if both have no tokens, 0.0 if one
    has none. Symmetric; a fraction in [0, 1].
    """
    prediction_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not prediction_tokens or not gold_tokens:
        return float(prediction_tokens == gold_tokens)
    common = sum((Counter(prediction_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(prediction_tokens)
    recall = common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def token_logprobs(meta: Mapping[str, Any] | None) -> list[Mapping[str, Any]] | None:
    """
    The per-token log-probabilities in a reply's (or an AnswerBuilder answer's) `meta["logprobs"]["content"]`, as
    OpenAIChatGenerator (with `logprobs`) and the embedded generator write them: `{"token", "logprob", ...}` entries
    in generation order, or None when there are none.
    """
    logprobs = (meta or {}).get("logprobs")
    tokens = logprobs.get("content") if isinstance(logprobs, Mapping) else logprobs
    if not isinstance(tokens, list) or not tokens:
        return None
    valid = [t for t in tokens if isinstance(t, Mapping) and isinstance(t.get("logprob"), (int, float))]
    return valid if len(valid) == len(tokens) else None


def answer_confidence(meta: Mapping[str, Any] | None, answer: str | None = None) -> float | None:
    r"""
    The model's confidence in an answer: the geometric mean of the probabilities of the answer's tokens.

    The tokens that overlap the answer's first occurrence in the reply (by character span) count, so an answer read
    from a longer reply is judged on its own tokens; when it is not found verbatim, or `answer` is None, the reply's
    first non-blank line counts. Whitespace-only tokens do not count. The aggregate is exp(mean log p), the
    length-normalized sequence probability; for an abstention it is the confidence in abstaining.

    ### Usage example
    ```python
    from haystack_fusion.answers import answer_confidence

    meta = {"logprobs": {"content": [{"token": " Paris", "logprob": -0.1}, {"token": "\n", "logprob": -2.0}]}}
    answer_confidence(meta, "Paris")  # exp(-0.1) = 0.905
    ```

    :param meta: The reply's `meta` (or an AnswerBuilder answer's), read by `token_logprobs`.
    :param answer: The answer as extracted from the reply; None counts the first line.
    :returns: A probability in [0, 1]; None when the meta carries no log-probabilities or no token counts.
    """
    tokens = token_logprobs(meta)
    if tokens is None:
        return None
    pieces = [str(token.get("token") or "") for token in tokens]
    text = "".join(pieces)
    start = text.find(answer.strip()) if answer and answer.strip() else -1
    if start >= 0:
        end = start + len(answer.strip())  # type: ignore[union-attr]
    else:
        line = next((line for line in text.splitlines() if line.strip()), "")
        start = text.find(line) if line else 0
        end = start + len(line)
    counted: list[float] = []
    position = 0
    for piece, token in zip(pieces, tokens, strict=True):
        token_start, position = position, position + len(piece)
        if position > start and token_start < end and piece.strip():
            counted.append(float(token["logprob"]))
    if not counted:
        return None
    mean = sum(counted) / len(counted)
    return min(1.0, math.exp(0.0 if mean > 0 else mean))  # a log-probability above 0 (malformed) would overflow exp
