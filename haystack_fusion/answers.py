"""
What an answer is, shared by every component so that voting, routing and evaluation agree on "the same answer" (the
official SQuAD normalization) and "unknown" (Liu et al., section 3.1): normalization, unknown detection, validity,
confidence, token F1 and voting.

Validity (`check_answer`): passage markup, a copied demonstration (Liu et al., Figure 7's "1925"; Yu et al., Table 6's
"1996") that no passage contains, bare list labels (`(i) (ii)`) or a repeat of the question is no answer. A rejected
answer is not an abstention: components return an empty answer with `meta["answer_source"] == "invalid"`.
"""

from __future__ import annotations

import math
import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from haystack.dataclasses import GeneratedAnswer

UNKNOWN = "unknown"
"""The literal answer the prompts ask for when the passages do not answer the question (Liu et al., section 3.1)."""

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)

DEFAULT_UNKNOWN_PATTERNS: tuple[str, ...] = (
    r"^unknown$",
    r"^(unanswerable|not answerable|no answer|n/?a)$",
    r"\b(it|this|that|the answer) (is|remains) (unknown|unclear|not known)"
    r"($|[^\w ]| (from|in|on|based|given|because|since|as|to|for|and|but|or|if|whether"
    r"|how|what|who|when|where|why)\b)",
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
"""The literal "unknown" (Liu et al., section 3.1, Figure 7) and its usual paraphrases ("I don't know", "the context
does not contain ..."); "The answer is Unknown Pleasures" is an answer."""


def normalize_answer(text: str) -> str:
    """The official SQuAD normalization (Liu et al., section 4; Rajpurkar et al., 2016): lowercase, no punctuation, no
    articles, whitespace collapsed."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def clean_answer(answer: str) -> str:
    """An answer lowercased, without surrounding whitespace, quotes, asterisks and trailing punctuation."""
    return answer.strip().strip("\"'`*").rstrip(".!;: ").strip().lower()


TRIM_CHARACTERS = " \t\n\r\"'`“”‘’„«»*_"  # whitespace, quotes and markdown emphasis
_ASCII_LETTERS = frozenset(string.ascii_letters)


def trim_answer(text: str) -> str:
    """An answer read from a reply, trimmed of surrounding whitespace, quotes, markdown emphasis and trailing ".,;:",
    repeatedly; a trailing abbreviation ("D.C.") keeps its period. Linear time."""
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
        if end > start and text[end - 1] == ".":
            first = end  # an abbreviation of 2+ letters ("U.S.") after whitespace or nothing keeps its period
            while first - 2 >= start and text[first - 1] == "." and text[first - 2] in _ASCII_LETTERS:
                first -= 2
            if not (end - first >= 4 and (first == start or text[first - 1].isspace())):
                end -= 1
    return text[start:end]


_LEAD_IN = re.compile(r"(?:(?:the )?(?:final )?answer(?: is|[*_\s]*:)|it(?: is|'s|’s))(?![\w'’])")
_CORE_WRAPPING = frozenset(TRIM_CHARACTERS + ".,;:!?()[]")


def unknown_core(cleaned: str) -> str:
    """A cleaned answer without wrapping and lead-ins: `'the answer is "unknown"'` -> `"unknown"`, `"it's the unknown
    soldier"` -> `"the unknown soldier"`. Only to recognize abstentions, never as the answer. Linear time."""
    start, end = 0, len(cleaned)
    while True:
        while start < end and cleaned[start] in _CORE_WRAPPING:
            start += 1
        while end > start and cleaned[end - 1] in _CORE_WRAPPING:
            end -= 1
        lead_in = _LEAD_IN.match(cleaned, start, end)
        if lead_in is None:
            return cleaned[start:end]
        start = lead_in.end()


@dataclass(frozen=True)
class UnknownDetector:
    """
    Whether an answer is an abstention ("unknown"): the one rule of the router's fallback (Liu et al., section 3.3),
    post-fusion's vote, Chain-of-Note and the evaluation's %Unk. None or no word is unknown, else each pattern is
    searched in `clean_answer` of it and in its `unknown_core` ("Answer: **unknown**." is unknown).

    ### Usage example
    ```python
    from haystack_fusion.answers import UnknownDetector

    detector = UnknownDetector()
    detector.is_unknown("Unknown.")  # True
    detector.is_unknown('The answer is "unknown".')  # True
    detector.is_unknown("The context does not provide the year.")  # True
    detector.is_unknown("Unknown Pleasures")  # False
    ```

    :param patterns: Regular expressions searched in the cleaned answer; defaults to `DEFAULT_UNKNOWN_PATTERNS`.
    :raises ValueError: If a pattern is not a valid regular expression.
    """

    patterns: tuple[str, ...] = DEFAULT_UNKNOWN_PATTERNS
    _compiled: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            compiled = tuple(re.compile(pattern) for pattern in self.patterns)
        except re.error as error:
            raise ValueError(
                f"`unknown_patterns` holds an invalid regular expression {error.pattern!r}: {error}"
            ) from error
        object.__setattr__(self, "patterns", tuple(self.patterns))
        object.__setattr__(self, "_compiled", compiled)

    @classmethod
    def from_patterns(cls, patterns: Sequence[str] | None) -> UnknownDetector:
        """The detector of a component's `unknown_patterns` (None: the defaults)."""
        return cls() if patterns is None else cls(tuple(patterns))

    def is_unknown(self, answer: str | None) -> bool:
        if answer is None:
            return True
        cleaned = clean_answer(answer)
        if not normalize_answer(cleaned):
            return True
        core = unknown_core(cleaned)
        return any(pattern.search(cleaned) or pattern.search(core) for pattern in self._compiled)


@dataclass(frozen=True)
class VoteResult:
    """
    The outcome of majority voting over per-passage answers (Liu et al., Eq. 2).

    :param answer: The winner as its best-ranked passage's reply wrote it; "unknown" when nothing voted.
    :param votes: Normalized answer -> votes, winner first, then by votes and best passage rank (`best_rank`, 0-based).
    :param candidates: One surface form per normalized answer, in the order of `votes`.
    """

    answer: str
    votes: dict[str, int]
    candidates: list[str]
    best_rank: dict[str, int]

    @property
    def is_unknown(self) -> bool:
        return not self.votes


def majority_vote(
    answers: Sequence[str | None], ranks: Sequence[int] | None = None, detector: UnknownDetector | None = None
) -> VoteResult:
    """
    Majority vote over the answers of each passage (Liu et al., Eq. 2), compared normalized; abstentions and None do not
    vote; a tie goes to the better-ranked passage (`ranks`, 0-based; default: the position). ValueError for `ranks` of
    another length.
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
    """Official SQuAD token F1 in [0, 1] (Liu et al., section 4); 1.0 if both have no token, 0.0 if one has none."""
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
    """The `{"token", "logprob", ...}` entries of a reply's `meta["logprobs"]["content"]` (OpenAI's shape), in order;
    None when there are none."""
    logprobs = (meta or {}).get("logprobs")
    tokens = logprobs.get("content") if isinstance(logprobs, Mapping) else logprobs
    if not isinstance(tokens, list) or not tokens:
        return None
    valid = [t for t in tokens if isinstance(t, Mapping) and isinstance(t.get("logprob"), (int, float))]
    return valid if len(valid) == len(tokens) else None


def answer_confidence(meta: Mapping[str, Any] | None, answer: str | None = None) -> float | None:
    """The geometric mean of the probabilities of the non-blank tokens over the answer's first occurrence in the reply
    (else the reply's first non-blank line), in [0, 1]; None without log-probabilities."""
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


INVALID = "invalid"  # the `meta["answer_source"]` of a rejected answer

PASSAGE_MARKUP = "passage markup"
DEMONSTRATION = "demonstration answer"
EMPTY_ENUMERATION = "empty enumeration"
REPEATS_QUESTION = "repeats the question"
REASONS: tuple[str, ...] = (PASSAGE_MARKUP, DEMONSTRATION, EMPTY_ENUMERATION, REPEATS_QUESTION)
"""Every reason `check_answer` gives, in the order it checks them."""

_MARKUP = re.compile(r"</?\s*passage\b|\bpassage\s+key\b|\bkey\s*=\s*[\"']|^\[\d{1,3}\]$|^passage\s*#\s*\d{1,3}\b")
_KEY = re.compile(r"[0-9a-f]{8}")  # a delimiter key (`prompts.passage_key`)
_ENUMERATOR = re.compile(r"\(?(?:[ivxlcdm]{1,8}|[a-z]|\d{1,3})\)")  # `(i)`, `ii)`, `(a)`, `(3)`
_FILLER = frozenset({"…", "...", "..", "-", "–", "—", ",", ";", "and", "etc", "etc."})


def is_passage_markup(answer: str) -> bool:
    """Whether an answer holds passage markup (tags, `key="..."`, `[i]`, `Passage #i`) or is a bare delimiter key."""
    text = answer.strip().lower()
    if _MARKUP.search(text):
        return True
    token = trim_answer(text)
    return len(token) == 8 and _KEY.fullmatch(token) is not None and not token.isdigit()


def is_empty_enumeration(answer: str) -> bool:
    """Whether an answer is only list labels (`(i) (ii)`) and filler ("…", ",", "and"), one label at least."""
    labels = 0
    for token in answer.lower().replace(",", " , ").split():
        if _ENUMERATOR.fullmatch(token.rstrip(".,;:")):
            labels += 1
        elif token not in _FILLER:
            return False
    return labels > 0


def copies_demonstration(answer: str, demonstrations: Iterable[str], passages: Iterable[str]) -> bool:
    """Whether an answer is a demonstration's answer that no passage holds as a whole-word phrase (normalized)."""
    key = normalize_answer(answer)
    if not key or key not in {normalize_answer(demo) for demo in demonstrations}:
        return False
    return not any(f" {key} " in f" {normalize_answer(text)} " for text in passages)


def repeats_question(answer: str, question: str) -> bool:
    """Whether an answer of two words or more only repeats words of the question and is none of its alternatives
    ("Jane Austen" for "Was it written by Jane Austen or Charlotte Bronte?" is an answer)."""
    words = normalize_answer(answer).split()
    if len(words) < 2:
        return False
    asked = normalize_answer(question).split()
    if not set(words) <= set(asked):
        return False
    if "or" in words:
        return True
    beside_or = {
        asked[j] for i, word in enumerate(asked) if word == "or" for j in (i - 1, i + 1) if 0 <= j < len(asked)
    }
    return not beside_or & set(words)


def check_answer(
    answer: str | None,
    *,
    question: str | None = None,
    demonstrations: Sequence[str] = (),
    passages: Iterable[str] = (),
) -> str | None:
    """
    Check one answer read from a reply: the package's one validator (module docstring).

    :param demonstrations: The few-shot answers of the prompt, rejected unless one of `passages` holds them.
    :returns: One of `REASONS` when the answer is rejected, else None (also for no answer).
    """
    if not answer or not answer.strip():
        return None
    if is_passage_markup(answer):
        return PASSAGE_MARKUP
    if demonstrations and copies_demonstration(answer, demonstrations, passages):
        return DEMONSTRATION
    if is_empty_enumeration(answer):
        return EMPTY_ENUMERATION
    if question and repeats_question(answer, question):
        return REPEATS_QUESTION
    return None


def invalid_meta(answer: str, reason: str) -> dict[str, Any]:
    """The `meta` of a rejected answer: `{"answer_source": "invalid", "invalid_reason", "rejected_answer"}`."""
    return {"answer_source": INVALID, "invalid_reason": reason, "rejected_answer": answer}


INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf"})  # control and format characters (zero-width spaces, direction marks)


def has_visible_text(text: str) -> bool:
    """Whether `text` holds a character that is neither whitespace nor a control or format character."""
    return any(unicodedata.category(char) not in INVISIBLE_CATEGORIES for char in text if not char.isspace())


def validate_query(query: str) -> str:
    """A question checked before any LLM call, stripped; ValueError for no text, no visible text, a lone surrogate."""
    if not isinstance(query, str) or not has_visible_text(query):
        shown = query if not isinstance(query, str) or len(query) <= 40 else f"{query[:40]}..."
        raise ValueError(
            f"`query` must be a non-empty question with visible text (not only whitespace or control characters), "
            f"got {shown!r}"
        )
    try:
        query.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"`query` is not valid Unicode text: a lone surrogate at character {error.start}") from None
    return query.strip()


def invalid_answer(answer: GeneratedAnswer, reason: str) -> GeneratedAnswer:
    """The empty answer replacing a rejected one, its `meta` extended by `invalid_meta`."""
    meta = {**answer.meta, **invalid_meta(answer.data or "", reason)}
    return GeneratedAnswer(data="", query=answer.query, documents=answer.documents, meta=meta)


def is_invalid(meta: dict[str, Any] | None) -> bool:
    """Whether a `meta`'s `answer_source` says the answer was rejected."""
    return bool(meta) and meta.get("answer_source") == INVALID  # type: ignore[union-attr]
