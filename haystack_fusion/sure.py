"""
SuRe's reply parsers and scoring (Kim et al., sections 3.2-3.3, Appendix A.1-A.4): pure functions, no LLM calls.

SuRe asks the LLM for K answer candidates (Eq. 2, Listing 6), summarizes the passages once per candidate (Eq. 3,
Listing 7), asks whether each summary supports its candidate (Eq. 4, Listing 8) and which of two summaries is more
informative (Eq. 5, Listing 9), and answers with the candidate of the best summary (Eq. 6). This module reads the
free-text replies of those calls and does the arithmetic; the components that make the calls live elsewhere.

Candidates are indexed from 0 here (the paper counts from 1): index k is candidate y_{k+1} and summary s_{k+1}.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from haystack_fusion.answers import TRIM_CHARACTERS, normalize_answer, token_logprobs, trim_answer
from haystack_fusion.prompts.sure import CHOICE_LETTERS

_DONE = re.compile(r"\[\s*done\s*\]", re.IGNORECASE)
"""The end marker of Listing 7; small models carry it over to other calls."""

_CHOICES_ECHO = re.compile(r"choices\s*:\s*\[[^\[\]\n]*\]\.?", re.IGNORECASE)
"""An echo of the prompt's "Choices: [True, False]." / "Choices: [Passage 1, Passage 2]." (Listings 8 and 9). No "["
inside the brackets: then a line of many unclosed "Choices: [" takes linear time, not quadratic."""

_PREFIX = re.compile(
    r"^[\s*_#>]*(?:final\s+)?(?:answers?|candidates?|candidate\s+answers?|answer\s+candidates?|choices?|verdict"
    r"|response|prediction)[*_]*\s*:[*_\s]*",
    re.IGNORECASE,
)
"""A leading label such as "Answer:", "**Candidates:**" or "Final answer:" (one word before the colon)."""

_MARKER_TEMPLATE = (
    r"(?P<paren>\(\s*{m}\s*\))"  # (a)  (A)  (1)
    r"|(?P<close>(?<![^\s,;:*]){m}\))"  # a)  1)  at the start or after a space or separator
    r"|(?P<dot>^[ \t*]*{m}[.:](?=\s))"  # a.  1.  1:  at the start of a line
    r"|(?P<word>\b(?:candidate|answer|option|choice)\s*(?:#\s*)?{m}\s*[:.)-])"  # Candidate 1:  Option A:
)
"""One list marker of one item; `{m}` is the letter or the number of that item."""

_MARKERS_ONLY = re.compile(r"\(\s*[A-Za-z0-9]{1,3}\s*\)?")
"""List markers, the last possibly cut off ("(q"): an item made of nothing else is no candidate."""

_BULLET = re.compile(r"^[ \t]*[-*•+][ \t]+(?P<item>.*)$", re.MULTILINE)

_TRUE_FALSE = re.compile(r"(?P<negation>\bnot\s+|n't\s+)?\b(?P<word>true|false)\b", re.IGNORECASE)
_YES_NO = re.compile(r"\b(?P<word>yes|no)\b", re.IGNORECASE)

_MENTION = re.compile(
    r"\bpassage\s*(?:(?:#|no\.?|number)\s*)?(?P<digit>[12])(?!\d)"
    r"|\bpassage\s+(?P<word>one|two)\b"
    r"|\b(?:the\s+)?(?P<ordinal>first|second)\s+(?:passage|one)\b"
    r"|\bthe\s+(?P<bare_ordinal>first|second)\b",
    re.IGNORECASE,
)
"""A reference to one of the two summaries of Listing 9 ("Passage 1", "passage2", "Passage #1", "the second")."""

_LEADING_DIGIT = re.compile(r"(?P<digit>[12])(?:\s*[\])])?(?=[\s.,;:!]|$)")
"""A bare "1" or "2" (optionally "(2)", "[1]") at the very start of a preference reply."""

_TIE = re.compile(
    r"\b(?:both|neither|nor|equally|equal|tie|tied|same|either)\b"
    r"|(?:\bpassages?\s*(?:#\s*)?|\b)[12]\s*(?:,|and|or|&|/|vs\.?|versus)\s*(?:passage\s*)?(?:#\s*)?[12]\b"
    r"|\b(?:the\s+)?first\s+(?:and|or)\s+(?:the\s+)?second\b",
    re.IGNORECASE,
)
"""Wording that names no single winner: "both", "equally", "Passage 1 and Passage 2", "the first or the second"."""


@lru_cache(maxsize=128)
def _marker(family: str, index: int) -> re.Pattern[str]:
    """The marker pattern of the 0-based item `index` in the "letter" or "number" family."""
    symbol = CHOICE_LETTERS[index] if family == "letter" else str(index + 1)
    return re.compile(_MARKER_TEMPLATE.format(m=re.escape(symbol)), re.IGNORECASE | re.MULTILINE)


def _lines(text: str) -> list[str]:
    """The non-blank lines of `text`, stripped."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def _split_on_markers(text: str, family: str) -> list[str] | None:
    """The raw items of `text` cut at one family's markers ("letter" or "number"; step 2 of `parse_candidates`), or
    None when they are not there (none, or a lone line-start "A.", more likely an initial as in "A. Lincoln")."""
    limit = len(CHOICE_LETTERS) if family == "letter" else 1000
    first = _marker(family, 0).search(text)
    second = _marker(family, 1).search(text) if limit > 1 else None
    if first is not None and second is not None and second.start() < first.start():
        first = None
    found: list[re.Match[str]] = []
    position = 0
    index = 1
    if first is not None:
        found.append(first)
        position = first.end()
    while index < limit:
        match = _marker(family, index).search(text, position)
        if match is None:
            break
        found.append(match)
        position = match.end()
        index += 1
    if not found or (len(found) == 1 and family == "letter" and found[0].lastgroup == "dot"):
        return None
    items: list[str] = []
    if first is None:
        before = _lines(text[: found[0].start()])
        if before:
            items.append(before[-1])
    for match, following in zip(found, [*found[1:], None], strict=True):
        end = len(text) if following is None else following.start()
        lines = _lines(text[match.end() : end])
        if lines:
            items.append(lines[0])
    return items


def _clean_candidate(candidate: str) -> str:
    """
    One candidate as it is returned: whitespace collapsed, a leading "Answer:" label and surrounding quotes, markdown
    emphasis and trailing ".", ",", ";", ":" removed (a trailing abbreviation such as "D.C." keeps its period).
    """
    candidate = _PREFIX.sub("", " ".join(candidate.split()))
    return trim_answer(candidate)


def parse_candidates(reply: str | None, k: int) -> list[str]:
    """
    Read the K answer candidates of SuRe's candidate generation (Kim et al., section 3.2, Eq. 2; Listing 6).

    Listing 6 asks for "(a) xx, (b) yy"; models also write other list shapes. The reply is read as follows:

    1. "[DONE]" and a leading label ("Answer:", "Candidates:", "**Final answer:**") are removed.
    2. Markers: letters "(a)" / "a)" / "(A)" / line-start "a." and numbers "(1)" / "1)" / line-start "1." /
       "Candidate 1:" are searched in sequence (a, b, c, ... and 1, 2, 3, ..., each after the previous one); the
       family with more markers wins, letters on a tie. The first marker may be missing ("Paris (b) Lyon"). Each
       item runs to the next marker and is cut at its first line break, so a "[DONE]" or an explanation after the
       list is dropped. Commas inside an item never split it ("(a) Boston, Massachusetts (b) Springfield").
    3. Otherwise bullets: the lines starting with "-", "*", "•" or "+" are the items; other lines are dropped.
    4. Otherwise plain text: with several lines, each line is an item (lines ending with ":" are headers and
       dropped). A single line is split on semicolons if it has any, else on commas when k > 1 ("Paris, Lyon");
       with k = 1 it is one candidate. A one-line "Boston, Massachusetts" therefore gives two candidates when k > 1:
       without markers the reply cannot tell them apart, and the later steps of SuRe judge each candidate anyway.

    Items are cleaned (`_clean_candidate`); empty ones, ones that are only list markers ("(a) (b) (c) ... (q", as small
    models loop) and duplicates under `normalize_answer` (the first spelling kept) are dropped; the first k remain.

    :param reply: The LLM's reply to the candidate prompt; None for a failed call.
    :param k: K, the number of candidates asked for.
    :returns: At most k distinct, non-empty candidates in the order the reply gives them; [] for an empty reply.
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
        candidate = _clean_candidate(item)
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
    Read the instance-wise validation reply (Kim et al., section 3.3, Eq. 4; Listing 8, "Choices: [True, False].").

    An echo of "Choices: [True, False]." is removed first. The first "true" or "false" word (case-insensitive, whole
    word) decides; "not true" / "isn't true" count as false and "not false" as true. Only when the reply has no
    true/false word does the first "yes" / "no" decide. Anything else is invalid, since Eq. 4 gives v = 0 "else".

    :param reply: The LLM's reply; None for a failed call.
    :returns: True when the reply says the summary supports its candidate (v(s_k) = 1), else False (v(s_k) = 0).
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
    """1 or 2: which passage a `_MENTION` or `_LEADING_DIGIT` match names."""
    groups = match.groupdict()
    if groups.get("digit"):
        return int(groups["digit"])
    word = (groups.get("word") or groups.get("ordinal") or groups.get("bare_ordinal") or "").lower()
    return 1 if word in ("one", "first") else 2


def parse_preference(reply: str | None) -> int | None:
    """
    Read the pair-wise ranking reply (Kim et al., section 3.3, Eq. 5; Listing 9, "Choices: [Passage 1, Passage 2].").

    A passage is named by "Passage 1", "passage1", "Passage #1", "Passage No. 1", "Passage one", "the first
    (passage)", "first one" (and likewise for 2); a bare "1" or "2" counts only at the start of the reply. After an
    echo of "Choices: [...]" and a leading "Answer:" label, quotes, brackets and markdown are removed:

    1. A reply that starts by naming one passage, not joined to the other ("Passage 2 is more informative than
       Passage 1", "2.", "[Passage 1]"), prefers that passage.
    2. Otherwise a reply that names no single winner ("both", "neither", "equally", "same", "Passage 1 and Passage
       2", "the first or the second") has no preference, so hedges like "Both are relevant, but Passage 2 ..."
       give None too.
    3. Otherwise the first passage named wins; a reply that names none has no preference.

    :param reply: The LLM's reply; None for a failed call.
    :returns: 1 or 2 for the preferred passage, None when the reply gives no single preference (Eq. 5 "else").
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
    """
    The pair-wise ranking calls for K summaries (Kim et al., section 3.3, Eq. 5): each unordered pair in both orders
    "to prevent the order bias of LLMs". Returns k * (k - 1) pairs (a, b), "s_a as Passage 1, s_b as Passage 2":
    for each a < b, (a, b) then (b, a).

    :raises ValueError: If k < 0.
    """
    if k < 0:
        raise ValueError(f"`k` must not be negative, got {k}")
    return [pair for a in range(k) for b in range(a + 1, k) for pair in ((a, b), (b, a))]


def pairwise_ranking(preferences: Mapping[tuple[int, int], int | float | None], k: int) -> list[float]:
    """
    The ranking scores r(s_k, S_K) of Kim et al., section 3.3, Eq. 5.

    A call (a, b) gives s_a 1 when the reply prefers Passage 1, 0 for Passage 2, 0.5 otherwise (Eq. 5 "else"), or with
    probability scoring P(Passage 1) (`choice_probability`); s_b gets 1 minus that. r_pair(s_k, s_i) is the mean
    outcome of s_k over the calls for {k, i} (both orders cancel order bias), 0.5 for a pair with no call; r(s_k, S_K)
    sums r_pair over i != k, so the scores sum to k * (k - 1) / 2.

    :param preferences: (a, b) -> the call that showed s_a as Passage 1 and s_b as Passage 2 (0-based): 1 or 2
        (`parse_preference`), None (no preference, or a failed call) or a float in [0, 1], P(Passage 1). Usually
        keyed by `ranking_pairs(k)`; pairs may be missing.
    :param k: K, the number of summaries.
    :returns: A list of k scores, each in [0, k - 1], in candidate order.
    :raises ValueError: If k < 0, an index is out of range, a == b, or a value is not 1, 2, None or a float in
        [0, 1].
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
    Order the candidates by SuRe's final score v(s_k) + r(s_k, S_K) (Kim et al., section 3.3, Eq. 6).

    The first index is Eq. 6's k*. Ties go to the candidate generated earlier in Eq. 2 (section 4.1); scores are
    compared after rounding to 9 decimals so that float noise does not break a tie.

    :param validity: v(s_k) per candidate (1.0 valid / 0.0 invalid, or a bool), length K.
    :param ranking: r(s_k, S_K) per candidate, as `pairwise_ranking` returns it, length K.
    :returns: All K candidate indices, best first; [] for K = 0.
    :raises ValueError: If the lengths differ or a score is not finite.
    """
    if len(validity) != len(ranking):
        raise ValueError(f"`validity` has {len(validity)} entries but `ranking` has {len(ranking)}")
    totals = [float(v) + float(r) for v, r in zip(validity, ranking, strict=True)]
    if not all(math.isfinite(total) for total in totals):
        raise ValueError(f"scores must be finite, got validity {list(validity)} and ranking {list(ranking)}")
    return sorted(range(len(totals)), key=lambda index: (-round(totals[index], 9), index))


VALIDITY_CHOICES = (("true", "yes"), ("false", "no"))
"""The words of a validity reply (Listing 8, "Choices: [True, False]"), positive then negative; yes / no as
`parse_validity` reads them."""

PREFERENCE_CHOICES = (("1", "one", "first"), ("2", "two", "second"))
"""The words that name Passage 1 and Passage 2 in a ranking reply (Listing 9, "Choices: [Passage 1, Passage 2]")."""

SCORING_TOP_LOGPROBS = 10
"""Alternatives per token that probability scoring asks for (OpenAI allows up to 20): enough for both choices of a
binary decision to be among them."""


Choices = tuple[tuple[str, ...], tuple[str, ...]]


def choice_probability(meta: Mapping[str, Any] | None, choices: Choices) -> float | None:
    """
    The probability of the first of two choices at the reply's decision position, against the second.

    The decision position is the first generated token that is a choice word (case-insensitive, without surrounding
    whitespace and punctuation). There P(first) and P(second) sum the probabilities of the position's alternatives
    (`top_logprobs`, the chosen token included) that spell each choice, and the result is P(first) / (P(first) +
    P(second)): the "P(True)" of self-evaluation, a continuous validity v(s_k) for Eq. 4 and pair-wise outcome for
    Eq. 5 (Kim et al., section 3.3); 1.0 or 0.0 when only the chosen side is among the alternatives.

    :param meta: The reply's `meta`, with OpenAI-style `meta["logprobs"]` (see `answers.token_logprobs`), asked for
        with `top_logprobs` (`SCORING_TOP_LOGPROBS`).
    :param choices: (first choice's words, second choice's words), lowercase, e.g. `VALIDITY_CHOICES`.
    :returns: A probability in [0, 1]; None when the reply has no log-probabilities or no token names a choice
        (then the text parse decides).
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
    """
    Whether a conditional summary (Listing 7) is no summary: without a leading "(b)" / "b." label it normalizes to
    nothing or to one of the `candidates`, as when base models continue the list pattern ("(b) Lyon"); such a
    summary cannot support its prediction (Eq. 4) or be ranked on its content (Eq. 5).
    """
    key = normalize_answer(_LABEL.sub("", summary or ""))
    return not key or any(key == normalize_answer(candidate) for candidate in candidates)
