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
from typing import Any, Literal

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


_TRIM = " \t\n\r\"'`“”‘’„«»*_"
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
    :param clusters: With `overlap_vote`: representative -> the normalized answers of its cluster, representative
        first; None for exact voting.
    """

    answer: str
    votes: dict[str, int]
    candidates: list[str]
    best_rank: dict[str, int]
    clusters: dict[str, list[str]] | None = None

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


VoteMode = Literal["exact", "overlap"]
"""How answers are grouped before they are counted: `"exact"` (equal after `normalize_answer`, Liu et al., Eq. 2) or
`"overlap"` (`answers_agree`)."""

VOTE_MODES: tuple[str, ...] = ("exact", "overlap")
"""The vote modes, the default first."""

DEFAULT_OVERLAP_THRESHOLD = 0.5
"""Token F1 at or above which two answers agree in overlap voting (`answers_agree`).

Why 0.5: it is the F1 at which the SQuAD F1 metric gives each answer half credit when the other is the gold answer,
and the F1 of a one-word answer against a three-word answer that holds it ("Gaul" / "province of Gaul"; a two-word
one gives 0.67). What it costs: two two-word answers that share one word also reach 0.5 and agree ("New York" / "New
Jersey"), as do longer answers that share most of their words ("Battle of Trafalgar" / "Battle of Britain": 0.67);
below 0.5, a two-word and a three-word answer sharing one word (0.4) would agree too. Answers held inside another
agree by containment whatever the threshold (`answers_agree`)."""


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


def _contains(longer: Sequence[str], shorter: Sequence[str]) -> bool:
    """Whether `shorter` (non-empty) occurs as a contiguous run of `longer`."""
    size = len(shorter)
    return 0 < size <= len(longer) and any(
        list(longer[i : i + size]) == list(shorter) for i in range(len(longer) - size + 1)
    )


def check_overlap_threshold(threshold: float) -> float:
    """The threshold as a float; ValueError unless it is a number in (0, 1]."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1:
        raise ValueError(f"`overlap_threshold` must be a number in (0, 1], got {threshold!r}")
    return float(threshold)


def check_vote_mode(vote: str) -> VoteMode:
    """The mode; ValueError unless it is "exact" or "overlap"."""
    if vote not in VOTE_MODES:
        raise ValueError(f"`vote` must be one of {', '.join(map(repr, VOTE_MODES))}, got {vote!r}")
    return vote  # type: ignore[return-value]


def answers_agree(first: str, second: str, threshold: float = DEFAULT_OVERLAP_THRESHOLD) -> bool:
    """
    Whether two answers say the same thing for overlap voting: the rule `overlap_vote` clusters with.

    They agree when their normalized tokens are equal, their token F1 reaches `threshold`, or one's tokens occur as a
    contiguous run in the other's (containment: "2BP" in "2-bromopalmitic acid (2-BP)"). Symmetric.

    ### Usage example
    ```python
    from haystack_fusion.answers import answers_agree

    answers_agree("2BP", "2-bromopalmitic acid (2-BP)")  # True (containment; F1 0.5)
    answers_agree("Roman Gaul", "Gaul")  # True (F1 0.67)
    answers_agree("north Atlantic", "south Pacific coast")  # False (F1 0)
    ```

    :raises ValueError: If `threshold` is not in (0, 1].
    """
    check_overlap_threshold(threshold)
    first_tokens, second_tokens = normalize_answer(first).split(), normalize_answer(second).split()
    if first_tokens == second_tokens:
        return True
    if not first_tokens or not second_tokens:
        return False
    return (
        token_f1(first, second) >= threshold
        or _contains(first_tokens, second_tokens)
        or _contains(second_tokens, first_tokens)
    )


def overlap_vote(
    answers: Sequence[str | None],
    ranks: Sequence[int] | None = None,
    detector: UnknownDetector | None = None,
    *,
    threshold: float = DEFAULT_OVERLAP_THRESHOLD,
) -> VoteResult:
    """
    Majority vote over clusters of agreeing answers: Liu et al.'s Eq. 2 with "the same answer" read as agreement
    (`answers_agree`) instead of equality after normalization.

    Abstentions and failed calls do not vote. The distinct normalized answers, by best passage rank, each join the
    first cluster whose representative (its best-ranked member) they agree with, or start one; clusters do not
    chain. The cluster with the most votes wins (ties: the better-ranked representative), answered by its
    representative's surface form. Deterministic for the same answers and ranks.

    ### Usage example
    ```python
    from haystack_fusion.answers import overlap_vote

    result = overlap_vote(["2BP", "2-bromopalmitic acid (2-BP)", "palmitate", "2-bromopalmitate"])
    result.answer  # '2BP'
    result.votes  # {'2bp': 2, 'palmitate': 1, '2bromopalmitate': 1}
    result.clusters  # {'2bp': ['2bp', '2bromopalmitic acid 2bp'], 'palmitate': ['palmitate'], ...}
    ```

    :returns: A `VoteResult` whose `votes`, `candidates` and `best_rank` are per cluster, keyed by the
        representative's normalized answer, and whose `clusters` lists each cluster's members.
    :raises ValueError: If `ranks` has a different length than `answers`, or `threshold` is not in (0, 1].
    """
    check_overlap_threshold(threshold)
    exact = majority_vote(answers, ranks, detector)
    surface = dict(zip(exact.votes, exact.candidates, strict=True))
    order = {key: index for index, key in enumerate(exact.votes)}
    by_rank = sorted(exact.votes, key=lambda key: (exact.best_rank[key], order[key]))
    clusters: list[list[str]] = []
    for key in by_rank:
        home = next((cluster for cluster in clusters if answers_agree(cluster[0], key, threshold)), None)
        if home is None:
            clusters.append([key])
        else:
            home.append(key)
    counts = {cluster[0]: sum(exact.votes[member] for member in cluster) for cluster in clusters}
    ranked = sorted(clusters, key=lambda cluster: (-counts[cluster[0]], exact.best_rank[cluster[0]], order[cluster[0]]))
    return VoteResult(
        answer=surface[ranked[0][0]] if ranked else UNKNOWN,
        votes={cluster[0]: counts[cluster[0]] for cluster in ranked},
        candidates=[surface[cluster[0]] for cluster in ranked],
        best_rank={cluster[0]: exact.best_rank[cluster[0]] for cluster in ranked},
        clusters={cluster[0]: list(cluster) for cluster in ranked},
    )


def vote_answers(
    answers: Sequence[str | None],
    ranks: Sequence[int] | None = None,
    detector: UnknownDetector | None = None,
    *,
    vote: str = "exact",
    threshold: float = DEFAULT_OVERLAP_THRESHOLD,
) -> VoteResult:
    """
    Vote in the given mode: `majority_vote` for `"exact"` (Liu et al., Eq. 2), `overlap_vote` for `"overlap"`.

    :raises ValueError: For an unknown mode, mismatched `ranks`, or a threshold outside (0, 1].
    """
    if check_vote_mode(vote) == "overlap":
        return overlap_vote(answers, ranks, detector, threshold=threshold)
    return majority_vote(answers, ranks, detector)


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
