"""
Capture the requests Open WebUI sends to an OpenAI-compatible server: writes `tests/fixtures/open_webui/*.json`.

A recording server on 127.0.0.1 (`Recorder`) stands in for `haystack-fusion serve`: it lists two models, answers
`/v1/chat/completions` as our server does for Open WebUI (status events, the answer token by token, a source event,
the `<details>` block; JSON for Open WebUI's background tasks when not streamed) and writes each request (headers and
body) to a JSONL file. Open WebUI (`open_webui.OpenWebUIProcess`, default settings, offline) is pointed at it, and
headless Chromium asks a first question and a follow-up in a new chat, lets the background tasks run, and sends a
question with an image and one with a text file attached. The requests are saved, their volatile parts (ids, dates,
versions) replaced by placeholders, as the fixtures the unit tests read.

Run from the checkout's root, with the `dev` extra and `.venv-open-webui` installed (`make install-open-webui`):

    .venv/bin/python -m tests.integration.open_webui_capture [--out tests/fixtures/open_webui] [--raw raw.jsonl]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import socket
import struct
import tempfile
import threading
import time
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .open_webui import (
    CHROMIUM,
    CHROMIUM_FLAGS,
    OPEN_WEBUI_VERSION,
    ROOT,
    ChatPage,
    Connection,
    OpenWebUIProcess,
    local_only,
    open_webui_env,
    open_webui_executable,
)

KEY = "open-webui-test-key"
MODELS = ("cascade", "concat_pf")
FIRST_QUESTION = "What is Chain-of-Note?"
FOLLOW_UP = "How many LLM calls does it make?"
ANSWER = "Chain-of-Note writes a reading note on each retrieved passage, then answers from the notes."
DETAILS = (
    '<details type="evidence" done="true">\n<summary>Sources and evidence: 1 source, 1 LLM call</summary>\n\n'
    "**Sources**\n\n1. chain-of-note.md (supported the answer)\n</details>\n\n"
)
TASK_REPLIES = {  # what each background task asks for, as its prompt's "JSON format" line names it
    '"title"': '{"title": "Chain-of-Note"}',
    '"tags"': '{"tags": ["Technology", "Natural Language Processing"]}',
    '"follow_ups"': '{"follow_ups": ["How many LLM calls does it make?", "Which paper is it from?"]}',
    '"queries"': '{"queries": ["Chain-of-Note"]}',
}
HEADERS = ("authorization", "content-type", "accept", "user-agent")  # the ones a fixture keeps
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def task_name(body: dict[str, Any]) -> str | None:
    """The background task a request is (title, tags, follow_ups, queries), or None for a chat turn."""
    content = body["messages"][-1]["content"]
    if not isinstance(content, str) or not content.startswith("### Task:") or "<chat_history>" not in content:
        return None
    return next((key.strip('"') for key in TASK_REPLIES if key in content), "other")


class Recorder:
    """An OpenAI-compatible server on 127.0.0.1 that records every request and answers like `haystack-fusion serve`."""

    def __init__(self, log_path: Path, *, key: str = KEY, token_seconds: float = 0.05) -> None:
        self.log_path = log_path
        self.key = key
        self.token_seconds = token_seconds
        self.lock = threading.Lock()
        self.records: list[dict[str, Any]] = []
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}/v1"
        config = uvicorn.Config(self.app(), log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    def record(self, kind: str, request: Request, body: Any) -> dict[str, Any]:
        entry = {
            "time": time.time(),
            "kind": kind,
            "method": request.method,
            "path": request.url.path,
            "headers": dict(request.headers),
            "body": body,
        }
        with self.lock:
            self.records.append(entry)
            with self.log_path.open("a", encoding="utf-8") as log:
                log.write(json.dumps(entry) + "\n")
        return entry

    def app(self) -> FastAPI:
        app = FastAPI()

        def refused(request: Request) -> JSONResponse | None:
            if request.headers.get("authorization") == f"Bearer {self.key}":
                return None
            message = "Unauthorized: send the API key as Authorization: Bearer <key>"
            return JSONResponse({"error": {"message": message, "type": "unauthorized"}}, status_code=401)

        @app.get("/v1/models")
        async def models(request: Request) -> Response:
            self.record("models", request, None)
            if (error := refused(request)) is not None:
                return error
            data = [{"id": model, "object": "model", "created": 0, "owned_by": "haystack-fusion"} for model in MODELS]
            return JSONResponse({"object": "list", "data": data})

        @app.post("/v1/embeddings")
        async def embeddings(request: Request) -> Response:
            body = await request.json()
            self.record("embeddings", request, body)
            inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
            vectors = [[byte / 255 for byte in hashlib.sha256(str(text).encode()).digest()] for text in inputs]
            data = [{"object": "embedding", "index": i, "embedding": vector} for i, vector in enumerate(vectors)]
            return JSONResponse({"object": "list", "data": data, "model": body.get("model"), "usage": {}})

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            body = await request.json()
            self.record("chat", request, body)
            if (error := refused(request)) is not None:
                return error
            task = task_name(body)
            if not body.get("stream"):
                text = TASK_REPLIES.get(f'"{task}"', "{}") if task else ANSWER
                return JSONResponse(completion(body, text))
            return StreamingResponse(self.stream(request, body), media_type="text/event-stream")

        @app.api_route("/{path:path}", methods=["GET", "POST"])
        async def other(path: str, request: Request) -> Response:
            self.record("other", request, (await request.body()).decode(errors="replace"))
            return JSONResponse({"error": {"message": f"no route /{path}"}}, status_code=404)

        return app

    async def stream(self, request: Request, body: dict[str, Any]) -> AsyncIterator[str]:
        """Our server's streamed reply: status events, the answer token by token, a source event, the details block."""
        model = body.get("model", "")

        def event(kind: str, data: dict[str, Any]) -> str:
            return f"data: {json.dumps({'event': {'type': kind, 'data': data}})}\n\n"

        def chunk(content: str | None, finish: str | None = None) -> str:
            delta = {"content": content} if content is not None else {}
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            message = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": model}
            return f"data: {json.dumps({**message, 'choices': [choice]})}\n\n"

        yield event("status", {"description": "Retrieving passages", "done": False, "hidden": False})
        yield event("status", {"description": "Retrieved 5 passages", "done": True, "hidden": False})
        sent = 0
        try:  # a client that goes away cancels this generator (Starlette) at its next await
            for token in re.findall(r"\S+\s*", ANSWER):
                await asyncio.sleep(self.token_seconds)
                yield chunk(token)
                sent += 1
        except asyncio.CancelledError:
            self.record("disconnected", request, {"after_tokens": sent})
            raise
        yield event("status", {"description": "Answered in 0.1 s from 1 source", "done": True, "hidden": False})
        source = {"name": "[1] chain-of-note.md", "id": "passage-1"}
        metadata = {"source": source["name"], "document_id": "passage-1", "score": 4.2}
        yield event("source", {"source": source, "document": [ANSWER], "metadata": [metadata]})
        yield chunk("\n\n" + DETAILS)
        yield chunk(None, "stop")
        yield "data: [DONE]\n\n"

    def start(self) -> Recorder:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the recorder did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._socket.close()

    def chats(self, since: int = 0) -> list[dict[str, Any]]:
        with self.lock:
            return [entry for entry in self.records[since:] if entry["kind"] == "chat"]


def completion(body: dict[str, Any], text: str) -> dict[str, Any]:
    message = {"role": "assistant", "content": text}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", ""),
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def normalized(value: Any) -> Any:
    """A request's volatile parts as placeholders: uuids, today's date, the client's Python and aiohttp versions."""
    if isinstance(value, dict):
        return {key: normalized(item) for key, item in value.items()}
    if isinstance(value, list):
        return [normalized(item) for item in value]
    if isinstance(value, str):
        value = UUID.sub("<uuid>", value)
        value = re.sub(r"Today's date is: \d{4}-\d{2}-\d{2}", "Today's date is: <date>", value)
        return re.sub(r"^Python/[\d.]+ aiohttp/[\d.]+$", "Python/<version> aiohttp/<version>", value)
    return value


def fixture(entry: dict[str, Any], description: str, **notes: Any) -> dict[str, Any]:
    headers = {name: entry["headers"][name] for name in HEADERS if name in entry["headers"]}
    headers.update({name: value for name, value in entry["headers"].items() if name.startswith("x-openwebui-")})
    return {
        "open_webui": OPEN_WEBUI_VERSION,
        "description": description,
        **notes,
        "method": entry["method"],
        "path": entry["path"],
        "headers": normalized(headers),
        "body": normalized(entry["body"]),
    }


def red_png(size: int = 4) -> bytes:
    """A tiny red PNG, made here."""
    rows = b"".join(b"\x00" + bytes([200, 30, 30]) * size for _ in range(size))

    def part(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + part(b"IHDR", header) + part(b"IDAT", zlib.compress(rows)) + part(b"IEND", b"")


def wait_for(predicate: Any, seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if result := predicate():
            return result
        time.sleep(0.25)
    raise TimeoutError(f"no {what} within {seconds} s")


def capture(out: Path, raw: Path, workdir: Path) -> dict[str, Any]:
    """Run the scenarios, write the fixtures into `out` and every request into `raw`; return what was seen."""
    from playwright.sync_api import sync_playwright

    executable = open_webui_executable()
    if executable is None or CHROMIUM is None:
        raise SystemExit("needs .venv-open-webui (make install-open-webui) and Debian's chromium")
    raw.unlink(missing_ok=True)
    recorder = Recorder(raw).start()
    seen: dict[str, Any] = {"fixtures": []}
    try:
        variants = [("default", {}), ("forwarded_headers", {"ENABLE_FORWARD_USER_INFO_HEADERS": "true"})]
        for variant, settings in variants:
            data = workdir / f"open-webui-{variant}"
            data.mkdir()
            env = open_webui_env(data, [Connection(recorder.url, KEY)], **settings)
            with OpenWebUIProcess(executable, env=env, workdir=data) as webui, sync_playwright() as playwright:
                seen[f"startup_seconds_{variant}"] = round(webui.startup_time or 0, 1)
                browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
                blocked: list[str] = []
                try:
                    page = browser.new_page(viewport={"width": 1280, "height": 900})
                    page.route("**/*", local_only(blocked))
                    chat = ChatPage(page, webui.url)
                    chat.open()
                    if variant == "default":
                        seen["fixtures"] += conversation(chat, recorder, out)
                        seen["fixtures"] += attachments(chat, recorder, out, workdir)
                        seen["stop"] = stop(chat, recorder)
                    else:
                        seen["fixtures"] += forwarded(chat, recorder, out)
                finally:
                    browser.close()
                seen[f"blocked_{variant}"] = blocked
    finally:
        recorder.stop()
    return seen


def save(out: Path, name: str, content: dict[str, Any]) -> str:
    (out / f"{name}.json").write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return name


def turn_kinds(entries: list[dict[str, Any]]) -> list[str]:
    """The requests in arrival order: a task's name, or "question" for the chat turn itself."""
    return [task_name(entry["body"]) or "question" for entry in entries]


def only(entries: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The one request of this kind (a task's name, or "question")."""
    found = [entry for entry, found_kind in zip(entries, turn_kinds(entries), strict=True) if found_kind == kind]
    if len(found) != 1:
        raise AssertionError(f"{len(found)} {kind} requests: {[entry['body'] for entry in found]}")
    return found[0]


def conversation(chat: ChatPage, recorder: Recorder, out: Path) -> list[str]:
    """A new chat with the default model: a first question, its background tasks, a follow-up and its tasks."""
    start = len(recorder.records)
    chat.ask(FIRST_QUESTION)
    chat.wait_for_reply(1, 60)
    tasks = {"title", "tags", "follow_ups"}
    wait_for(lambda: set(turn_kinds(recorder.chats(start))) >= tasks, 60, "title, tags and follow-up tasks")
    middle = len(recorder.records)
    chat.ask(FOLLOW_UP)
    chat.wait_for_reply(2, 60)
    wait_for(lambda: "follow_ups" in turn_kinds(recorder.chats(middle)), 60, "follow-up task")
    time.sleep(3)  # any later task
    second = recorder.chats(middle)
    first = recorder.chats(start)[: -len(second)]
    order = {"arrival_order_first_turn": turn_kinds(first), "arrival_order_second_turn": turn_kinds(second)}
    described = [
        ("first_question", first, "question", "A new chat with default settings: the first question, streamed."),
        ("follow_up", second, "question", "The chat's second question: the whole history, as Open WebUI keeps it."),
        ("title_task", first, "title", "The title task of the first turn: sent as the question is, before its answer."),
        ("tags_task", first, "tags", "The tags task of the first turn: sent after the first answer."),
        ("follow_ups_task", first, "follow_ups", "The follow-up suggestions task of the first turn: after its answer."),
        ("follow_ups_task_second_turn", second, "follow_ups", "The follow-up suggestions task of the second turn."),
    ]
    return [
        save(out, name, fixture(only(entries, kind), description, **(order if name == "first_question" else {})))
        for name, entries, kind, description in described
    ]


def attachments(chat: ChatPage, recorder: Recorder, out: Path, workdir: Path) -> list[str]:
    """New chats with an image, then a text file, attached to the question."""
    names = []
    image = workdir / "red.png"
    image.write_bytes(red_png())
    text = workdir / "notes.txt"
    text.write_text("Chain-of-Note writes a reading note on each retrieved passage before it answers.\n")
    for path, name, description in (
        (image, "image_question", "A question with an image attached: `content` is a list of parts."),
        (text, "file_question", "A question with a text file attached: the file's tag is prepended to the text."),
    ):
        chat.new_chat()
        start = len(recorder.records)
        chat.page.locator("input[type='file'][multiple]").set_input_files(str(path))
        chat.page.wait_for_timeout(3000)  # the upload (and, for text, its embedding)
        chat.ask("What does this say?")
        chat.wait_for_reply(1, 60)
        time.sleep(3)
        entries = recorder.chats(start)
        tasks = [kind for kind in turn_kinds(entries) if kind != "question"]
        names.append(save(out, name, fixture(only(entries, "question"), description, tasks_sent=tasks)))
        if name == "file_question" and "queries" in tasks:
            description = "The retrieval query task, sent when a file is attached."
            names.append(save(out, "queries_task", fixture(only(entries, "queries"), description)))
    return names


def stop(chat: ChatPage, recorder: Recorder) -> dict[str, Any]:
    """Stop mid-answer (a token a second): does Open WebUI close the streamed request, and after how many tokens?"""
    chat.new_chat()
    start = len(recorder.records)
    recorder.token_seconds = 1.0
    try:
        chat.ask(FIRST_QUESTION)
        chat.page.locator("#response-content-container").first.wait_for(timeout=30_000)
        chat.page.wait_for_timeout(3000)
        chat.stop()
        wait_for(lambda: any(e["kind"] == "disconnected" for e in recorder.records[start:]), 30, "closed stream")
    except TimeoutError as error:
        return {"closed": False, "error": str(error)}
    finally:
        recorder.token_seconds = 0.05
    closed = next(e for e in recorder.records[start:] if e["kind"] == "disconnected")
    return {"closed": True, "after_tokens": closed["body"]["after_tokens"], "of": len(re.findall(r"\S+\s*", ANSWER))}


def forwarded(chat: ChatPage, recorder: Recorder, out: Path) -> list[str]:
    """With ENABLE_FORWARD_USER_INFO_HEADERS=true: the headers that name the user, chat and message."""
    start = len(recorder.records)
    chat.ask(FIRST_QUESTION)
    chat.wait_for_reply(1, 60)
    wait_for(lambda: any(task_name(e["body"]) == "title" for e in recorder.chats(start)), 60, "title task")
    entries = recorder.chats(start)
    setting = "with ENABLE_FORWARD_USER_INFO_HEADERS=true (not the default)"
    return [
        save(
            out,
            "first_question_forwarded_headers",
            fixture(only(entries, "question"), f"The first question {setting}."),
        ),
        save(out, "title_task_forwarded_headers", fixture(only(entries, "title"), f"The title task {setting}.")),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "open_webui")
    parser.add_argument("--raw", type=Path, default=None, help="every request as JSONL (default: a temporary file)")
    arguments = parser.parse_args()
    arguments.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="open-webui-capture-") as folder:
        raw = arguments.raw or Path(folder) / "requests.jsonl"
        seen = capture(arguments.out, raw, Path(folder))
    print(json.dumps(seen, indent=2))


if __name__ == "__main__":
    main()
