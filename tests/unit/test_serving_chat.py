"""What a chat client sends, read for the strategies (`serving.chat`): content parts, background tasks, the chat before
the question, and the standalone question of a follow-up; the reading's time on huge and hostile chats, and its
results against the stripping rules read plainly (fuzzed)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import unicodedata
from pathlib import Path

import pytest
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage
from hypothesis import example, given
from hypothesis import strategies as st

from haystack_fusion.prompts import PROMPTS
from haystack_fusion.serving.chat import (
    MAX_TURN_CHARS,
    TASK_PREFIX,
    Chat,
    ChatRequestError,
    answer_task,
    digest,
    history_text,
    message_text,
    read_chat,
    refers_back,
    standalone_question,
    standalone_question_prompt,
    turn_text,
    without_attached_files,
    without_evidence,
    without_sources,
)
from haystack_fusion.strategies import Usage
from tests.unit.fuzz_settings import FUZZ

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "open_webui"


class RecordingGenerator(MockChatGenerator):
    """A MockChatGenerator that keeps the prompts it was sent."""

    def __init__(self, reply: str) -> None:
        super().__init__(response_fn=lambda messages: reply)
        self.prompts: list[str] = []

    def run(self, messages: list[ChatMessage], **kwargs):  # type: ignore[override]
        self.prompts.append(messages[-1].text or "")
        return super().run(messages=messages, **kwargs)

    async def run_async(self, messages: list[ChatMessage], **kwargs):  # type: ignore[override]
        return self.run(messages=messages, **kwargs)


class TestMessageText:
    def test_a_string(self):
        assert message_text({"role": "user", "content": "Who?"}) == "Who?"

    def test_text_parts_are_joined(self):
        parts = [{"type": "text", "text": "Who wrote"}, {"type": "text", "text": "Hamlet?"}]
        assert message_text({"role": "user", "content": parts}) == "Who wrote\nHamlet?"

    def test_no_content(self):
        assert message_text({"role": "assistant", "content": None}) == ""

    def test_other_parts_are_named(self):
        parts = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "data:,"}}]
        with pytest.raises(ChatRequestError, match=r"content parts of type image_url are not supported"):
            message_text({"role": "user", "content": parts})

    def test_content_of_another_type(self):
        with pytest.raises(ChatRequestError, match="must be a string or a list of text parts, got dict"):
            message_text({"role": "user", "content": {"text": "Who?"}})


class TestReadChat:
    def test_first_turn(self):
        assert read_chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who?"}]) == Chat(
            question="Who?"
        )

    def test_a_follow_up_keeps_the_turns_without_this_servers_evidence(self):
        answer = 'A strategy.\n\n<details type="evidence" done="true">\n<summary>Sources</summary>\n[1] x\n</details>'
        chat = read_chat(
            [
                {"role": "user", "content": "What is Chain-of-Note?"},
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "How many LLM calls does it make?"},
            ]
        )
        assert chat.history == (("user", "What is Chain-of-Note?"), ("assistant", "A strategy."))
        assert chat.follow_up
        assert not chat.task

    def test_a_plain_reply_loses_its_sources(self):
        assert turn_text("Paris\n\nSources:\n[1] Paris: Paris is ...") == "Paris"

    def test_a_long_turn_is_cut(self):
        assert len(turn_text("word " * 1000)) <= MAX_TURN_CHARS

    def test_a_background_task(self):
        chat = read_chat([{"role": "user", "content": f"{TASK_PREFIX}\nGenerate a title.\n<chat_history>..."}])
        assert chat.task
        assert not chat.follow_up

    def test_a_task_prompt_that_quotes_no_chat_is_a_question(self):
        """Open WebUI's RAG template starts as a task does, but wraps a question."""
        assert not read_chat([{"role": "user", "content": f"{TASK_PREFIX}\nRespond to the user query."}]).task

    def test_the_list_of_attached_files_is_no_part_of_the_question(self):
        files = '<attached_files>\n<file type="file" id="1" name="notes.txt"/>\n</attached_files>\n\n'
        assert read_chat([{"role": "user", "content": files + "What does this say?"}]).question == "What does this say?"
        with pytest.raises(ChatRequestError, match="holds no text"):
            read_chat([{"role": "user", "content": files}])

    @pytest.mark.parametrize(
        ("messages", "message"),
        [
            ([], "must end with a user message"),
            ([{"role": "assistant", "content": "Hi"}], "must end with a user message"),
            ([{"role": "user", "content": "  "}], "holds no text"),
            ([{"role": "user", "content": []}], "holds no text"),
            ([{"role": "user", "content": "\x00"}], "holds no text"),
            ([{"role": "user", "content": "\x00\x00\n\x1b\x7f \u200b\ufeff"}], "holds no text"),
            ([{"role": "user", "content": "<attached_files>\n</attached_files>\n\x00"}], "holds no text"),
        ],
    )
    def test_what_cannot_be_answered(self, messages, message):
        with pytest.raises(ChatRequestError, match=message):
            read_chat(messages)

    @pytest.mark.skipif(not FIXTURES.is_dir(), reason="the Open WebUI request fixtures")
    def test_the_requests_open_webui_sends(self):
        """Open WebUI's own requests (tests/fixtures/open_webui): tasks are tasks, questions are questions."""
        bodies = {path.stem: json.loads(path.read_text())["body"] for path in FIXTURES.glob("*.json")}
        assert len(bodies) >= 10
        with pytest.raises(ChatRequestError, match="content parts of type image_url"):
            read_chat(bodies.pop("image_question")["messages"])
        for name, body in bodies.items():
            chat = read_chat(body["messages"])
            assert chat.task == ("task" in name), name
            assert chat.follow_up == (name == "follow_up"), name
            if not chat.task:
                assert "<attached_files>" not in chat.question
                assert "<details" not in " ".join(text for _, text in chat.history)
        assert read_chat(bodies["file_question"]["messages"]).question == "What does this say?"


MIB = 2**20
HANG_GUARD = 2.0
"""Seconds a read of a 1 MiB chat may take here: it takes milliseconds; backtracking patterns took minutes."""


def timed_read(messages: list[dict]) -> tuple[Chat, float]:
    """`read_chat(messages)` and the seconds it took."""
    start = time.perf_counter()
    chat = read_chat(messages)
    return chat, time.perf_counter() - start


def follow_up(earlier: str, question: str = "And then?") -> list[dict]:
    """A chat whose one earlier assistant turn is `earlier`."""
    return [
        {"role": "user", "content": "Who?"},
        {"role": "assistant", "content": earlier},
        {"role": "user", "content": question},
    ]


class TestReadingTakesLinearTime:
    """Chats shaped to make a backtracking pattern take time quadratic in their size are read in milliseconds."""

    def test_an_earlier_turn_of_80_000_newlines(self):
        chat, seconds = timed_read(follow_up("Paris" + "\n" * 80_000 + "Sources:\n[1] Paris: the capital"))
        assert chat.history == (("user", "Who?"), ("assistant", "Paris"))
        assert seconds < HANG_GUARD

    def test_a_1_mib_chat_of_500_000_newlines(self):
        messages = follow_up("\n" * 500_000, question="\n" * 24_000 + "Who?")
        assert len(json.dumps({"messages": messages})) > 1_000_000
        chat, seconds = timed_read(messages)
        assert chat.history == (("user", "Who?"),)
        assert chat.question.strip() == "Who?"
        assert seconds < HANG_GUARD

    @pytest.mark.parametrize(
        "unit",
        [
            "\n",
            " \n\t",
            "<details",
            "<details>",
            "<details x=1>\n",
            "<DETAILS ",
            "</details>",
            "Sources:\n",
            "\nSources:\n",
            "\n \nSources: ",
            "\n\nSources:",
            "<attached_files>",
            "<attached_files>\n",
            "</attached_files>",
            "x",
            "\x00",
        ],
    )
    @pytest.mark.parametrize("where", ["earlier turn", "question"])
    def test_a_1_mib_repetition(self, unit, where):
        text = unit * (MIB // len(unit))
        if where == "earlier turn":
            chat, seconds = timed_read(follow_up(text))
            assert all(len(turn) <= MAX_TURN_CHARS for _, turn in chat.history)
        else:
            chat, seconds = timed_read(follow_up("Paris", question=text + "?"))
            assert chat.question.endswith("?")
        assert seconds < HANG_GUARD

    @pytest.mark.parametrize("question", ["\x00" * MIB, "\u200b" * MIB, " " * MIB])
    def test_a_1_mib_question_that_shows_nothing_is_refused_at_once(self, question):
        start = time.perf_counter()
        with pytest.raises(ChatRequestError, match="holds no text"):
            read_chat([{"role": "user", "content": question}])
        assert time.perf_counter() - start < HANG_GUARD

    def test_unclosed_tags_and_a_sources_line_without_a_newline_before_it_stay(self):
        text = "<details open>a <attached_files> b</DETAILS>c\nSources: d\nSources:\ne"
        assert turn_text(text) == "c Sources: d"
        assert turn_text("<details\n" + "x" * 600) == "<details " + "x" * 487 + " ..."
        assert turn_text("Sources:\n[1] Paris") == "Sources: [1] Paris"
        chat = read_chat([{"role": "user", "content": "<attached_files> x\n<attached_files>y</attached_files>\n z"}])
        assert chat.question == "z"


REFERENCE_ATTACHED_FILES = re.compile(r"<attached_files>.*?</attached_files>\s*", re.DOTALL)
REFERENCE_EVIDENCE = re.compile(r"<details\b[^>]*>.*?</details>", re.DOTALL | re.IGNORECASE)
REFERENCE_SOURCES = re.compile(r"\n\s*Sources:\n.*\Z", re.DOTALL)
"""The stripping rules read plainly, with lazy groups: easy to check by eye, quadratic in runs of their markers."""


def reference_turn_text(text: str) -> str:
    text = " ".join(REFERENCE_SOURCES.sub("", REFERENCE_EVIDENCE.sub("", text)).split())
    return text if len(text) <= MAX_TURN_CHARS else text[: MAX_TURN_CHARS - 4].rstrip() + " ..."


def reference_read_chat(messages: list[dict]) -> Chat | None:
    """`read_chat` by the reference rules on the chats `chats` makes (None: refused as holding no question)."""
    question = REFERENCE_ATTACHED_FILES.sub("", messages[-1]["content"])
    if not any(not char.isspace() and unicodedata.category(char) not in ("Cc", "Cf") for char in question):
        return None
    if question.lstrip().startswith(TASK_PREFIX) and "<chat_history>" in question:
        return Chat(question=question, task=True)
    turns = ((message["role"], reference_turn_text(message["content"])) for message in messages[:-1])
    return Chat(question=question, history=tuple((role, text) for role, text in turns if text))


CHAT_PIECES = (
    "\n", "\n\n", " ", "\t", "\r\n", "\u2028", "\x00", "\x1b", "\u200b", "a", "b", "Z", "Paris", "?",
    "<details>", "<details open>", '<details type="evidence" done="true">\n', "<DETAILS", "<detailsx>", "<detaİls>",
    "</details>", "</DETAILS>", "</details", ">", "<summary>Sources</summary>\n[1] x\n",
    "Sources:\n", "Sources:", "Sources: ", "sources:\n", "\nSources:\n[1] Paris",
    "<attached_files>", "</attached_files>", "<attached_files>\n", '<file name="a.txt"/>', "</attached_files>\n\n",
    TASK_PREFIX, "<chat_history>", "lorem ipsum dolor " * 12,
)  # fmt: skip
"""What the stripping rules turn on: the evidence block's tags in any case (`İ` folds to `i`), "Sources:" lines with
and without their newlines, attached files lists, whitespace, NUL, zero-width spaces, words, and a long phrase that
makes a turn longer than `MAX_TURN_CHARS`."""

piece_texts = st.lists(st.sampled_from(CHAT_PIECES), max_size=30).map("".join)
run_texts = st.builds(
    lambda head, unit, count, tail: head + unit * count + tail,
    head=piece_texts,
    unit=st.sampled_from(CHAT_PIECES),
    count=st.integers(0, 200),
    tail=piece_texts,
)
"""Runs of one piece (what makes the reference patterns backtrack) between mixes of pieces."""
chat_texts = st.one_of(piece_texts, run_texts, st.text(alphabet=st.sampled_from("\n <>/detailsS:\x00x"), max_size=40))
chats = st.lists(chat_texts, min_size=1, max_size=5).map(
    lambda texts: [
        {"role": "user" if (len(texts) - index) % 2 else "assistant", "content": text}
        for index, text in enumerate(texts)
    ]
)
"""Chats that end with a user message, turns alternating back from it."""

huge_chat_texts = st.lists(
    st.tuples(st.sampled_from(CHAT_PIECES), st.integers(10_000, 200_000)), min_size=1, max_size=6
).map(lambda runs: "".join(piece * max(1, size // len(piece)) for piece, size in runs))
"""10,000 to 1.2 million characters: runs of pieces, each of 10,000 to 200,000 characters."""


class TestReadChatFuzz:
    """
    `read_chat` against the stripping rules read plainly (the reference patterns) on small chats, and its time on
    large ones. Runs the fuzz profile of `fuzz_settings.py` ("fuzz-ci" in CI); `FUZZ_PROFILE=fuzz-10k` runs 10,000.
    """

    @FUZZ
    @given(messages=chats)
    @example(messages=[{"role": "assistant", "content": "x\n \nSources:\n"}, {"role": "user", "content": "?"}])
    @example(messages=[{"role": "user", "content": "<attached_files></attached_files>\x00\u200b"}])
    def test_reads_what_the_reference_reads(self, messages):
        expected = reference_read_chat(messages)
        if expected is None:
            with pytest.raises(ChatRequestError, match="holds no text"):
                read_chat(messages)
        else:
            assert read_chat(messages) == expected

    @FUZZ
    @given(text=chat_texts)
    def test_each_rule_strips_what_its_reference_strips(self, text):
        assert without_evidence(text) == REFERENCE_EVIDENCE.sub("", text)
        assert without_sources(text) == REFERENCE_SOURCES.sub("", text)
        assert without_attached_files(text) == REFERENCE_ATTACHED_FILES.sub("", text)
        assert turn_text(text) == reference_turn_text(text)

    @FUZZ
    @given(earlier=huge_chat_texts, question=huge_chat_texts)
    def test_time_grows_at_most_linearly(self, earlier, question):
        """Generous bounds (5 microseconds a character and 50 ms; the read takes a few hundredths of a microsecond a
        character): a pattern that backtracks takes seconds on a run of 100,000 newlines."""
        messages = [*follow_up(earlier)[:2], {"role": "user", "content": question + "?"}]
        size = len(earlier) + len(question)
        start = time.perf_counter()
        chat = read_chat(messages)
        assert time.perf_counter() - start < 0.05 + 5e-6 * size
        assert all(len(text) <= MAX_TURN_CHARS for _, text in chat.history)


class TestHistoryText:
    def test_lines(self):
        assert history_text([("user", "Who?"), ("assistant", "Rollo")]) == "User: Who?\nAssistant: Rollo"

    def test_the_latest_turns_fit(self):
        history = [("user", f"question {i} " + "x" * 80) for i in range(100)]
        text = history_text(history, max_chars=500)
        assert len(text) <= 500
        assert text.endswith(history[-1][1])

    @given(st.lists(st.tuples(st.sampled_from(["user", "assistant"]), st.text()), max_size=20), st.integers(1, 3000))
    def test_never_longer_than_asked(self, history, max_chars):
        assert len(history_text(history, max_chars=max_chars)) <= max_chars


class TestDigest:
    def test_length_and_hash(self):
        assert digest("Who?").startswith("4 characters, sha256 ")

    def test_any_text(self):
        assert digest("\ud800</passage>").startswith("11 characters, sha256 ")


class TestStandaloneQuestion:
    HISTORY = (("user", "What is Chain-of-Note?"), ("assistant", "A strategy that writes a note per passage."))

    def test_one_call_and_its_usage(self):
        llm = RecordingGenerator(" How many LLM calls does Chain-of-Note make?\nmore")
        question, usage = asyncio.run(standalone_question(llm, self.HISTORY, "How many LLM calls does it make?"))
        assert question == "How many LLM calls does Chain-of-Note make?"
        assert (usage.calls, usage.rounds) == (1, 1)
        assert len(llm.prompts) == 1
        assert "User: What is Chain-of-Note?\nAssistant: A strategy" in llm.prompts[0]
        assert llm.prompts[0].endswith("Last question: How many LLM calls does it make?\nStandalone question:")

    def test_a_rewrite_that_still_refers_back_gets_the_previous_question(self):
        llm = RecordingGenerator("How many LLM calls does it make?")  # a small model's unchanged question
        question, usage = asyncio.run(standalone_question(llm, self.HISTORY, "How many LLM calls does it make?"))
        assert question == "What is Chain-of-Note? How many LLM calls does it make?"
        assert usage.calls == 1

    @pytest.mark.parametrize(
        ("rewrite", "expected"),
        [
            ("How many LLM calls does it make?", True),
            ("How many LLM calls does Chain-of-Note make?", False),  # named the subject
            ("How many LLM calls are made?", False),  # nothing refers back
            ("Does Chain-of-Note write a note per passage? Is it slow?", False),
        ],
    )
    def test_refers_back(self, rewrite, expected):
        assert refers_back(rewrite, "How many LLM calls does it make?", self.HISTORY) is expected

    def test_no_history_no_call(self):
        llm = RecordingGenerator("unused")
        assert asyncio.run(standalone_question(llm, (), "Who?")) == ("Who?", Usage())
        assert llm.prompts == []

    @pytest.mark.parametrize("reply", ["", "\n\n", "x" * 50])
    def test_an_empty_or_too_long_reply_keeps_the_question(self, reply):
        question, usage = asyncio.run(
            standalone_question(RecordingGenerator(reply), self.HISTORY, "Why?", max_chars=20)
        )
        assert question == "Why?"
        assert usage.calls == 1

    def test_chat_text_is_no_template(self):
        messages = standalone_question_prompt((("user", "{{ query }} {% if 1 %}x{% endif %}"),), "{{ history }}")
        assert "User: {{ query }} {% if 1 %}x{% endif %}" in messages[0].text
        assert "Last question: {{ history }}" in messages[0].text

    def test_the_prompt_is_registered(self):
        assert PROMPTS["standalone_question"].stop == ("\n",)


def test_a_task_is_one_plain_call():
    llm = RecordingGenerator('Here it is: {"title": "Chain-of-Note"} as asked')
    text, usage = asyncio.run(answer_task(llm, f"{TASK_PREFIX}\nGenerate a title."))
    assert text == '{"title": "Chain-of-Note"}'
    assert usage.calls == 1
    assert llm.prompts == [f"{TASK_PREFIX}\nGenerate a title."]


@pytest.mark.parametrize("reply", ["", "Chain-of-Note", "{not json}", "[1, 2]", "} {"])
def test_a_task_reply_without_a_json_object_is_an_empty_object(reply):
    """Open WebUI's tasks fail on a reply with no text; `{}` makes each fall back to its default."""
    assert asyncio.run(answer_task(RecordingGenerator(reply), f"{TASK_PREFIX}\nGenerate tags."))[0] == "{}"
