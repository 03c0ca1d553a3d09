"""
Chain-of-Note's reply parsers (Yu et al., sections 2.3-2.3.1, Appendix A.5-A.6): pure functions, no LLM calls.

`parse_single_call` splits a single-call reply (Table 6 format) into one note per passage and the answer;
`parse_document_note` reads a per-document note and its "Relevance:" label (section 2.3.1, Figure 2);
`classify_note` gives an unlabelled note its type. Passages are numbered from 1, as in the prompts.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from haystack_fusion.answers import TRIM_CHARACTERS, UnknownDetector, normalize_answer, trim_answer

DIRECT = "direct"
"""Note type (a) of section 2.3.1 / Figure 2(a): the passage answers the question directly."""

CONTEXT = "context"
"""Note type (b) of section 2.3.1 / Figure 2(b): the passage does not answer but gives useful context."""

IRRELEVANT = "irrelevant"
"""Note type (c) of section 2.3.1 / Figure 2(c): the passage is irrelevant to the question."""

RELEVANCE_LABELS: tuple[str, ...] = (DIRECT, CONTEXT, IRRELEVANT)
"""The three note types of section 2.3.1, in the paper's order (a), (b), (c)."""

_NON_BLANK = re.compile(r"\S")
"""The first character of a line's content."""

_ANSWER_TEXT = re.compile("[^\\s" + re.escape(TRIM_CHARACTERS + ".,;:") + "]")
"""A character that `_clean_answer` keeps: a text without one cleans to ""."""

_NUMBER = r"\d{1,6}(?!\d)"
_JOIN = r"\s*(?:,\s*(?:and\s+|or\s+|&\s*)?|and\s+|or\s+|&\s*|/\s*|-+\s*|[–—]\s*|to\s+|through\s+|thru\s+)"
_REFERENCE = re.compile(
    rf"\b(?:passages?|documents?|docs?|paragraphs?)\s*(?:(?:#|no\.?|number)\s*)?(?P<numbers>{_NUMBER}"
    rf"(?:{_JOIN}(?:#\s*)?{_NUMBER})*)"
    rf"|\[\s*(?P<bracket>{_NUMBER}(?:\s*(?:,|-|–|and)\s*{_NUMBER})*)\s*\]",
    re.IGNORECASE,
)
"""A reference to one or more passages: "Passage #1", "passage 1", "Document #2", "Wikipedia passage #3" (the word
before does not matter), "Passages #1 and #3", "Passages #1, #2, and #4", "Passages #2-#4" / "2 to 4" (a range),
"[1]", "[1, 3]". Numbers have at most 6 digits."""

_RANGE_JOIN = re.compile(r"^\s*(?:-+|[–—]|to|through|thru)\s*#?\s*$", re.IGNORECASE)
"""The text between two numbers of a reference that makes them a range ("#2-#4", "2 to 4")."""

_AFTER_EMPHASIS = r"(?<=[*_])(?:(?<![*_]{2})|(?![*_]))"
"""After a "*" or "_": the second character or the end of a run of them, where a label's "**" may start. Never further
inside the run: a match there would have started earlier in it, and trying each character costs quadratic time."""

_ANSWER_MARKER = re.compile(
    r"(?:(?<!\s)|(?!\s))"  # not from inside a run of whitespace
    r"(?:\b(?:based\s+on|according\s+to|considering)\b"
    r"(?:(?!(?:passages?|documents?|docs?|paragraphs?)\s*(?:(?:#|no\.?|number)\s*)?\d|\[\s*\d)[^\n.!?;]){0,150}?,\s*+)?"
    r"(?:,?\s*\b(?:so|thus|therefore|hence|overall|in\s+conclusion|in\s+summary)\b,?\s*|,\s*)?"
    r"(?:the\s+(?:(?:final|correct|short|best|most\s+likely)\s+)?answers?\s+(?:is|are|was|would\s+be|should\s+be)"
    r"\s*:?"
    rf"|(?:(?<![^\s>#(\[.!?;:,])|{_AFTER_EMPHASIS})[*_]*(?:(?:final|short|correct)\s+)?answer\s*(?:[*_]+\s*)?:[*_]*)",
    re.IGNORECASE,
)
"""The start of a final-answer statement: "the answer is" (optionally after Table 6's "Based on ..." lead-in or a
connective) or a label "Answer:" / "Final answer:" / "**Answer:**". A lead-in never spans a passage reference. Linear
time: no match starts inside a run of whitespace or of "*" / "_"."""

_CONTINUATION = re.compile(
    r"^[ \t*_#>]*(?:(?:question|task\s+description|reading\s+notes?)\s*(?:[*_]+\s*)?:|</?passage\b)",
    re.IGNORECASE | re.MULTILINE,
)
"""A line that starts a new prompt block ("Question:", "Task Description:", "Reading notes:", a passage delimiter):
a base model that runs on past its answer writes the next demonstration."""

_READING_NOTES_LABEL = re.compile(r"^\s*[*_]*reading\s+notes?\s*(?:[*_]+\s*)?:[*_]*", re.IGNORECASE)
"""An echo of the prompt's last line ("Reading notes:" / "Reading note:") at the start of a reply."""

_BREAK = re.compile(r"(?<=[.!?;])[\"'”’)\]]*\s+|\n")
"""Where one sentence or line of the notes ends and the next begins."""

_RELEVANCE_LINE = re.compile(
    rf"(?:(?<![^\s>#(\[])|{_AFTER_EMPHASIS})[*_]*(?:relevance(?:\s+label)?|label|note\s+type)[*_]*\s*[:=][*_]*[ \t]*"
    r"(?P<label>[^\n]*)",
    re.IGNORECASE,
)
"""The label line of a per-document note, "Relevance: (b) useful context", also "**Relevance:**", "Label:"; the label
is the rest of the line (or the next non-blank line when that is empty)."""

_CANONICAL_LABEL = r"(?:answers?\s+(?:the\s+question\s+)?directly|useful\s+context|irrelevant)"
_LABEL_ONLY_LINE = re.compile(
    rf"^[ \t*_>\-]*(?:(?:\(\s*[abc]\s*\)|[abc]\))(?:[ \t]*{_CANONICAL_LABEL})?|{_CANONICAL_LABEL})[ \t.*_]*$",
    re.IGNORECASE | re.MULTILINE,
)
"""A line that is only a label, without "Relevance:": "(b) useful context", "(c)", "Irrelevant."."""

_LABEL_PAREN_LETTER = re.compile(r"\(\s*([abc])\s*\)", re.IGNORECASE)
_LABEL_BARE_LETTER = re.compile(r"^[^\w(]*([abc])\s*(?:\)|[.:\-–—](?!\w)|$)", re.IGNORECASE)
"""A label letter without an opening parenthesis at the start of the label: "a)", "b.", "c", "B - useful context"."""

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
)
"""An explicit verdict that a passage is irrelevant (note type (c)): "irrelevant", "unrelated", "not relevant",
"isn't related", "nothing to do with", "no relevant information", "no information about the question". "not directly
relevant" is no such verdict: it describes type (b), "does not directly answer the query but provides useful
context" (section 2.3.1)."""

_SEGMENT_BREAK = re.compile(
    r"(?<![.!?;])[.!?;]+(?:\s+|$)|\b(?:but|however|although|though|while|whereas|yet|instead|except)\b",
    re.IGNORECASE,
)
"""Where a note's statements part: sentence ends and contrast words ("discusses X, but does not mention Y"). A run of
punctuation is tried from its first character only (from each one, a long run would take quadratic time)."""

_NEGATION = re.compile(
    r"\b(?:not|no|never|nor|neither|none|nothing|without|lacks?|lacking|fails?|cannot)\b|n't\b", re.IGNORECASE
)
"""A negation: a statement that holds one says what a passage lacks ("does not mention", "no information")."""


def _collapse(text: str) -> str:
    """`text` on one line: runs of whitespace become one space, no surrounding whitespace."""
    return " ".join(text.split())


def _clean_answer(text: str) -> str:
    """An answer as returned: whitespace collapsed, then `answers.trim_answer`."""
    return trim_answer(_collapse(text))


def _cut_continuation(text: str) -> str:
    """`text` up to the first `_CONTINUATION` line that has non-blank text before it (a prompt echo at the start
    stays)."""
    for match in _CONTINUATION.finditer(text):
        if text[: match.start()].strip():
            return text[: match.start()]
    return text


def _line_end(text: str, position: int) -> int:
    """The index of the line break ending the line at `position`, or len(text)."""
    end = text.find("\n", position)
    return len(text) if end < 0 else end


def _non_blank(text: str, position: int) -> int:
    """The index of the first non-whitespace character at or after `position`, or len(text)."""
    match = _NON_BLANK.search(text, position)
    return len(text) if match is None else match.start()


def _split_answer(text: str) -> tuple[str, str]:
    """
    Take the answer statements (`_ANSWER_MARKER` to the end of its line, or the next non-blank line when that is
    empty) out of a reply; the last non-empty answer wins.

    :returns: (answer or "", the reply with every answer statement replaced by a line break).
    """
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
        if start > position:
            pieces.append(text[position:start])
        pieces.append("\n")
        position = max(position, end)
    pieces.append(text[position:])
    return ("" if answer is None else _clean_answer(text[answer[0] : answer[1]])), "".join(pieces)


def _referenced(match: re.Match[str], k: int) -> set[int]:
    """
    The passage numbers in 1..k that one `_REFERENCE` match names; "#2-#4" is a range when it runs upwards within
    1..k, else each end counts on its own.
    """
    listed = match.group("numbers") or match.group("bracket") or ""
    numbers = list(re.finditer(r"\d+", listed))
    named: set[int] = set()
    for index, number in enumerate(numbers):
        value = int(number.group())
        if 1 <= value <= k:
            named.add(value)
        if index + 1 < len(numbers):
            following = numbers[index + 1]
            upper = int(following.group())
            if value < upper <= k and _RANGE_JOIN.match(listed[number.end() : following.start()]):
                named.update(range(max(value, 1), upper + 1))
    return named


def _assign(region: str, k: int) -> tuple[list[str], list[bool]]:
    """
    Split the note part of a reply into one note per passage: each sentence or line goes to the passages its
    references name, or to those of the sentence before it; a preamble is dropped.

    :returns: (k notes, "" for a passage never named; k flags, True for a passage some reference names).
    """
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
    notes = []
    for number in range(1, k + 1):
        note = " ".join(units[number])
        marker = _ANSWER_MARKER.search(note)
        notes.append(note[: marker.start()].rstrip() if marker else note)
    return notes, mentioned


@dataclass(frozen=True)
class ParsedNotes:
    """
    A single-call Chain-of-Note reply split into its segments [y_{d_1}, ..., y_{d_k}, y] (Yu et al., section 2.3).

    :param notes: k notes in passage order, each on one line as the model wrote it (its references included, as in
        Table 6's "Wikipedia passage #1 discusses ..."); "" for a passage no note names.
    :param answer: The final answer y, without the "the answer is" / "Answer:" lead and trailing period or quotes;
        "" when the reply gives none.
    :param mentioned: k flags in passage order: True when the notes name that passage.
    """

    notes: list[str]
    answer: str
    mentioned: list[bool]


def parse_single_call(reply: str | None, k: int) -> ParsedNotes:
    """
    Read a single-call Chain-of-Note reply: one note per passage and the final answer (Yu et al., section 2.3;
    Appendix A.5 instruction, Table 6 format).

    1. A leading "Reading notes:" echo is removed, and the reply is cut at a line that starts a new prompt block.
    2. Answer statements ("the answer is X", "Answer: X") are never part of a note; the last non-empty one wins.
    3. The rest goes, sentence by sentence, to the passages its references name ("Passage #1", "[1]", "#2-#4") or
       to those of the sentence before; numbers outside 1..k are ignored.

    :param reply: The model's reply to the single-call prompt; None for a failed call.
    :param k: The number of passages in the prompt; 0 is allowed (no notes, the answer is still read).
    :returns: A `ParsedNotes` with exactly k notes and k flags; all notes "" and all flags False when the reply names
        no passage.
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
    """
    The note type a label names: one distinct letter "(a)"/"(b)"/"(c)" decides ("(b) irrelevant" is CONTEXT; several
    name none); otherwise words, in order: irrelevant, not direct (CONTEXT), direct, context.

    :returns: DIRECT, CONTEXT, IRRELEVANT or None.
    """
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
    Read a per-document reply: the reading note on one passage and its relevance label (Yu et al., section 2.3.1).

    The label (Figure 2's "(a) answers directly", "(b) useful context", "(c) irrelevant") is the first "Relevance:"
    line or a line that is only a label; the note is the text before it (after it, when nothing comes before).

    :param reply: The model's reply to the per-document prompt; None for a failed call.
    :returns: (note, label): label is DIRECT, CONTEXT or IRRELEVANT, or None when the reply has no label line or its
        label cannot be read; note is "" for an empty reply.
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
    """Whether every statement of a note (cut at sentence ends and "but", "however", ...) holds a negation."""
    negative = positive = False
    for statement in _SEGMENT_BREAK.split(_REFERENCE.sub(" ", note)):
        if _NEGATION.search(statement):
            negative = True
        elif normalize_answer(statement):
            positive = True
    return negative and not positive


def _contains_tokens(text: str, part: str) -> bool:
    """True when the tokens of `part` occur consecutively, as whole tokens, among those of `text`."""
    needle = " ".join(part.split())
    # Tokens hold no space, so a match of " needle " in " haystack " starts and ends at token boundaries; `in` takes
    # linear time where comparing token lists at each position would take quadratic time.
    return bool(needle) and f" {needle} " in f" {' '.join(text.split())} "


def classify_note(note: str, answer: str, detector: UnknownDetector | None = None) -> str:
    """
    The note type of a reading note that carries no label, as in the single-call mode (Yu et al., section 2.3.1).

    Rules, in order, passage references left out:

    1. IRRELEVANT (type (c)) for an empty note or an explicit verdict ("not relevant", "no relevant information").
    2. DIRECT (type (a)) when the answer is no abstention and its normalized tokens occur in the note (Table 6's
       notes #2).
    3. IRRELEVANT when the note only reports what the passage lacks (Table 6's note #1, which also says what the
       passage is about, is type (b)).
    4. CONTEXT (type (b)) otherwise.

    :param note: One reading note, e.g. from `parse_single_call`.
    :param answer: The final answer of the reply; "" (or an abstention) when there is none, which rules out DIRECT.
    :param detector: The unknown detector; defaults to `UnknownDetector.from_patterns(None)`.
    :returns: DIRECT, CONTEXT or IRRELEVANT.
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
