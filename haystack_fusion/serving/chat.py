"""A chat request read for the strategies (question, earlier turns, background tasks), and the one LLM call that
turns a follow-up into a standalone question."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from haystack.dataclasses import ChatMessage

from haystack_fusion.answers import has_visible_text
from haystack_fusion.llm import reply_usage, stop_kwargs
from haystack_fusion.prompts import PROMPTS, render
from haystack_fusion.strategies.record import Usage

TASK_PREFIX = "### Task:"  # Open WebUI's background task prompts (title, tags, follow-ups, queries)
TASK_HISTORY_TAG = "<chat_history>"  # every such task quotes the chat in it; its RAG template does not
MAX_HISTORY_CHARS = 2000  # of the chat (the latest turns) the standalone-question prompt quotes
MAX_TURN_CHARS = 500  # of one earlier turn (`turn_text`)

# Open WebUI's attached-file lists and this server's `<details>` block and "Sources:" tail, each found in one pass
# (no backtracking quantifier): reading a chat is linear in its size.
_FILES_OPEN = "<attached_files>"
_FILES_CLOSE = "</attached_files>"
_EVIDENCE_OPEN = re.compile(r"<details\b", re.IGNORECASE)
_EVIDENCE_CLOSE = re.compile(r"</details>", re.IGNORECASE)
_SOURCES_TAIL = re.compile(r"(?<!\s)[^\S\n]*+(\n)\s*+Sources:\n")  # group 1: where the tail starts
_NOT_SPACE = re.compile(r"\S")
_WORD = re.compile(r"\S+")


class ChatRequestError(ValueError):
    """A chat request the wrappers cannot answer as sent (HTTP 400)."""


@dataclass(frozen=True)
class Chat:
    """The last user message's text, the earlier turns as (role, `turn_text`) oldest first, and whether it is a
    background task."""

    question: str
    history: tuple[tuple[str, str], ...] = ()
    task: bool = False

    @property
    def follow_up(self) -> bool:
        """Whether the question follows earlier turns (`standalone_question`)."""
        return bool(self.history) and not self.task


def message_text(message: Mapping[str, Any]) -> str:
    """A message's `content` string or text parts joined with newlines. :raises ChatRequestError: For other content."""
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise ChatRequestError(
            f"a message's `content` must be a string or a list of text parts, got {type(content).__name__}"
        )
    texts, others = [], []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
        if kind == "text" and isinstance(part.get("text"), str):  # type: ignore[union-attr]
            texts.append(part["text"])  # type: ignore[index]
        else:
            others.append(str(kind))
    if others:
        raise ChatRequestError(
            f"this server reads text only: message content parts of type {', '.join(sorted(set(others)))} "
            "are not supported"
        )
    return "\n".join(texts)


def without_attached_files(text: str) -> str:
    """`text` without Open WebUI's closed `<attached_files>` lists and the whitespace after each."""
    pieces, position = [], 0
    while (start := text.find(_FILES_OPEN, position)) >= 0:
        end = text.find(_FILES_CLOSE, start + len(_FILES_OPEN))
        if end < 0:
            break  # no later opening has a closing tag after it either
        pieces.append(text[position:start])
        after = _NOT_SPACE.search(text, end + len(_FILES_CLOSE))
        position = len(text) if after is None else after.start()
    return "".join(pieces) + text[position:] if pieces else text


def without_evidence(text: str) -> str:
    """`text` without this server's `<details ...>...</details>` evidence blocks (any case)."""
    pieces, position = [], 0
    while (opening := _EVIDENCE_OPEN.search(text, position)) is not None:
        tag_end = text.find(">", opening.end())
        closing = _EVIDENCE_CLOSE.search(text, tag_end + 1) if tag_end >= 0 else None
        if closing is None:
            break  # no later opening has a `>` and a closing tag after it either
        pieces.append(text[position : opening.start()])
        position = closing.end()
    return "".join(pieces) + text[position:] if pieces else text


def without_sources(text: str) -> str:
    """`text` up to the "Sources:" tail this server appends to an unstreamed reply."""
    tail = _SOURCES_TAIL.search(text)
    return text if tail is None else text[: tail.start(1)]


def collapsed(text: str, max_chars: int) -> str:
    """`text`'s words joined with single spaces, up to the first word past `max_chars` characters."""
    words, size = [], -1
    for word in _WORD.finditer(text):
        words.append(word.group())
        size += 1 + len(words[-1])
        if size > max_chars:
            break
    return " ".join(words)


def turn_text(text: str) -> str:
    """An earlier turn without this server's evidence and sources, whitespace collapsed, at most `MAX_TURN_CHARS`
    characters (a cut one ends with " ...")."""
    text = collapsed(without_sources(without_evidence(text)), MAX_TURN_CHARS)
    return text if len(text) <= MAX_TURN_CHARS else text[: MAX_TURN_CHARS - 4].rstrip() + " ..."


def read_chat(messages: Sequence[Mapping[str, Any]]) -> Chat:
    """Read a chat request's messages (oldest first). :raises ChatRequestError: If the last is not a user message with
    visible text, or content parts are not text."""
    if not messages or not isinstance(messages[-1], Mapping) or messages[-1].get("role") != "user":
        raise ChatRequestError("`messages` must end with a user message holding the question")
    question = without_attached_files(message_text(messages[-1]))
    if not has_visible_text(question):
        raise ChatRequestError(
            "the last user message holds no text (only whitespace or control characters): send the question as its "
            "content"
        )
    if question.lstrip().startswith(TASK_PREFIX) and TASK_HISTORY_TAG in question:
        return Chat(question=question, task=True)
    history = []
    for message in messages[:-1]:
        role = message.get("role") if isinstance(message, Mapping) else None
        if role in ("user", "assistant"):
            text = turn_text(message_text(message))
            if text:
                history.append((str(role), text))
    return Chat(question=question, history=tuple(history))


def history_text(history: Sequence[tuple[str, str]], *, max_chars: int = MAX_HISTORY_CHARS) -> str:
    """A "User: ..." or "Assistant: ..." line per turn, the latest that fit in `max_chars` characters."""
    lines: list[str] = []
    size = 0
    for role, text in reversed(history):
        line = f"{'User' if role == 'user' else 'Assistant'}: {' '.join(text.split())}"
        if size + len(line) > max_chars:
            room = max_chars - size
            if room > 20:
                lines.append("... " + line[len(line) - room + 4 :])
            break
        lines.append(line)
        size += len(line) + 1
    return "\n".join(reversed(lines))


def digest(text: str) -> str:
    """A user's text in a log line: "412 characters, sha256 1a2b3c4d5e6f"."""
    data = text.encode("utf-8", "surrogatepass")
    return f"{len(text)} characters, sha256 {hashlib.sha256(data).hexdigest()[:12]}"


def standalone_question_prompt(history: Sequence[tuple[str, str]], question: str) -> list[ChatMessage]:
    """The `standalone_question` prompt for a follow-up."""
    return render(PROMPTS["standalone_question"], history=history_text(history), query=" ".join(question.split()))


async def standalone_question(
    chat_generator: Any, history: Sequence[tuple[str, str]], question: str, *, max_chars: int | None = None
) -> tuple[str, Usage]:
    """The standalone question and its call's usage: a follow-up rewritten with one LLM call (none for an empty
    `history`; an empty or too long reply keeps the question; one that `refers_back` gets the previous one first)."""
    if not history:
        return question, Usage()
    kwargs = stop_kwargs(chat_generator, PROMPTS["standalone_question"].stop)
    reply = await _one_call(chat_generator, standalone_question_prompt(history, question), generation_kwargs=kwargs)
    usage = Usage.of({**reply_usage(reply), "rounds": 1})
    rewrite = PROMPTS["standalone_question"].extract_answer(reply.text if reply is not None else None)
    if not rewrite or (max_chars is not None and len(rewrite) > max_chars):
        rewrite = question
    if refers_back(rewrite, question, history):
        previous = next((text for role, text in reversed(history) if role == "user"), "")
        with_context = f"{previous} {rewrite}".strip()
        if max_chars is None or len(with_context) <= max_chars:
            return with_context, usage
    return rewrite, usage


# Words by which a question refers back to the chat instead of naming its subject
REFERRING_WORDS = frozenset("it its itself they them their he him his she her this these those there".split())  # noqa: SIM905


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def refers_back(rewrite: str, asked: str, history: Sequence[tuple[str, str]]) -> bool:
    """Whether a rewrite holds a `REFERRING_WORDS` word and brings in no chat word the question as asked lacked."""
    words = _words(rewrite)
    if not words & REFERRING_WORDS:
        return False
    chat_words = set().union(*(_words(text) for _, text in history)) if history else set()
    return not (words - _words(asked)) & chat_words


async def _one_call(chat_generator: Any, messages: list[ChatMessage], **kwargs: Any) -> ChatMessage | None:
    replies = (await chat_generator.run_async(messages=messages, **kwargs)).get("replies") or []
    return replies[0] if replies else None


async def answer_task(chat_generator: Any, prompt: str) -> tuple[str, Usage]:
    """A background task answered with one plain LLM call: the reply's JSON object (`{}` for none), usage."""
    reply = await _one_call(chat_generator, [ChatMessage.from_user(prompt)])
    text = (reply.text or "") if reply is not None else ""
    candidate = text[text.find("{") : text.rfind("}") + 1] if "{" in text else ""
    try:
        answer = candidate if isinstance(json.loads(candidate), dict) else "{}"
    except ValueError:
        answer = "{}"
    return answer, Usage.of(reply_usage(reply))
