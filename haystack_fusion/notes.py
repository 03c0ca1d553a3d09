"""
Chain-of-Note's reply parsers (Yu et al., sections 2.3-2.3.1, Appendix A.5-A.6): pure functions, no LLM calls.
Passages are numbered from 1, as in the prompts.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from haystack_fusion.answers import TRIM_CHARACTERS, UnknownDetector, normalize_answer, trim_answer

DIRECT = "direct"  # note type (a) of section 2.3.1 / Figure 2(a): the passage answers the question directly
CONTEXT = "context"  # type (b): the passage does not answer but gives useful context
IRRELEVANT = "irrelevant"  # type (c): the passage is irrelevant to the question
RELEVANCE_LABELS: tuple[str, ...] = (DIRECT, CONTEXT, IRRELEVANT)
"""The three note types of section 2.3.1, in the paper's order (a), (b), (c)."""

_NON_BLANK = re.compile(r"\S")
_ANSWER_TEXT = re.compile("[^\\s" + re.escape(TRIM_CHARACTERS + ".,;:") + "]")  # a text without one cleans to ""

_NUMBER = r"\d{1,6}(?!\d)"
_JOIN = r"\s*(?:,\s*(?:and\s+|or\s+|&\s*)?|and\s+|or\s+|&\s*|/\s*|-+\s*|[–—]\s*|to\s+|through\s+|thru\s+)"
_REFERENCE = re.compile(
    rf"\b(?:passages?|documents?|docs?|paragraphs?)\s*(?:(?:#|no\.?|number)\s*)?(?P<numbers>{_NUMBER}"
    rf"(?:{_JOIN}(?:#\s*)?{_NUMBER})*)"
    rf"|\[\s*(?P<bracket>{_NUMBER}(?:\s*(?:,|-|–|and)\s*{_NUMBER})*)\s*\]",
    re.IGNORECASE,
)  # "Passage #1", "Document #2", "Passages #1, #2, and #4", "Passages #2-#4", "[1, 3]"
_RANGE_JOIN = re.compile(r"^\s*(?:-+|[–—]|to|through|thru)\s*#?\s*$", re.IGNORECASE)  # "#2-#4", "2 to 4"
# After a "*" or "_": only the second character or the end of a run (else quadratic time), where a "**" may start.
_AFTER_EMPHASIS = r"(?<=[*_])(?:(?<![*_]{2})|(?![*_]))"

_ANSWER_MARKER = re.compile(
    r"(?:(?<!\s)|(?!\s))"  # not from inside a run of whitespace
    r"(?:\b(?:based\s+on|according\s+to|considering)\b"
    r"(?:(?!(?:passages?|documents?|docs?|paragraphs?)\s*(?:(?:#|no\.?|number)\s*)?\d|\[\s*\d)[^\n.!?;]){0,150}?,\s*+)?"
    r"(?:,?\s*\b(?:so|thus|therefore|hence|overall|in\s+conclusion|in\s+summary)\b,?\s*|,\s*)?"
    r"(?:the\s+(?:(?:final|correct|short|best|most\s+likely)\s+)?answers?\s+(?:is|are|was|would\s+be|should\s+be)"
    r"\s*:?"
    rf"|(?:(?<![^\s>#(\[.!?;:,])|{_AFTER_EMPHASIS})[*_]*(?:(?:final|short|correct)\s+)?answer\s*(?:[*_]+\s*)?:[*_]*)",
    re.IGNORECASE,
)  # "the answer is" (after Table 6's "Based on ..." or a connective), "Answer:", "**Final answer:**"; linear time

_CONTINUATION = re.compile(
    r"^[ \t*_#>]*(?:(?:question|task\s+description|reading\s+notes?)\s*(?:[*_]+\s*)?:|</?passage\b)",
    re.IGNORECASE | re.MULTILINE,
)  # a new prompt block: a base model that runs on past its answer writes the next demonstration
_READING_NOTES_LABEL = re.compile(r"^\s*[*_]*reading\s+notes?\s*(?:[*_]+\s*)?:[*_]*", re.IGNORECASE)
_BREAK = re.compile(r"(?<=[.!?;])[\"'”’)\]]*\s+|\n")  # between sentences or lines

_RELEVANCE_LINE = re.compile(
    rf"(?:(?<![^\s>#(\[])|{_AFTER_EMPHASIS})[*_]*(?:relevance(?:\s+label)?|label|note\s+type)[*_]*\s*[:=][*_]*[ \t]*"
    r"(?P<label>[^\n]*)",
    re.IGNORECASE,
)  # "Relevance: (b) useful context", "**Relevance:**", "Label:"

_CANONICAL_LABEL = r"(?:answers?\s+(?:the\s+question\s+)?directly|useful\s+context|irrelevant)"
_LABEL_ONLY_LINE = re.compile(
    rf"^[ \t*_>\-]*(?:(?:\(\s*[abc]\s*\)|[abc]\))(?:[ \t]*{_CANONICAL_LABEL})?|{_CANONICAL_LABEL})[ \t.*_]*$",
    re.IGNORECASE | re.MULTILINE,
)  # only a label: "(b) useful context", "(c)", "Irrelevant."
_LABEL_PAREN_LETTER = re.compile(r"\(\s*([abc])\s*\)", re.IGNORECASE)
_LABEL_BARE_LETTER = re.compile(r"^[^\w(]*([abc])\s*(?:\)|[.:\-–—](?!\w)|$)", re.IGNORECASE)  # "a)", "b.", "B - "
# The words of a label without a letter, tried in this order by `_read_label`.
_LABEL_IRRELEVANT = re.compile(
    r"\b(?:irrelevant|unrelated|off[-\s]?topic|none|no\s+relevance)\b"
    r"|(?:\bnot|n't)\s+(?:at\s+all\s+)?(?:relevant|related|useful|helpful)\b",
    re.IGNORECASE,
)
_LABEL_NOT_DIRECT = re.compile(r"(?:\bnot|n't)\s+(?:\w+\s+)?(?:direct|answer)", re.IGNORECASE)
_LABEL_DIRECT = re.compile(r"\b(?:direct(?:ly)?|answers?)\b", re.IGNORECASE)
_LABEL_CONTEXT = re.compile(
    r"\b(?:context(?:ual)?|useful|helpful|partial(?:ly)?|indirect(?:ly)?|somewhat|background|related|relevant)\b",
    re.IGNORECASE,
)

_IRRELEVANT_NOTE = re.compile(
    r"\b(?:irrelevant|unrelated|off[-\s]?topic)\b"
    r"|\bnothing\s+to\s+do\s+with\b"
    r"|\b(?:no|little)\s+relevance\b"
    r"|(?:\bnot|n't)\s+(?:(?:at\s+all|really|very|particularly)\s+)?(?:relevant|related|pertinent|useful|helpful)\b"
    r"|\bno\s+(?:relevant|useful|pertinent|helpful)\s+(?:information|details?|content|facts?)\b"
    r"|\b(?:no|any|nothing)\s+(?:(?:relevant|useful)\s+)?(?:(?:information|details?|content|mention)\s+)?"
    r"(?:relevant\s+to|related\s+to|about|on|regarding|concerning|to\s+answer)\s+(?:the|this)\s+(?:question|query)\b",
    re.IGNORECASE,
)  # a verdict of type (c); "not directly relevant" is type (b) (section 2.3.1)

_SEGMENT_BREAK = re.compile(
    r"(?<![.!?;])[.!?;]+(?:\s+|$)|\b(?:but|however|although|though|while|whereas|yet|instead|except)\b",
    re.IGNORECASE,
)  # sentence ends (a run tried from its first character only) and contrast words
_NEGATION = re.compile(
    r"\b(?:not|no|never|nor|neither|none|nothing|without|lacks?|lacking|fails?|cannot)\b|n't\b", re.IGNORECASE
)


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _cut_continuation(text: str) -> str:
    """`text` up to the first `_CONTINUATION` line after non-blank text (a prompt echo at the start stays)."""
    for match in _CONTINUATION.finditer(text):
        if text[: match.start()].strip():
            return text[: match.start()]
    return text


def _line_end(text: str, position: int) -> int:
    end = text.find("\n", position)
    return len(text) if end < 0 else end


def _non_blank(text: str, position: int) -> int:
    match = _NON_BLANK.search(text, position)
    return len(text) if match is None else match.start()


def _split_answer(text: str) -> tuple[str, str]:
    """(The last non-empty answer or "", the reply with each answer statement, to its line's end or the next non-blank
    line, replaced by a line break)."""
    # The span of the last non-empty answer, cleaned only at the end: on a line of many markers, cleaning the rest of
    # the line at each would take quadratic time.
    answer: tuple[int, int] | None = None
    spans: list[tuple[int, int]] = []
    line_end = -1
    for match in _ANSWER_MARKER.finditer(text):
        if match.end() > line_end:
            line_end = _line_end(text, match.end())
        end = line_end
        if _ANSWER_TEXT.search(text, match.end(), end):
            answer = (match.end(), end)
        elif end < len(text):
            start = _non_blank(text, end)
            next_end = _line_end(text, start)
            line = text[start:next_end]
            if line.strip() and not _REFERENCE.search(line) and not _ANSWER_MARKER.search(line):
                if _ANSWER_TEXT.search(line):
                    answer = (start, next_end)
                end = next_end
        spans.append((match.start(), end))
    pieces: list[str] = []
    position = 0
    for start, end in spans:
        pieces += [text[position:start], "\n"]  # "" for a span that starts inside the one before
        position = max(position, end)
    pieces.append(text[position:])
    return ("" if answer is None else trim_answer(_collapse(text[answer[0] : answer[1]]))), "".join(pieces)


def _referenced(match: re.Match[str], k: int) -> set[int]:
    """The passage numbers in 1..k a reference names; "#2-#4" is a range when it runs upwards within 1..k."""
    listed = match.group("numbers") or match.group("bracket") or ""
    numbers = list(re.finditer(r"\d+", listed))
    named: set[int] = set()
    for number, following in zip(numbers, [*numbers[1:], None], strict=True):
        value = int(number.group())
        if 1 <= value <= k:
            named.add(value)
        upper = int(following.group()) if following is not None else 0
        if following is not None and value < upper <= k and _RANGE_JOIN.match(listed[number.end() : following.start()]):
            named.update(range(max(value, 1), upper + 1))
    return named


def _assign(region: str, k: int) -> tuple[list[str], list[bool]]:
    """(k notes, k flags): each sentence goes to the passages its references name, else to those of the one before."""
    units: dict[int, list[str]] = {number: [] for number in range(1, k + 1)}
    mentioned = [False] * k
    references = list(_REFERENCE.finditer(region))
    if not references or k == 0:
        return [""] * k, mentioned
    starts = [ref.start() for ref in references]
    cuts = []
    for match in _BREAK.finditer(region):
        index = bisect.bisect_left(starts, match.end()) - 1  # the last reference starting before the break ends
        if index < 0 or references[index].end() <= match.start():
            cuts.append(match.end())
    current: set[int] = set()
    start = 0
    reference_index = 0
    for end in [*cuts, len(region)]:
        unit = _collapse(region[start:end])
        named: set[int] | None = None
        while reference_index < len(references) and references[reference_index].start() < end:
            named = (named or set()) | _referenced(references[reference_index], k)
            reference_index += 1
        if named is not None:
            current = named
            for number in named:
                mentioned[number - 1] = True
        if unit:
            for number in current:
                units[number].append(unit)
        start = end
    notes = [" ".join(units[number]) for number in range(1, k + 1)]
    return [note[: m.start()].rstrip() if (m := _ANSWER_MARKER.search(note)) else note for note in notes], mentioned


@dataclass(frozen=True)
class ParsedNotes:
    """
    A single-call Chain-of-Note reply split into [y_{d_1}, ..., y_{d_k}, y] (Yu et al., section 2.3): k `notes` in
    passage order, each on one line as written ("" for a passage no note names), the final `answer` y without its lead
    ("" for none), and k `mentioned` flags, True for a passage the notes name.
    """

    notes: list[str]
    answer: str
    mentioned: list[bool]


def parse_single_call(reply: str | None, k: int) -> ParsedNotes:
    """
    Read a single-call Chain-of-Note reply (Yu et al., section 2.3; Appendix A.5, Table 6 format): the reply is cut at a
    line starting a new prompt block; the last answer statement ("the answer is X", "Answer: X") is the answer; the
    rest goes, sentence by sentence, to the passages its references name ("Passage #1", "[1]", "#2-#4") or to those of
    the sentence before.

    :param reply: The model's reply; None for a failed call.
    :param k: The number of passages in the prompt (0: no notes, the answer is still read).
    :returns: A `ParsedNotes` with exactly k notes and k flags.
    :raises ValueError: If k < 0.
    """
    if k < 0:
        raise ValueError(f"`k` must not be negative, got {k}")
    if not reply:
        return ParsedNotes(notes=[""] * k, answer="", mentioned=[False] * k)
    text = _cut_continuation(_READING_NOTES_LABEL.sub("", reply, count=1))
    answer, region = _split_answer(text)
    notes, mentioned = _assign(region, k)
    return ParsedNotes(notes=notes, answer=answer, mentioned=mentioned)


def _read_label(text: str) -> str | None:
    """The note type a label names, or None: one distinct letter decides ("(b) irrelevant" is CONTEXT), else words."""
    letters = {letter.lower() for letter in _LABEL_PAREN_LETTER.findall(text)}
    if len(letters) > 1:
        return None
    if not letters and (bare := _LABEL_BARE_LETTER.match(text)):
        letters = {bare.group(1).lower()}
    if letters:
        return RELEVANCE_LABELS["abc".index(letters.pop())]
    if _LABEL_IRRELEVANT.search(text):
        return IRRELEVANT
    if _LABEL_NOT_DIRECT.search(text):
        return CONTEXT
    if _LABEL_DIRECT.search(text):
        return DIRECT
    if _LABEL_CONTEXT.search(text):
        return CONTEXT
    return None


def parse_document_note(reply: str | None) -> tuple[str, str | None]:
    """
    Read a per-document reply (Yu et al., section 2.3.1): (note, label). The label is read from the first "Relevance:"
    line or line of only a label ("(b) useful context"): DIRECT, CONTEXT, IRRELEVANT or None (no label, or none read).
    The note is the text before it (after it, when nothing comes before); "" for None.
    """
    if not reply:
        return "", None
    text = _cut_continuation(_READING_NOTES_LABEL.sub("", reply, count=1))
    relevance = _RELEVANCE_LINE.search(text)
    label_only = _LABEL_ONLY_LINE.search(text)
    if relevance is not None and (label_only is None or relevance.start() <= label_only.start()):
        start, end, label_text = relevance.start(), relevance.end(), relevance.group("label")
        if not label_text.strip():
            line_start = _non_blank(text, end)
            end = _line_end(text, line_start)
            label_text = text[line_start:end]
    elif label_only is not None:
        start, end, label_text = label_only.start(), label_only.end(), label_only.group()
    else:
        return _collapse(text), None
    before = _collapse(text[:start])
    note = before or _collapse(text[end:])
    return note, _read_label(label_text)


def _negative_only(note: str) -> bool:
    """Whether every statement of a note holds a negation (it only says what the passage lacks)."""
    negative = positive = False
    for statement in _SEGMENT_BREAK.split(_REFERENCE.sub(" ", note)):
        if _NEGATION.search(statement):
            negative = True
        elif normalize_answer(statement):
            positive = True
    return negative and not positive


def _contains_tokens(text: str, part: str) -> bool:
    """Whether the tokens of `part` occur consecutively among those of `text` (linear time)."""
    needle = " ".join(part.split())
    return bool(needle) and f" {needle} " in f" {' '.join(text.split())} "


def classify_note(note: str, answer: str, detector: UnknownDetector | None = None) -> str:
    """
    The note type of an unlabelled note (Yu et al., section 2.3.1), passage references left out: IRRELEVANT for an
    empty note or a verdict ("not relevant"); DIRECT when `answer` (no abstention) occurs in it (Table 6's note #2);
    IRRELEVANT when it only says what the passage lacks; else CONTEXT (Table 6's note #1).
    """
    detector = detector or UnknownDetector.from_patterns(None)
    normalized = normalize_answer(_REFERENCE.sub(" ", note))
    if not normalized or _IRRELEVANT_NOTE.search(note):
        return IRRELEVANT
    if answer and not detector.is_unknown(answer) and _contains_tokens(normalized, normalize_answer(answer)):
        return DIRECT
    if _negative_only(note):
        return IRRELEVANT
    return CONTEXT
