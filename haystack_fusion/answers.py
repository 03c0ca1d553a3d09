"""
Answer normalization, unknown detection, answer confidence and majority voting: pure functions shared by every
component.

One normalization (the official SQuAD evaluation's) serves voting and evaluation alike, and one unknown detector
decides what counts as an abstention everywhere (paper 000, section 3.1).
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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


_TRIM = " \t\n\r\"'`“”‘’„«»*_"
"""What `trim_answer` strips from both ends: whitespace, quotes and markdown emphasis."""
_ASCII_LETTERS = frozenset(string.ascii_letters)


def trim_answer(text: str) -> str:
    """
    An answer or candidate read from a reply, trimmed: surrounding whitespace, quotes and markdown emphasis, and
    trailing ".", ",", ";", ":" removed, repeatedly; a trailing abbreviation such as "D.C." keeps its period (SuRe's
    candidates, Chain-of-Note's answers).

    Works on indices, so a tail of thousands of "." or ",'" costs linear time, not a copy per character removed.

    :param text: The text, whitespace already collapsed.
    :returns: The trimmed text ("" when nothing is left).
    """
    start, end = 0, len(text)
    previous = None
    while (start, end) != previous:
        previous = (start, end)
        for chars in (_TRIM, ",;:"):
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


def token_logprobs(meta: Mapping[str, Any] | None) -> list[Mapping[str, Any]] | None:
    """
    The per-token log-probabilities of a reply, as OpenAI-style generators put them in `meta["logprobs"]`.

    Reads `meta["logprobs"]["content"]`: OpenAIChatGenerator's shape with `generation_kwargs={"logprobs": True}`,
    and the embedded `LocalChatGenerator`'s. A `GeneratedAnswer` made by Haystack's AnswerBuilder carries its reply's
    `meta`, so its `meta` works too.

    :param meta: A reply's (or an AnswerBuilder answer's) `meta`.
    :returns: The list of `{"token": str, "logprob": float, ...}` entries, in generation order; None when the meta
        holds no log-probabilities (the generator returns none, or was not asked for them).
    """
    logprobs = (meta or {}).get("logprobs")
    tokens = logprobs.get("content") if isinstance(logprobs, Mapping) else logprobs
    if not isinstance(tokens, list) or not tokens:
        return None
    valid = [t for t in tokens if isinstance(t, Mapping) and isinstance(t.get("logprob"), (int, float))]
    return valid if len(valid) == len(tokens) else None


def answer_confidence(meta: Mapping[str, Any] | None, answer: str | None = None) -> float | None:
    """
    The model's confidence in an answer: the geometric mean of the probabilities of the answer's tokens.

    Which tokens count: the reply is rebuilt from its tokens, and the tokens that overlap the answer's first
    occurrence in it (by character span) count. An answer extracted from a longer reply (the first line of "Paris\n
    Question: ...", or "Paris" out of "Answer: Paris.") is thus judged on its own tokens, not on the label, the
    trailing period or the text after it. When the answer is not found verbatim (it was cleaned or rewritten), or
    `answer` is None, the tokens of the reply's first non-blank line count. Tokens that are only whitespace do not
    count.

    How they are aggregated: exp(mean log p) over the counted tokens, the length-normalized sequence probability,
    in [0, 1]. A one-token answer's confidence is that token's probability; a longer answer is not penalized for
    its length, as the plain product would be. For an answer that abstains ("unknown"), it is the confidence in
    abstaining.

    ### Usage example
    ```python
    from haystack_fusion.answers import answer_confidence

    meta = {"logprobs": {"content": [{"token": " Paris", "logprob": -0.1}, {"token": "\n", "logprob": -2.0}]}}
    answer_confidence(meta, "Paris")  # exp(-0.1) = 0.905
    ```

    :param meta: The reply's `meta` (or an AnswerBuilder answer's, which copies it), with `meta["logprobs"]` as
        `token_logprobs` reads it.
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
