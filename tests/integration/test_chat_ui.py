"""
Hayhooks' embedded Chainlit chat UI in a real browser: `haystack-fusion serve --with-chainlit` on 127.0.0.1 serves
`cascade` over the embedded model behind an API key, over the project's own guides (docs/*.md, each passage titled by
its file), and headless Chromium (Debian's, driven by Playwright) gives the key when asked and asks one question about
the project. The test reads what a person sees: the page's visible text (`document.body.innerText`).

The browser reaches nothing but 127.0.0.1: Chromium's background services are switched off by flags, its resolver
maps every other host to nothing, and the page's requests elsewhere are aborted and listed. Chainlit's page asks for
two stylesheets from the internet (Google Fonts' Inter and KaTeX's CSS); without them it falls back to a system font
and still works.

Set HAYSTACK_FUSION_SCREENSHOT=docs/images/chat_ui.png to refresh the screenshot docs/serving.md shows.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import re
import shutil
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from haystack import Document
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.backends import save_store
from haystack_fusion.corpus import load_text_folder
from tests.support.serve_process import HayhooksProcess

from .conftest import local_serving_env
from .open_webui import CHROMIUM, CHROMIUM_FLAGS, LOCAL_PREFIXES, local_only

httpx = pytest.importorskip("httpx", reason="the `serve` extra")
pytest.importorskip("hayhooks", reason="the `serve` extra (pip install 'haystack-fusion[serve]')")
if importlib.util.find_spec("chainlit") is None:  # not imported here: importing it writes .chainlit/ into the cwd
    pytest.skip("Chainlit: make install-chat-ui (pip install -c constraints/chainlit.txt ...)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright's Python driver (the `dev` extra)")

KEY = "hf-chat-ui-key-2b9d"
DOCS = Path(__file__).resolve().parents[2] / "docs"
QUESTION = "Which strategy falls back to post-fusion when concatenation says unknown?"
TOP_K = 5  # the served retriever's (BackendConfig.top_k)
MARKUP = ("<details", "</details>", "<summary", "</summary>", "**Sources**")  # the details block Open WebUI renders
TAG = re.compile(r"</?[A-Za-z][^<>]*>")
ANSWER_SECONDS = 600  # a cascade question on the embedded model: 30-120 s here, more when every round runs

SCROLL_TO_TOP = "for (const e of document.querySelectorAll('*')) if (e.scrollHeight > e.clientHeight) e.scrollTop = 0"


def guides() -> list[Document]:
    """The passages of the project's guides (docs/*.md), each titled by its file name."""
    passages = [passage for passage in load_text_folder(DOCS) if "/" not in passage.meta["file"]]
    for passage in passages:
        passage.meta["title"] = passage.meta["file"]
    return passages


def retrieved_titles(passages: list[Document], question: str) -> list[str]:
    """The titles of the passages the served BM25 retriever returns for the question, in rank order."""
    store = InMemoryDocumentStore()
    store.write_documents(passages)
    return [d.meta["title"] for d in InMemoryBM25Retriever(store, top_k=TOP_K).run(query=question)["documents"]]


@pytest.fixture(scope="module")
def corpus() -> list[Document]:
    return guides()


@pytest.fixture(scope="module")
def chat_ui(tmp_path_factory, corpus):
    """
    `haystack-fusion serve --with-chainlit --strategy cascade` with an API key over the guides: the UI at /chat,
    cascade auto-selected as the chat's model.
    """
    if CHROMIUM is None:
        pytest.skip("no Chromium: apt-get install chromium (make install-chat-ui), or set HAYSTACK_FUSION_CHROMIUM")
    root = tmp_path_factory.mktemp("chat_ui")
    index = root / "index.json"
    save_store(corpus, index)
    env = {
        **local_serving_env(index),
        "HAYSTACK_FUSION_API_KEY": KEY,
        "HAYHOOKS_CHAINLIT_DEFAULT_MODEL": "cascade",
        "HAYHOOKS_CHAINLIT_REQUEST_TIMEOUT": str(ANSWER_SECONDS + 60),  # Chainlit's own default (120 s) is too short
    }
    with HayhooksProcess(["cascade"], env=env, workdir=root, args=("--with-chainlit",)) as process:
        yield process.url


def test_the_chat_ui_asks_for_the_key(chat_ui):
    response = httpx.get(f"{chat_ui}/chat/", timeout=10)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Basic ")
    assert httpx.get(f"{chat_ui}/chat/", auth=("reader", KEY), timeout=10).status_code == 200


def websocket_status(url: str, path: str, headers: dict[str, str]) -> int:
    """The HTTP status a WebSocket handshake to `path` gets (101 when it opens), sent by hand over a socket."""
    parts = urlsplit(url)
    request = [
        f"GET {path} HTTP/1.1",
        f"Host: {parts.netloc}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}",
        "Sec-WebSocket-Version: 13",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as connection:
        connection.sendall(("\r\n".join(request) + "\r\n\r\n").encode())
        status_line = connection.recv(4096).split(b"\r\n", 1)[0]
    return int(status_line.split()[1])


def test_the_chat_uis_websocket_refuses_other_origins(chat_ui):
    """A page of another origin cannot drive the UI, even in a browser that holds the key (DNS rebinding aside)."""
    path = "/chat/ws/socket.io/?EIO=4&transport=websocket"
    key = {"Authorization": "Basic " + base64.b64encode(f"reader:{KEY}".encode()).decode()}
    own = chat_ui.replace("http://", "")
    assert websocket_status(chat_ui, path, {**key, "Origin": "http://evil.example"}) == 403
    assert websocket_status(chat_ui, path, {**key, "Origin": f"http://{own}"}) != 403


def test_chat_ui_shows_status_answer_and_sources(chat_ui, tmp_path, corpus):
    titles = retrieved_titles(corpus, QUESTION)
    blocked: list[str] = []

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            # the key as the password of the browser's Basic authentication, as a person types it when asked
            context = browser.new_context(
                viewport={"width": 1100, "height": 1500}, http_credentials={"username": "reader", "password": KEY}
            )
            page = context.new_page()
            page.route("**/*", local_only(blocked))
            page.goto(f"{chat_ui}/chat/", wait_until="domcontentloaded")
            page.get_by_text("Connected to").wait_for(timeout=60_000)
            assert "cascade" in page.inner_text("body")

            page.locator("#chat-input").fill(QUESTION)
            page.locator("#chat-submit").click()
            started = time.monotonic()
            page.get_by_text(QUESTION).wait_for(timeout=30_000)
            # The steps appear as the status events arrive; the evidence element closes the reply.
            page.locator("[data-step-type='run']").first.wait_for(timeout=ANSWER_SECONDS * 1000)
            page.get_by_text("Sources and evidence (").wait_for(timeout=ANSWER_SECONDS * 1000)
            page.wait_for_timeout(500)
            seconds = time.monotonic() - started

            # Status: one collapsed step per round; opened, each shows its status event's description.
            steps = page.locator("[data-step-type='run'] button[id^='step-']")
            for index in range(steps.count()):
                steps.nth(index).click()
            page.wait_for_timeout(500)
            statuses = page.locator("[data-step-type='run']").all_inner_texts()
            replies = page.locator("[data-step-type='assistant_message']")
            texts = [text.strip() for text in replies.all_inner_texts()]
            answer_at = next(i for i, text in enumerate(texts) if "Sources and evidence (" in text) - 1
            answer = texts[answer_at]
            evidence = texts[answer_at + 1]
            visible = page.evaluate("document.body.innerText")

            page.evaluate(SCROLL_TO_TOP)  # the question at the top of the picture
            shot = tmp_path / "chat_ui.png"
            page.screenshot(path=str(shot))
            if target := os.environ.get("HAYSTACK_FUSION_SCREENSHOT"):
                shutil.copyfile(shot, target)
        finally:
            browser.close()

    print(f"answered in {seconds:.0f} s: {answer!r}; sources {titles}; steps {statuses}; blocked {blocked}")
    print(f"evidence element: {evidence!r}")
    assert len(statuses) >= 2, statuses
    assert "✅ Retrieved" in statuses[0], statuses  # "Retrieving passages", then done: "Retrieved 5 passages"
    assert any("✅ Concatenation" in status for status in statuses[1:]), statuses  # cascade's first round
    # The message is the answer, as text; the sources, stages and usage are the evidence element below it.
    assert answer, "an answer"
    assert answer in visible
    assert not TAG.search(answer), answer
    assert "Sources" not in answer, answer
    for rank, title in enumerate(titles, start=1):
        assert f"[{rank}] {title}" in evidence, (rank, title, evidence)
        assert title in visible
    # each passage is labelled: "supported the answer" (it holds the answer) or "retrieved"
    assert evidence.count("supported the answer") + evidence.count("retrieved") >= len(titles), evidence
    assert "LLM call" in evidence or "from the cache" in evidence  # the usage line
    for markup in MARKUP:
        assert markup not in visible, markup
    assert all(not url.startswith(LOCAL_PREFIXES) for url in blocked)
