"""
Hayhooks' embedded Chainlit chat UI in a real browser: `haystack-fusion serve --with-chainlit` on 127.0.0.1 serves
`cascade` over the embedded model behind an API key, and headless Chromium (Debian's, driven by Playwright) gives the
key when asked and asks one question.

The browser reaches nothing but 127.0.0.1: Chromium's background services are switched off by flags, its resolver
maps every other host to nothing, and the page's requests elsewhere are aborted and listed. Chainlit's page asks for
two stylesheets from the internet (Google Fonts' Inter and KaTeX's CSS); without them it falls back to a system font
and still works.

Set HAYSTACK_FUSION_SCREENSHOT=docs/images/chat_ui.png to refresh the screenshot docs/serving.md shows.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time

import pytest

from haystack_fusion.backends import save_store
from haystack_fusion.testing.serve_process import HayhooksProcess

from .conftest import local_serving_env

httpx = pytest.importorskip("httpx", reason="the `serve` extra")
pytest.importorskip("hayhooks", reason="the `serve` extra (pip install 'haystack-fusion[serve]')")
if importlib.util.find_spec("chainlit") is None:  # not imported here: importing it writes .chainlit/ into the cwd
    pytest.skip("Chainlit: make install-chat-ui (pip install -c constraints/chainlit.txt ...)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright's Python driver (the `dev` extra)")

KEY = "hf-chat-ui-key-2b9d"
CHROMIUM = os.environ.get("HAYSTACK_FUSION_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
ANSWER_SECONDS = 600  # a cascade question on the embedded model: 30-120 s here, more when every round runs

# Headless and quiet: no component updates, sync, metrics, field trials or other background requests, and no name
# but 127.0.0.1 resolves.
CHROMIUM_FLAGS = [
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-sync",
    "--disable-breakpad",
    "--disable-client-side-phishing-detection",
    "--disable-features=OptimizationHints,MediaRouter,Translate,AutofillServerCommunication",
    "--metrics-recording-only",
    "--no-default-browser-check",
    "--no-first-run",
    "--no-pings",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]
SCROLL_TO_TOP = "for (const e of document.querySelectorAll('*')) if (e.scrollHeight > e.clientHeight) e.scrollTop = 0"
LOCAL_PREFIXES = ("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:")


@pytest.fixture(scope="module")
def chat_ui(tmp_path_factory, squad):
    """
    `haystack-fusion serve --with-chainlit --strategy cascade` with an API key: the UI at /chat, cascade auto-selected
    as the chat's model.
    """
    if CHROMIUM is None:
        pytest.skip("no Chromium: apt-get install chromium (make install-chat-ui), or set HAYSTACK_FUSION_CHROMIUM")
    root = tmp_path_factory.mktemp("chat_ui")
    index = root / "index.json"
    save_store(squad[0], index)
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


def test_chat_ui_shows_status_answer_and_sources(chat_ui, tmp_path, questions):
    question = questions[0].question  # read from ../shared at run time
    blocked: list[str] = []

    def local_only(route) -> None:
        if route.request.url.startswith(LOCAL_PREFIXES):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            # the key as the password of the browser's Basic authentication, as a person types it when asked
            context = browser.new_context(
                viewport={"width": 1100, "height": 1500}, http_credentials={"username": "reader", "password": KEY}
            )
            page = context.new_page()
            page.route("**/*", local_only)
            page.goto(f"{chat_ui}/chat/", wait_until="domcontentloaded")
            page.get_by_text("Connected to").wait_for(timeout=60_000)
            assert "cascade" in page.inner_text("body")

            page.locator("#chat-input").fill(question)
            page.locator("#chat-submit").click()
            started = time.monotonic()
            page.get_by_text(question).wait_for(timeout=30_000)
            # The steps appear as the status events arrive; the details block closes the stream.
            page.locator("[data-step-type='run']").first.wait_for(timeout=ANSWER_SECONDS * 1000)
            reply = page.locator("[data-step-type='assistant_message']").last
            reply.get_by_text("</details>").wait_for(timeout=ANSWER_SECONDS * 1000)
            seconds = time.monotonic() - started

            # Status: one collapsed step per round; opened, each shows its status event's description.
            steps = page.locator("[data-step-type='run'] button[id^='step-']")
            for index in range(steps.count()):
                steps.nth(index).click()
            page.wait_for_timeout(500)
            statuses = page.locator("[data-step-type='run']").all_inner_texts()
            answer = reply.locator("[role='article']").first.inner_text().split("<details")[0].strip()
            sources = reply.locator("ol > li").all_inner_texts()

            page.evaluate(SCROLL_TO_TOP)  # the question at the top of the picture
            shot = tmp_path / "chat_ui.png"
            page.screenshot(path=str(shot))
            if target := os.environ.get("HAYSTACK_FUSION_SCREENSHOT"):
                shutil.copyfile(shot, target)
        finally:
            browser.close()

    print(f"answered in {seconds:.0f} s: {answer!r}; {len(sources)} sources; steps {statuses}; blocked {blocked}")
    assert len(statuses) >= 2, statuses
    assert "✅ Retrieved" in statuses[0], statuses  # "Retrieving passages", then done: "Retrieved 5 passages"
    assert any("✅ Concatenation" in status for status in statuses[1:]), statuses  # cascade's first round
    assert answer, "an answer before the details block"
    assert sources, "the numbered sources in the details block"
    assert all(source.strip() for source in sources)
    assert all(not url.startswith(LOCAL_PREFIXES) for url in blocked)
