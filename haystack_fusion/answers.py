"""
Answer normalization, unknown detection and majority voting: pure functions shared by every component.

One normalization (the official SQuAD evaluation's) serves voting and evaluation alike, and one unknown detector
decides what counts as an abstention everywhere (paper 000, section 3.1).
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass, field

UNKNOWN = "unknown"
"""The literal answer the prompts ask for when the passages do not answer the question (paper 000, section 3.1)."""

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
"""Regular expressions (searched in the lowercased answer) that mark an abstention.

The first catches the literal "unknown" that the prompts ask for (paper 000, section 3.1, Figure 7); the others
catch the usual paraphrases models produce instead, such as "I don't know", "not enough information" and "the context
does not contain / provide ..." (paper 000, section 3.1 quotes "The provided input does not contain the context to
answer the question.")."""


def normalize_answer(text: str) -> str:
    """
    Normalize an answer the way the official SQuAD evaluation script does.

    Lowercase, remove punctuation, remove the articles "a", "an" and "the", and collapse whitespace (paper 000,
    section 4 "Evaluation Metrics"; Rajpurkar et al., 2016). Voting and the EM / F1 metrics both use it.

    :param text: An answer string.
    :returns: The normalized string; empty when the answer had only punctuation, articles or whitespace.
    """
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def clean_answer(answer: str) -> str:
    """
    The form of an answer that the unknown patterns are searched in.

    :param answer: An extracted answer.
    :returns: The answer lowercased, without surrounding whitespace, quotes, asterisks and trailing punctuation.
    """
    return answer.strip().strip("\"'`*").rstrip(".!;: ").strip().lower()


@dataclass(frozen=True)
class UnknownDetector:
    """
    Decides whether an answer is an abstention ("unknown"), the one rule every component shares.

    An empty answer is unknown; otherwise the answer as `clean_answer` leaves it (lowercased, without surrounding
    whitespace, quotes and trailing punctuation) is searched with each pattern.

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
        """
        Tell whether an answer abstains.

        :param answer: The extracted answer text, or None for a failed call (which abstains).
        :returns: True when the answer is empty or matches one of the patterns.
        """
        if answer is None:
            return True
        cleaned = clean_answer(answer)
        if not normalize_answer(cleaned):
            return True
        return any(pattern.search(cleaned) for pattern in self._compiled)


@dataclass(frozen=True)
class VoteResult:
    """
    The outcome of majority voting over per-passage answers (paper 000, Eq. 2).

    :param answer: The winning answer as the model wrote it (its first occurrence, from the best-ranked passage that
        gave it), or "unknown" when every answer abstained.
    :param votes: Normalized answer -> number of votes, winner first, then by votes (descending) and best passage
        rank; abstentions are not in it.
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
    Majority vote over answers, one per passage (or per sample), as in paper 000, Eq. 2.

    Answers are compared after `normalize_answer`, so "The Eiffel Tower" and "eiffel tower" vote together.
    Abstentions ("unknown" and its paraphrases, as the detector decides) and failed calls (None) do not vote. A tie
    goes to the answer given by the better-ranked passage (lower rank). When nothing votes, the answer is "unknown".

    :param answers: The answers in passage order; None marks a failed call.
    :param ranks: The 0-based retrieval rank of the passage behind each answer (same length as `answers`); defaults
        to the position in `answers`. With p samples per passage, the p answers of one passage share its rank.
    :param detector: The unknown detector; defaults to `UnknownDetector()`.
    :returns: A `VoteResult`.
    :raises ValueError: If `ranks` is given with a different length than `answers`.
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
