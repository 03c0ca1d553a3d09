"""
The real Open WebUI (0.12.4, `make install-open-webui`) in headless Chromium against `haystack-fusion serve`: a person
chats with `cascade` on the embedded model over six short passages about the strategies (`CORPUS`), each titled by a
guide's file name.

`haystack-fusion serve --strategy cascade` runs on 127.0.0.1 behind an API key; Open WebUI runs offline with its
default settings (background tasks included: title, tags, follow-up suggestions) and two connections to it: the right
key, and a wrong one whose model is listed in Open WebUI's settings (`wrongkey.cascade`), so that its requests reach
the server. Scenarios, as a person sees them:

- a new chat with the defaults: the first question is answered, about the subject (its sources), with no error;
- a follow-up question ("it") is answered about the chat's subject: its sources include the subject's guide;
- Stop mid-answer: the UI stops, and the next question in the same chat is answered;
- the wrong key: the chat shows the server's message about the key.

The embedded model answers a cascade question in 30-120 s here, more when every round runs, so each wait is a hang
guard of minutes, not a timing assertion. The browser reaches nothing but 127.0.0.1 (`open_webui.CHROMIUM_FLAGS`).

Skipped unless Open WebUI's environment is there: `.venv-open-webui/bin/open-webui`, or `HAYSTACK_FUSION_OPEN_WEBUI`
naming an `open-webui` executable. Set `HAYSTACK_FUSION_SCREENSHOTS=1` to write each scenario's picture to
`docs/images/open_webui_*.png`.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from haystack import Document

from haystack_fusion.backends import LocalChatGenerator, save_store
from tests.support.serve_process import HayhooksProcess

from .conftest import local_serving_env
from .open_webui import (
    CHROMIUM,
    CHROMIUM_FLAGS,
    EXECUTABLE_VARIABLE,
    ROOT,
    ChatPage,
    Connection,
    OpenWebUIProcess,
    Reply,
    local_only,
    open_webui_env,
    open_webui_executable,
)

pytest.importorskip("hayhooks", reason="the `serve` extra (pip install 'haystack-fusion[serve]')")
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright's Python driver (the `dev` extra)")
EXECUTABLE = open_webui_executable()
if EXECUTABLE is None:
    pytest.skip(
        f"Open WebUI is not installed: make install-open-webui (.venv-open-webui), or set {EXECUTABLE_VARIABLE} to an "
        "open-webui executable",
        allow_module_level=True,
    )
if CHROMIUM is None:
    pytest.skip("no Chromium: apt-get install chromium, or set HAYSTACK_FUSION_CHROMIUM", allow_module_level=True)
if LocalChatGenerator is None:
    pytest.skip("the `local` extra (the embedded model)", allow_module_level=True)

KEY = "hf-open-webui-key-5e07"
WRONG_KEY = "not-the-key"
MODEL = "cascade"
WRONG_KEY_MODEL = f"wrongkey.{MODEL}"
FIRST_QUESTION = "What is Chain-of-Note?"
FOLLOW_UP = "How many LLM calls does it make?"
SUBJECT_GUIDE = "chain-of-note.md"
STOPPED_QUESTION = "How does SuRe pick its answer?"
AFTER_STOP = "What does post-fusion answer with?"
ANSWER_SECONDS = 900  # a hang guard: a cascade question on the embedded model takes 30-120 s here
# What Open WebUI shows when the request failed: the server's refusals and Open WebUI's own words for a failed call
FAILURES = (
    *("busy", "503", "Network Problem", "Error (HTTP", "Unauthorized", "no request slot", "Internal Server Error"),
    "has no attribute",  # Open WebUI's own error box when a background task's reply holds no text
)
SCREENSHOTS = os.environ.get("HAYSTACK_FUSION_SCREENSHOTS") == "1"


CORPUS = {
    "chain-of-note.md": "Chain-of-Note (Yu et al.) writes a reading note on each retrieved passage, judges whether the "
    "passage is relevant, and answers from the notes, or says unknown when no passage is relevant.",
    "costs.md": "How many LLM calls does a strategy make? Concatenation makes one LLM call. Post-fusion makes one LLM "
    "call per passage, so the number of calls grows with top-k. Cascade makes one call when concatenation answers.",
    "post-fusion.md": "Post-fusion asks the LLM once per retrieved passage and answers with the majority vote of the "
    "replies.",
    "sure.md": "SuRe proposes answer candidates, writes a summary for each candidate, and picks the candidate whose "
    "summary is judged valid and ranked best.",
    "cascade.md": "Cascade reads the passages together first and falls back to post-fusion when the answer is "
    "unknown; a split vote goes to SuRe's verification.",
    "install.md": "Install the package with make install-local; the embedded model needs no server and no key.",
}
"""The served passages, each titled by a guide's file name: fixed here, so that what BM25 retrieves does not move with
the project's guides. At top-2, the follow-up as asked ("How many LLM calls does it make?") retrieves costs.md and
install.md; read in the chat's context, it retrieves chain-of-note.md too."""
TOP_K = 2


def guides() -> list[Document]:
    """`CORPUS` as passages."""
    return [Document(content=text, meta={"title": title, "file": title}) for title, text in CORPUS.items()]


@pytest.fixture(scope="module")
def fusion(tmp_path_factory):
    """`haystack-fusion serve --strategy cascade` with an API key, on the embedded model over `CORPUS`, top-2."""
    root = tmp_path_factory.mktemp("fusion")
    index = root / "index.json"
    save_store(guides(), index)
    env = {**local_serving_env(index), "HAYSTACK_FUSION_API_KEY": KEY, "HAYSTACK_FUSION_TOP_K": str(TOP_K)}
    with HayhooksProcess([MODEL], env=env, workdir=root) as process:
        yield process


@pytest.fixture(scope="module")
def webui(tmp_path_factory, fusion):
    """Open WebUI, offline with its defaults, on two connections to the server: the key, and a wrong one."""
    root = tmp_path_factory.mktemp("open_webui")
    data = root / "data"
    data.mkdir()
    api = f"{fusion.url}/v1"
    connections = [Connection(api, KEY), Connection(api, WRONG_KEY, model_ids=[MODEL], prefix="wrongkey")]
    with OpenWebUIProcess(EXECUTABLE, env=open_webui_env(data, connections), workdir=root) as process:
        print(f"Open WebUI up in {process.startup_time:.0f} s")
        yield process


@pytest.fixture(scope="module")
def chat(webui, fusion):
    """One browser page on Open WebUI for the module's scenarios (they run in order, as a person's session)."""
    blocked: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.route("**/*", local_only(blocked))
            page_chat = ChatPage(page, webui.url)
            page_chat.open()
            yield page_chat
        finally:
            browser.close()
            print(f"requests the browser was kept from: {blocked}")
            print(f"server log tail: {fusion.log()[-3000:]}")


@pytest.fixture(scope="module")
def session() -> dict[str, str]:
    """What one scenario leaves for the next: the answered chat's address."""
    return {}


def screenshot(chat: ChatPage, tmp_path: Path, name: str) -> None:
    """The page now, in the test's folder, and with HAYSTACK_FUSION_SCREENSHOTS=1 in docs/images/open_webui_NAME.png."""
    shot = tmp_path / f"open_webui_{name}.png"
    chat.page.screenshot(path=str(shot))
    if SCREENSHOTS:
        shutil.copyfile(shot, ROOT / "docs" / "images" / shot.name)


def failure(reply: Reply) -> str | None:
    """The failure the reply shows, if any: an error box (no Markdown answer) or one of the failure words."""
    if not reply.answer:
        return f"no answer, the message shows: {reply.text!r}"
    words = [word for word in FAILURES if word.lower() in reply.text.lower()]
    return f"the message shows {words}: {reply.text!r}" if words else None


def ask(chat: ChatPage, question: str, count: int) -> tuple[Reply, float]:
    """Ask in the open chat and wait for its `count`-th reply; the reply and the seconds it took."""
    started = time.monotonic()
    chat.ask(question)
    reply = chat.wait_for_reply(count, ANSWER_SECONDS)
    seconds = time.monotonic() - started
    print(f"{question!r} -> in {seconds:.0f} s: status {reply.status}, sources {reply.sources}, text {reply.text!r}")
    return reply, seconds


def test_a_new_chat_answers_the_first_question(chat, session, tmp_path):
    chat.new_chat()
    assert chat.selected_model() == MODEL  # the default: the first model the connections list
    reply, _ = ask(chat, FIRST_QUESTION, 1)
    screenshot(chat, tmp_path, "first_question")
    assert failure(reply) is None, failure(reply)
    assert SUBJECT_GUIDE in reply.sources, reply.sources
    session["chat"] = chat.page.url


def test_b_a_follow_up_is_answered_about_the_chat_subject(chat, session, tmp_path):
    if "chat" in session:  # the first scenario's chat, answered
        chat.page.goto(session["chat"], wait_until="domcontentloaded")
        chat.replies().first.wait_for(timeout=60_000)
    else:  # it failed: a chat of this test's own, whose first question must be answered
        chat.new_chat()
        first, _ = ask(chat, FIRST_QUESTION, 1)
        assert failure(first) is None, f"the first question: {failure(first)}"
    reply, _ = ask(chat, FOLLOW_UP, 2)
    screenshot(chat, tmp_path, "follow_up")
    assert failure(reply) is None, failure(reply)
    first = chat.read_reply(1)  # the chat's title, tags and follow-up suggestions were generated meanwhile
    assert failure(first) is None, f"the first reply, after the chat's background tasks: {failure(first)}"
    # "it" is Chain-of-Note: the question the server retrieves for is about the chat's subject
    assert any(line.startswith("Standalone question:") and "Chain-of-Note" in line for line in reply.status), reply
    assert SUBJECT_GUIDE in reply.sources, reply.sources


def test_c_stop_mid_answer_then_ask_again(chat, tmp_path):
    chat.new_chat()
    chat.ask(STOPPED_QUESTION)
    stop = chat.page.locator("button[aria-label='Stop']")
    stop.first.wait_for(timeout=60_000)
    chat.replies().first.wait_for(timeout=ANSWER_SECONDS * 1000)
    chat.page.wait_for_timeout(5_000)  # the server is at work on it (retrieval, the first round)
    if stop.count() == 0:
        pytest.fail(f"the reply ended before Stop could be clicked: {chat.read_reply(1).text!r}")
    stop.first.click()
    stop.first.wait_for(state="detached", timeout=60_000)  # the UI stops
    stopped = chat.wait_for_reply(1, 60)
    print(f"stopped: {stopped.text!r}")
    reply, _ = ask(chat, AFTER_STOP, 2)
    screenshot(chat, tmp_path, "stop")
    assert failure(reply) is None, failure(reply)
    assert reply.sources, "the question after Stop has its sources"
    stopped = chat.read_reply(1)
    assert not stopped.sources, f"the stopped reply went on: {stopped.text!r}"


def test_d_a_wrong_key_shows_the_server_message(chat, tmp_path):
    chat.new_chat()
    chat.pick_model(WRONG_KEY_MODEL)
    reply, _ = ask(chat, FIRST_QUESTION, 1)
    screenshot(chat, tmp_path, "wrong_key")
    assert "Network Problem" not in reply.text, reply.text
    assert "API key" in reply.text, reply.text  # the server's own message names the key
    assert not reply.sources, reply.sources
