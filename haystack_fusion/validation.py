"""
Validation of what goes in and what comes out: the question (`validate_query`, before any LLM call) and the answers
(`check_answer`, wherever an answer is read from a reply). A reply can hold text with an answer's shape that is not an
answer: passage markup (a delimiter, key or label of `prompts.format_passages`'s block, which small models echo), a
copied demonstration (Liu et al., Figure 7's "1925"; Yu et al., Table 6's "1996") that no passage contains, an
enumeration of bare labels (`(i) (ii) (iii)`), or a repeat of the question.

A rejected answer is not an abstention: components return an empty answer whose `meta` says
`answer_source="invalid"` with the reason and the rejected text (`invalid_answer`), and the evaluation counts it apart
from "unknown".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from haystack.dataclasses import GeneratedAnswer

from haystack_fusion.answers import normalize_answer, trim_answer

INVALID = "invalid"
"""The `answer_source` of a rejected answer (`meta["answer_source"]`)."""

PASSAGE_MARKUP = "passage markup"
"""Reason: the answer holds a passage delimiter, key or label."""
DEMONSTRATION = "demonstration answer"
"""Reason: the answer is a demonstration's answer that the passages do not contain."""
EMPTY_ENUMERATION = "empty enumeration"
"""Reason: the answer is only list labels."""
REPEATS_QUESTION = "repeats the question"
"""Reason: the answer is only words of the question (`repeats_question`)."""

REASONS: tuple[str, ...] = (PASSAGE_MARKUP, DEMONSTRATION, EMPTY_ENUMERATION, REPEATS_QUESTION)
"""Every reason `check_answer` gives, in the order it checks them."""

_MARKUP = re.compile(r"</?\s*passage\b|\bpassage\s+key\b|\bkey\s*=\s*[\"']|^\[\d{1,3}\]$|^passage\s*#\s*\d{1,3}\b")
"""Fragments of the passage block's markup, searched in the lowercased answer: the tags, their `key="..."`, a bare
`[i]` label or a leading `Passage #i`. Linear time: no nested quantifiers."""

_KEY = re.compile(r"[0-9a-f]{8}")
"""A delimiter key (`prompts.passage_key`: 8 hex digits); as an answer it counts as markup unless all digits."""

_ENUMERATOR = re.compile(r"\(?(?:[ivxlcdm]{1,8}|[a-z]|\d{1,3})\)")
"""One list label: `(i)`, `ii)`, `(a)`, `(3)`."""
_FILLER = frozenset({"…", "...", "..", "-", "–", "—", ",", ";", "and", "etc", "etc."})
"""Tokens an empty enumeration may hold besides its labels (`(i) (ii) … (xxi)`)."""


def is_passage_markup(answer: str) -> bool:
    """Whether an answer is or holds passage markup: a delimiter tag or fragment, a bare 8-hex-digit key with a letter,
    `[i]` or `Passage #i ...`."""
    text = answer.strip().lower()
    if _MARKUP.search(text):
        return True
    token = trim_answer(text)
    return len(token) == 8 and _KEY.fullmatch(token) is not None and not token.isdigit()


def is_empty_enumeration(answer: str) -> bool:
    """Whether an answer is only list labels (`(i) (ii)`, `(a) (b)`) and filler ("…", ",", "and"), with one label at
    least."""
    labels = 0
    for token in answer.lower().replace(",", " , ").split():
        if _ENUMERATOR.fullmatch(token.rstrip(".,;:")):
            labels += 1
        elif token not in _FILLER:
            return False
    return labels > 0


def copies_demonstration(answer: str, demonstrations: Iterable[str], passages: Iterable[str]) -> bool:
    """
    Whether an answer is a demonstration's answer that the passages do not contain.

    Compared after `answers.normalize_answer`; a passage contains the answer when its normalized text holds it as a
    whole-word phrase.
    """
    key = normalize_answer(answer)
    if not key or key not in {normalize_answer(demo) for demo in demonstrations}:
        return False
    return not any(f" {key} " in f" {normalize_answer(text)} " for text in passages)


def repeats_question(answer: str, question: str) -> bool:
    """
    Whether an answer only repeats words of the question, so it says nothing the question did not.

    Compared word by word after `answers.normalize_answer`. The answer repeats the question when

    1. it has at least two words (a one-word answer found in the question is often the answer: "Paris" for "Is the
       capital Paris or Lyon?"; "yes", "no" and "unknown" never count);
    2. every one of its words occurs in the question, in any order; and
    3. it is not one of the question's alternatives: an answer without "or" that holds a word next to an "or" of the
       question is a choice ("Jane Austen" for "Was it written by Jane Austen or Charlotte Bronte?").

    What the rule cannot tell: an answer rightly made of the question's words ("polynomial time" for "What
    measurement of time is used in polynomial time reduction?", 2 of the 467 gold answers of our SQuAD 2.0 subset),
    and the first of three or more alternatives answered with two or more words; both count as repeats.

    :param answer: The answer as read from the reply.
    :param question: The question it answers.
    :returns: True when the answer repeats the question by the rule above.
    """
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

    ### Usage example
    ```python
    from haystack_fusion.validation import check_answer

    check_answer('<passage key="1c6071d9">')  # 'passage markup'
    check_answer("1925", demonstrations=["1925"], passages=["Tom was born in 1931."])  # 'demonstration answer'
    check_answer("(i) (ii) (iii)")  # 'empty enumeration'
    check_answer("post-fusion answer with", question="What does post-fusion answer with?")  # 'repeats the question'
    check_answer("Paris", question="Is the capital Paris or Lyon?")  # None
    check_answer("Paris")  # None
    ```

    :param answer: The answer text; None or empty is not checked (an abstention or a failed call).
    :param question: The question; None or empty skips the repeat rule.
    :param demonstrations: The few-shot answers of the prompt that produced the answer; empty skips that rule.
    :param passages: The passage texts that prompt showed.
    :returns: The reason (`PASSAGE_MARKUP`, `DEMONSTRATION`, `EMPTY_ENUMERATION` or `REPEATS_QUESTION`) the answer is
        rejected, or None when it is valid.
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


def validate_query(query: str) -> str:
    """
    Check a question before any LLM call.

    :param query: The question.
    :returns: The question, stripped.
    :raises ValueError: If the question is not a string, is empty or only whitespace, or is not valid Unicode text
        (a lone surrogate such as `\\ud800`, which no UTF-8 encoder, tokenizer or HTTP client accepts), naming the
        position of the first bad character.
    """
    if not isinstance(query, str) or not query.strip():
        raise ValueError(f"`query` must be a non-empty question, got {query!r}")
    try:
        query.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"`query` is not valid Unicode text: a lone surrogate at character {error.start}") from None
    return query.strip()


def invalid_answer(answer: GeneratedAnswer, reason: str) -> GeneratedAnswer:
    """The empty answer (same query and documents) replacing a rejected one, its `meta` extended by `invalid_meta`."""
    meta = {**answer.meta, **invalid_meta(answer.data or "", reason)}
    return GeneratedAnswer(data="", query=answer.query, documents=answer.documents, meta=meta)


def is_invalid(meta: dict[str, Any] | None) -> bool:
    """Whether an answer's (or an evaluation record's evidence's) `answer_source` says it was rejected."""
    return bool(meta) and meta.get("answer_source") == INVALID  # type: ignore[union-attr]
