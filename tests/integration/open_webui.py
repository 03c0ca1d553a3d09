"""
Open WebUI in a real browser, for `test_open_webui.py` and `open_webui_capture.py`: the `open-webui` package (pinned
in the Makefile, `make install-open-webui`) in its own virtual environment, run offline on 127.0.0.1 with a fresh
data folder, and Debian's Chromium driven by Playwright's Python driver (no browser download).

Open WebUI's dependencies clash with the project's, so it lives in `.venv-open-webui/` (or wherever
`HAYSTACK_FUSION_OPEN_WEBUI` names its `open-webui` executable) and runs as a child process. Its environment is built
from scratch (`open_webui_env`), not inherited, so nothing of the caller's (an `OPENAI_API_KEY`, a proxy) reaches it:
`OFFLINE_MODE` (no Hugging Face downloads, no update check), no Ollama, embeddings from the OpenAI-compatible
connection instead of a local model, no login (`WEBUI_AUTH=False`: the browser is the admin), and the connections
given. Everything else is Open WebUI's default, background tasks (title, tags, follow-up suggestions) included.

The browser reaches nothing but 127.0.0.1 (`CHROMIUM_FLAGS`, `local_only`), as in `test_chat_ui.py`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

OPEN_WEBUI_VERSION = "0.12.4"
ROOT = Path(__file__).resolve().parents[2]
EXECUTABLE_VARIABLE = "HAYSTACK_FUSION_OPEN_WEBUI"
DEFAULT_EXECUTABLE = ROOT / ".venv-open-webui" / "bin" / "open-webui"
CHROMIUM = os.environ.get("HAYSTACK_FUSION_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")

# Headless and quiet: no component updates, sync, metrics, field trials or other background requests, and no name
# but 127.0.0.1 resolves. The browser tests' one set (test_chat_ui.py's too).
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
LOCAL_PREFIXES = ("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:")


def open_webui_executable() -> Path | None:
    """The `open-webui` executable: `$HAYSTACK_FUSION_OPEN_WEBUI`, else `.venv-open-webui/bin/open-webui`, or None."""
    named = os.environ.get(EXECUTABLE_VARIABLE)
    path = Path(named) if named else DEFAULT_EXECUTABLE
    return path if path.is_file() else None


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Connection:
    """
    One OpenAI-compatible connection of Open WebUI.

    :param url: Its API base URL, e.g. `http://127.0.0.1:1416/v1`.
    :param key: The API key Open WebUI sends (`Authorization: Bearer <key>`).
    :param model_ids: Models listed for it in Open WebUI's settings; Open WebUI then does not ask `/models` (so a
        connection with a wrong key still shows them). Empty: asked from `GET /models`.
    :param prefix: Open WebUI's prefix for its model ids (`prefix.model` in the UI, stripped in requests), to tell
        two connections to the same server apart.
    """

    url: str
    key: str
    model_ids: Sequence[str] = field(default_factory=tuple)
    prefix: str | None = None


def open_webui_env(data_dir: Path, connections: Sequence[Connection], **settings: str) -> dict[str, str]:
    """
    Open WebUI's environment: offline, no login, the given OpenAI-compatible connections, data in `data_dir`.

    :param settings: More of Open WebUI's variables (e.g. `ENABLE_FORWARD_USER_INFO_HEADERS="true"`).
    """
    import json

    configs: dict[str, dict[str, Any]] = {}
    for index, connection in enumerate(connections):
        config: dict[str, Any] = {}
        if connection.model_ids:
            config["model_ids"] = list(connection.model_ids)
        if connection.prefix:
            config["prefix_id"] = connection.prefix
        if config:
            configs[str(index)] = {"enable": True, **config}
    home = data_dir / "home"
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "HOME": str(home),  # caches of its libraries, if any, stay in the temporary folder
        "DATA_DIR": str(data_dir),
        "WEBUI_SECRET_KEY": "open-webui-test-secret",  # else `serve` writes .webui_secret_key into the cwd
        "WEBUI_AUTH": "False",
        # offline: no model downloads, no version check, no telemetry
        "OFFLINE_MODE": "true",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "ENABLE_VERSION_UPDATE_CHECK": "false",
        "DO_NOT_TRACK": "true",
        "SCARF_NO_ANALYTICS": "true",
        "ANONYMIZED_TELEMETRY": "false",
        # our server only: no Ollama, embeddings (for uploads) from the connection instead of a local model
        "ENABLE_OLLAMA_API": "false",
        "ENABLE_OPENAI_API": "true",
        "RAG_EMBEDDING_ENGINE": "openai",
        "OPENAI_API_BASE_URL": connections[0].url,
        "OPENAI_API_KEY": connections[0].key,
        "OPENAI_API_BASE_URLS": ";".join(connection.url for connection in connections),
        "OPENAI_API_KEYS": ";".join(connection.key for connection in connections),
        "OPENAI_API_CONFIGS": json.dumps(configs),
        # a cascade question on the embedded model can take minutes (Open WebUI's default: 300 s)
        "AIOHTTP_CLIENT_TIMEOUT": "1200",
        **settings,
    }


class OpenWebUIProcess:
    """
    `open-webui serve` on 127.0.0.1 in a child process (its own process group), up once `GET /health` answers.

    :param executable: The `open-webui` executable.
    :param env: Its whole environment (`open_webui_env`).
    :param workdir: Its working folder, where its log goes (`open-webui.log`).
    :param startup_seconds: How long to wait for it (the first start migrates a fresh database: ~30 s here).
    """

    def __init__(self, executable: Path, *, env: dict[str, str], workdir: Path, startup_seconds: float = 300) -> None:
        self.executable = executable
        self.env = env
        self.workdir = workdir
        self.startup_seconds = startup_seconds
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "open-webui.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_time: float | None = None

    def log(self) -> str:
        """Its output so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self) -> OpenWebUIProcess:
        """
        Start it and wait until it answers.

        :raises RuntimeError: With the log's tail, if it exits or `startup_seconds` pass first.
        """
        command = [str(self.executable), "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        started = time.monotonic()
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command, env=self.env, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = started + self.startup_seconds
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    self.startup_time = time.monotonic() - started
                    return self
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"open-webui serve exited: {self.log()[-3000:]}")
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"open-webui serve was not up after {self.startup_seconds} s: {self.log()[-3000:]}")

    def stop(self) -> None:
        """Terminate its process group (kill it after 20 s); safe to call more than once."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> OpenWebUIProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def local_only(blocked: list[str]):
    """A Playwright route handler that lets requests to 127.0.0.1 through and aborts (and lists) the others."""

    def route(route: Any) -> None:
        if route.request.url.startswith(LOCAL_PREFIXES):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    return route


def source_names(text: str) -> list[str]:
    """
    The citations' names in a reply's text, once its sources are opened: after the "N Sources" button, a number and
    a name per source (the name without a leading "[i] ").
    """
    lines = [line.strip() for line in text.splitlines()]
    start = next((i + 1 for i, line in enumerate(lines) if re.fullmatch(r"\d+ Sources?", line)), len(lines))
    names = []
    while start + 1 < len(lines) and lines[start].isdigit():
        names.append(re.sub(r"^\[\d+\] ", "", lines[start + 1]))
        start += 2
    return names


@dataclass
class Reply:
    """One assistant message as a person reads it."""

    text: str  # everything in the message
    status: list[str]  # the status lines (Open WebUI's status history), in order
    answer: str  # the Markdown text: the answer and the details block's summary line; "" for an error box
    sources: list[str]  # the citations' names, e.g. "chain-of-note.md" for "[1] chain-of-note.md"


class ChatPage:
    """
    Open WebUI's chat page in a Playwright page, used as a person does: new chat, pick a model, type, send, stop.

    The selectors are Open WebUI 0.12's: `#chat-input` (the message box), `#send-message-button`,
    the Stop button (`aria-label="Stop"`), the model selector's `Selected model: ...` button, one `#message-<id>`
    element per message (the assistant's hold a `.chat-assistant`), whose action bar (Copy, Regenerate, ...) shows
    once the reply has ended.
    """

    def __init__(self, page: Any, url: str) -> None:
        self.page = page
        self.url = url

    def open(self) -> None:
        """Load the app; close the release notes shown on a first visit."""
        self.page.goto(f"{self.url}/", wait_until="domcontentloaded")
        self.page.locator("#chat-input").wait_for(timeout=120_000)
        notes = self.page.get_by_role("button", name="Okay, Let's Go!")
        try:
            notes.wait_for(timeout=5_000)
            notes.click()
        except Exception:  # no release notes this time
            pass

    def new_chat(self) -> None:
        """Start a new chat (the sidebar's New Chat, or the app's start page)."""
        self.page.goto(f"{self.url}/", wait_until="domcontentloaded")
        self.page.locator("#chat-input").wait_for(timeout=60_000)

    def selected_model(self) -> str:
        """The model the chat is on, as the selector names it."""
        label = self.page.locator("button[aria-label^='Selected model: ']").first.get_attribute("aria-label") or ""
        return label.removeprefix("Selected model: ")

    def pick_model(self, model: str) -> None:
        """Choose `model` in the model selector (its search box, then the entry)."""
        if self.selected_model() == model:
            return
        self.page.locator("button[aria-label^='Selected model: ']").first.click()
        self.page.get_by_placeholder("Search a model").fill(model)
        self.page.locator(f"button[data-value='{model}']").first.click()
        self.page.wait_for_function(
            "m => [...document.querySelectorAll(\"button[aria-label^='Selected model: ']\")]"
            ".some(b => b.getAttribute('aria-label') === 'Selected model: ' + m)",
            arg=model,
            timeout=10_000,
        )

    def replies(self) -> Any:
        """The assistant's messages, in order (`#message-<id>` elements holding a `.chat-assistant`)."""
        return self.page.locator("div[id^='message-']:has(.chat-assistant)")

    def ask(self, question: str) -> None:
        """Type the question into the message box and send it."""
        self.page.locator("#chat-input").click()
        self.page.keyboard.type(question)
        self.page.locator("#send-message-button").click()

    def wait_for_reply(self, count: int, seconds: float) -> Reply:
        """
        Wait until the chat's `count`-th reply has finished (its action bar, with Copy, shows: after the answer, an
        error or Stop) and read it.
        """
        reply = self.replies().nth(count - 1)
        reply.wait_for(timeout=seconds * 1000)
        reply.locator("button[aria-label='Copy']").wait_for(timeout=seconds * 1000)
        return self.read_reply(count)

    def read_reply(self, count: int) -> Reply:
        """
        The `count`-th reply as a person sees it once its status history and its sources are opened: the status
        lines, the answer (the Markdown text, with the details block's summary line), the sources' names and the
        whole text.
        """
        reply = self.replies().nth(count - 1)
        toggles = ("button[aria-label='Toggle status history']", "button[aria-label^='Toggle '][aria-label*=' source']")
        for toggle in toggles:
            button = reply.locator(toggle)
            if button.count() and button.first.get_attribute("aria-expanded") == "false":
                button.first.click()
        self.page.wait_for_timeout(500)
        text = str(reply.inner_text())
        status = reply.locator(".status-description")
        prose = reply.locator(".markdown-prose")
        return Reply(
            text=text,
            status=[line.strip() for line in status.all_inner_texts() if line.strip()],
            answer=prose.first.inner_text().strip() if prose.count() else "",
            sources=source_names(text),
        )

    def stop(self) -> None:
        """Click the Stop button shown while a reply is under way."""
        self.page.locator("button[aria-label='Stop']").first.click()

    def visible_text(self) -> str:
        """What a person sees on the page (`document.body.innerText`)."""
        return str(self.page.evaluate("document.body.innerText"))
