"""
SuRe's reply parsers and scoring (Kim et al., sections 3.2-3.3, Appendix A.1-A.4): pure functions, no LLM calls.
Candidates are indexed from 0 (the paper counts from 1): index k is candidate y_{k+1} and summary s_{k+1}.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from haystack_fusion.answers import TRIM_CHARACTERS, normalize_answer, token_logprobs, trim_answer
from haystack_fusion.prompts.sure import CHOICE_LETTERS

_DONE = re.compile(r"\[\s*done\s*\]", re.IGNORECASE)  # Listing 7's end marker, carried over to other calls
# An echo of Listings 8 and 9's "Choices: [...]"; no "[" inside, so many unclosed "Choices: [" take linear time.
_CHOICES_ECHO = re.compile(r"choices\s*:\s*\[[^\[\]\n]*\]\.?", re.IGNORECASE)

_PREFIX = re.compile(
    r"^[\s*_#>]*(?:final\s+)?(?:answers?|candidates?|candidate\s+answers?|answer\s+candidates?|choices?|verdict"
    r"|response|prediction)[*_]*\s*:[*_\s]*",
    re.IGNORECASE,
)  # a leading label: "Answer:", "**Candidates:**", "Final answer:"

_MARKER_TEMPLATE = (
    r"(?P<paren>\(\s*{m}\s*\))"  # (a)  (A)  (1)
    r"|(?P<close>(?<![^\s,;:*]){m}\))"  # a)  1)  at the start or after a space or separator
    r"|(?P<dot>^[ \t*]*{m}[.:](?=\s))"  # a.  1.  1:  at the start of a line
    r"|(?P<word>\b(?:candidate|answer|option|choice)\s*(?:#\s*)?{m}\s*[:.)-])"  # Candidate 1:  Option A:
)  # one list marker of one item; `{m}` is its letter or number
_MARKERS_ONLY = re.compile(r"\(\s*[A-Za-z0-9]{1,3}\s*\)?")  # an item of only markers ("(a) (b) ... (q") is none

_BULLET = re.compile(r"^[ \t]*[-*•+][ \t]+(?P<item>.*)$", re.MULTILINE)

_TRUE_FALSE = re.compile(r"(?P<negation>\bnot\s+|n't\s+)?\b(?P<word>true|false)\b", re.IGNORECASE)
_YES_NO = re.compile(r"\b(?P<word>yes|no)\b", re.IGNORECASE)

_MENTION = re.compile(
    r"\bpassage\s*(?:(?:#|no\.?|number)\s*)?(?P<digit>[12])(?!\d)"
    r"|\bpassage\s+(?P<word>one|two)\b"
    r"|\b(?:the\s+)?(?P<ordinal>first|second)\s+(?:passage|one)\b"
    r"|\bthe\s+(?P<bare_ordinal>first|second)\b",
    re.IGNORECASE,
)  # one of Listing 9's two summaries: "Passage 1", "passage2", "Passage #1", "the second"
_LEADING_DIGIT = re.compile(r"(?P<digit>[12])(?:\s*[\])])?(?=[\s.,;:!]|$)")  # "1", "(2)", "[1]" starting a reply

_TIE = re.compile(
    r"\b(?:both|neither|nor|equally|equal|tie|tied|same|either)\b"
    r"|(?:\bpassages?\s*(?:#\s*)?|\b)[12]\s*(?:,|and|or|&|/|vs\.?|versus)\s*(?:passage\s*)?(?:#\s*)?[12]\b"
    r"|\b(?:the\s+)?first\s+(?:and|or)\s+(?:the\s+)?second\b",
    re.IGNORECASE,
)  # no single winner: "both", "equally", "Passage 1 and Passage 2", "the first or the second"


@lru_cache(maxsize=128)
def _marker(family: str, index: int) -> re.Pattern[str]:
    symbol = CHOICE_LETTERS[index] if family == "letter" else str(index + 1)
    return re.compile(_MARKER_TEMPLATE.format(m=re.escape(symbol)), re.IGNORECASE | re.MULTILINE)


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _split_on_markers(text: str, family: str) -> list[str] | None:
    """The items of `text` cut at one family's markers, or None for none or a lone "A." (an initial: "A. Lincoln")."""
    limit = len(CHOICE_LETTERS) if family == "letter" else 1000
    first = _marker(family, 0).search(text)
    second = _marker(family, 1).search(text)
    if first is not None and second is not None and second.start() < first.start():
        first = None
    found: list[re.Match[str]] = [] if first is None else [first]
    position = 0 if first is None else first.end()
    for index in range(1, limit):
        match = _marker(family, index).search(text, position)
        if match is None:
            break
        found.append(match)
        position = match.end()
    if not found or (len(found) == 1 and family == "letter" and found[0].lastgroup == "dot"):
        return None
    items: list[str] = []
    if first is None and (before := _lines(text[: found[0].start()])):
        items.append(before[-1])
    for match, following in zip(found, [*found[1:], None], strict=True):
        end = len(text) if following is None else following.start()
        lines = _lines(text[match.end() : end])
        if lines:
            items.append(lines[0])
    return items


def parse_candidates(reply: str | None, k: int) -> list[str]:
    """
    Read the K answer candidates of SuRe's candidate generation (Kim et al., section 3.2, Eq. 2; Listing 6).

    After "[DONE]" and a leading "Answer:" label go, the items are, in order of preference: the text after list
    markers in sequence (letters "(a)", "a)", line-start "a." or numbers "(1)", "1.", "Candidate 1:"; the family with
    more wins, letters on a tie; the first may be missing), each to its line's end; else bulleted lines; else the lines
    (headers ending ":" dropped), a single line split on ";", else on "," when k > 1. Items are cleaned of labels,
    quotes, emphasis and trailing punctuation; empty ones, bare markers and duplicates (normalized) are dropped.

    :param reply: The LLM's reply; None for a failed call.
    :returns: At most k distinct, non-empty candidates in the reply's order.
    :raises ValueError: If k < 1.
    """
    if k < 1:
        raise ValueError(f"`k` must be at least 1, got {k}")
    if reply is None:
        return []
    text = _PREFIX.sub("", _DONE.sub("\n", reply), count=1)
    if not text.strip():
        return []
    letters = _split_on_markers(text, "letter")
    numbers = _split_on_markers(text, "number")
    items: list[str]
    if letters is not None and (numbers is None or len(letters) >= len(numbers)):
        items = letters
    elif numbers is not None:
        items = numbers
    elif bullets := [match.group("item") for match in _BULLET.finditer(text)]:
        items = bullets
    else:
        lines = [line for line in _lines(text) if not line.endswith(":")]
        if len(lines) != 1:
            items = lines
        elif ";" in lines[0]:
            items = lines[0].split(";")
        elif k > 1:
            items = lines[0].split(",")
        else:
            items = lines
    candidates: list[str] = []
    seen: set[str] = set()
    for item in items:
        candidate = trim_answer(_PREFIX.sub("", " ".join(item.split())))
        key = normalize_answer(candidate)
        if not key or key in seen or not normalize_answer(_MARKERS_ONLY.sub(" ", candidate)):
            continue
        seen.add(key)
        candidates.append(candidate)
        if len(candidates) == k:
            break
    return candidates


def parse_validity(reply: str | None) -> bool:
    """
    Read the instance-wise validation reply (Kim et al., section 3.3, Eq. 4; Listing 8): v(s_k) = 1 (True) or 0.

    Past a "Choices: [...]" echo, the first "true"/"false" word decides ("not true" is false, "not false" true), else
    the first "yes"/"no"; anything else (or None) is False, Eq. 4's "else".
    """
    if not reply:
        return False
    text = _CHOICES_ECHO.sub(" ", reply)
    match = _TRUE_FALSE.search(text)
    if match is not None:
        return (match.group("word").lower() == "true") != (match.group("negation") is not None)
    answer = _YES_NO.search(text)
    return answer is not None and answer.group("word").lower() == "yes"


def _mention_value(match: re.Match[str]) -> int:
    groups = match.groupdict()
    if groups.get("digit"):
        return int(groups["digit"])
    word = (groups.get("word") or groups.get("ordinal") or groups.get("bare_ordinal") or "").lower()
    return 1 if word in ("one", "first") else 2


def parse_preference(reply: str | None) -> int | None:
    """
    Read the pair-wise ranking reply (Kim et al., section 3.3, Eq. 5; Listing 9): 1 or 2, the preferred passage, or None
    (Eq. 5's "else").

    Past a "Choices: [...]" echo, an "Answer:" label, quotes and brackets: a reply that starts by naming one passage
    ("Passage 2 is more ...", "2.", "the first") prefers it; else one naming no single winner ("both", "equally",
    "Passage 1 and Passage 2") has none; else the first passage named wins.
    """
    if not reply:
        return None
    text = _PREFIX.sub("", _CHOICES_ECHO.sub(" ", reply), count=1)
    text = text.lstrip(TRIM_CHARACTERS + "[(")
    leading = _MENTION.match(text) or _LEADING_DIGIT.match(text)
    tie = _TIE.search(text)
    if leading is not None and not (tie is not None and tie.start() == 0):
        return _mention_value(leading)
    if tie is not None:
        return None
    first = _MENTION.search(text)
    return None if first is None else _mention_value(first)


def ranking_pairs(k: int) -> list[tuple[int, int]]:
    """The k * (k - 1) pair-wise ranking calls (a, b), s_a as Passage 1 (Kim et al., section 3.3, Eq. 5): each pair in
    both orders "to prevent the order bias of LLMs", (a, b) then (b, a) for a < b. ValueError for k < 0."""
    if k < 0:
        raise ValueError(f"`k` must not be negative, got {k}")
    return [pair for a in range(k) for b in range(a + 1, k) for pair in ((a, b), (b, a))]


def pairwise_ranking(preferences: Mapping[tuple[int, int], int | float | None], k: int) -> list[float]:
    """
    The ranking scores r(s_k, S_K) of Kim et al., section 3.3, Eq. 5: s_k's mean outcome per pair (1 preferred, 0 not,
    0.5 for no preference or no call), summed over the other summaries.

    :param preferences: (a, b) -> the call showing s_a as Passage 1: 1 or 2 (`parse_preference`), None or P(Passage 1)
        in [0, 1] (`choice_probability`); pairs may be missing.
    :returns: k scores, each in [0, k - 1], in candidate order.
    :raises ValueError: If k < 0, an index is out of range or repeated, or a value is not 1, 2, None or in [0, 1].
    """
    if k < 0:
        raise ValueError(f"`k` must not be negative, got {k}")
    outcomes: dict[tuple[int, int], list[float]] = {}
    for (a, b), preference in preferences.items():
        if not (0 <= a < k and 0 <= b < k):
            raise ValueError(f"pair {(a, b)} has an index outside 0..{k - 1}")
        if a == b:
            raise ValueError(f"pair {(a, b)} compares a summary with itself")
        if isinstance(preference, float):
            if not 0.0 <= preference <= 1.0:
                raise ValueError(f"pair {(a, b)} has probability {preference!r}; expected a value in [0, 1]")
            outcome_a = preference
        elif preference in (1, 2, None):
            outcome_a = 1.0 if preference == 1 else 0.0 if preference == 2 else 0.5
        else:
            raise ValueError(f"pair {(a, b)} has preference {preference!r}; expected 1, 2, None or a probability")
        low, high = min(a, b), max(a, b)
        outcomes.setdefault((low, high), []).append(outcome_a if a == low else 1.0 - outcome_a)
    scores = [0.0] * k
    for low in range(k):
        for high in range(low + 1, k):
            pair_outcomes = outcomes.get((low, high))
            r_low = sum(pair_outcomes) / len(pair_outcomes) if pair_outcomes else 0.5
            scores[low] += r_low
            scores[high] += 1.0 - r_low
    return scores


def select(validity: Sequence[float], ranking: Sequence[float]) -> list[int]:
    """
    The K candidate indices, best first, by v(s_k) + r(s_k, S_K) (Kim et al., section 3.3, Eq. 6); ties (to 9 decimals)
    go to the candidate generated earlier (section 4.1). ValueError for lengths that differ or a score not finite.
    """
    if len(validity) != len(ranking):
        raise ValueError(f"`validity` has {len(validity)} entries but `ranking` has {len(ranking)}")
    totals = [float(v) + float(r) for v, r in zip(validity, ranking, strict=True)]
    if not all(math.isfinite(total) for total in totals):
        raise ValueError(f"scores must be finite, got validity {list(validity)} and ranking {list(ranking)}")
    return sorted(range(len(totals)), key=lambda index: (-round(totals[index], 9), index))


VALIDITY_CHOICES = (("true", "yes"), ("false", "no"))  # Listing 8's choices, positive first
PREFERENCE_CHOICES = (("1", "one", "first"), ("2", "two", "second"))  # Listing 9's Passage 1 and Passage 2
SCORING_TOP_LOGPROBS = 10  # alternatives per token for probability scoring (OpenAI allows up to 20)
Choices = tuple[tuple[str, ...], tuple[str, ...]]


def choice_probability(meta: Mapping[str, Any] | None, choices: Choices) -> float | None:
    """
    P(first) / (P(first) + P(second)) at the first generated token that is a choice word, each P summed over that
    token's `top_logprobs` alternatives: a continuous v(s_k) for Eq. 4 or pair-wise outcome for Eq. 5 (Kim et al.,
    section 3.3).

    :param meta: The reply's `meta` with OpenAI-style `logprobs`, asked for with `SCORING_TOP_LOGPROBS`.
    :param choices: (first choice's words, second choice's words), lowercase, e.g. `VALIDITY_CHOICES`.
    :returns: A probability in [0, 1]; None without log-probabilities or a choice token (the text parse decides).
    """
    tokens = token_logprobs(meta)
    if tokens is None:
        return None

    def side(token: Any) -> int | None:
        word = str(token or "").strip().strip(TRIM_CHARACTERS + ".,;:!?()[]").lower()
        return 0 if word in choices[0] else 1 if word in choices[1] else None

    for entry in tokens:
        chosen = side(entry.get("token"))
        if chosen is None:
            continue
        mass = [0.0, 0.0]
        top = entry.get("top_logprobs")
        alternatives = (
            [alternative for alternative in top if isinstance(alternative, Mapping)]
            if isinstance(top, (list, tuple))
            else []
        )
        if not any(alternative.get("token") == entry.get("token") for alternative in alternatives):
            alternatives.append(entry)
        for alternative in alternatives:
            which = side(alternative.get("token"))
            if which is not None and isinstance(alternative.get("logprob"), (int, float)):
                logprob = float(alternative["logprob"])
                mass[which] += math.exp(0.0 if logprob > 0 else logprob)  # above 0 (malformed) would overflow exp
        total = mass[0] + mass[1]
        return mass[0] / total if total > 0 else float(chosen == 0)
    return None


_LABEL = re.compile(r"^\s*(?:\(?[a-z]\)|[a-z]\.)\s+", re.IGNORECASE)


def summary_is_label(summary: str | None, candidates: Sequence[str]) -> bool:
    """Whether a conditional summary (Listing 7) is, past a "(b)" label, empty or a candidate ("(b) Lyon", as base
    models continue the list): no summary to validate (Eq. 4) or rank (Eq. 5)."""
    key = normalize_answer(_LABEL.sub("", summary or ""))
    return not key or any(key == normalize_answer(candidate) for candidate in candidates)
