"""
The Origin rule on every transport, for real: `haystack-fusion serve --with-chainlit` (no key, one allowed origin) on
127.0.0.1, its LLM the package's OpenAI-compatible test server, met by httpx and by a hostile page in Chromium.

- Every served route, the chat UI's socket.io long-polling and the CORS preflights included, answers a request from a
  foreign `Origin` (another site, another port, `null`) with 403 and no `access-control-allow-*` header for it.
- No `Origin` (API clients), the server's own origin and the configured origin pass; a configured origin's preflight
  is answered by CORS.
- A page served from another local port, in Debian's Chromium, tries the socket.io polling handshake (fetch and XHR
  with credentials), the socket.io WebSocket and `POST /v1/chat/completions`: it reads nothing, opens no session and
  no LLM call is made, while the chat UI at the server's own origin still connects.

The browser reaches nothing but 127.0.0.1 (`CHROMIUM_FLAGS`, `local_only`), as in `test_chat_ui.py`.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from haystack import Document

from haystack_fusion.backends import save_store
from tests.file_server import FileServer
from tests.support.openai_server import OpenAIServer
from tests.support.serve_process import HayhooksProcess

from .open_webui import CHROMIUM, CHROMIUM_FLAGS, local_only

httpx = pytest.importorskip("httpx", reason="the `serve` extra")
pytest.importorskip("hayhooks", reason="the `serve` extra (pip install 'haystack-fusion[serve]')")
if importlib.util.find_spec("chainlit") is None:  # not imported here: importing it writes .chainlit/ into the cwd
    pytest.skip("Chainlit: make install-chat-ui (pip install -c constraints/chainlit.txt ...)", allow_module_level=True)

ALLOWED_ORIGIN = "https://app.example.com"
FOREIGN_ORIGINS = ["http://evil.example", "null", "http://127.0.0.1:1"]  # another site, a sandboxed page, another port
REPLY = "the majority vote"
QUESTION = "What does post-fusion answer with?"
POLLING = "/chat/ws/socket.io/?EIO=4&transport=polling"
FORBIDDEN = "Forbidden: requests from other web origins are refused"


@pytest.fixture(scope="module")
def llm():
    with OpenAIServer(reply=REPLY, lifetime=900) as server:
        yield server


@pytest.fixture(scope="module")
def chat_ui(tmp_path_factory, llm) -> str:
    """`haystack-fusion serve --with-chainlit --strategy concatenation`, no key, `ALLOWED_ORIGIN` allowed."""
    root = tmp_path_factory.mktemp("chat_ui_origin")
    index = root / "index.json"
    save_store([Document(content="Post-fusion answers with the majority vote of the replies.")], index)
    env = {
        "HAYSTACK_FUSION_LLM": "openai",
        "HAYSTACK_FUSION_DOCUMENT_STORE": "memory",
        "HAYSTACK_FUSION_STORE": str(index),
        "OPENAI_BASE_URL": llm.base_url,
        "OPENAI_API_KEY": "x",
        "HAYSTACK_FUSION_MAX_RETRIES": "0",
        "HAYSTACK_FUSION_CORS_ORIGINS": ALLOWED_ORIGIN,
        "HAYHOOKS_CHAINLIT_DEFAULT_MODEL": "concatenation",
    }
    with HayhooksProcess(["concatenation"], env=env, workdir=root, args=("--with-chainlit",)) as process:
        yield process.url


def handshake(url: str, headers: dict[str, str] | None = None) -> httpx.Response:
    """The socket.io long-polling handshake, which opens an Engine.IO session: `0{"sid": ...}`."""
    return httpx.get(f"{url}{POLLING}", headers=headers, timeout=10)


def sweep(url: str, origin: str) -> list[httpx.Response]:
    """One request from `origin` to each route the app serves, the chat UI's and the CORS preflights among them."""
    sid = json.loads(handshake(url).text[1:])["sid"]  # a session opened by a client that is not a web page
    chat = {"model": "concatenation", "messages": [{"role": "user", "content": QUESTION}]}
    preflight = {"Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "x"}
    headers = {"Origin": origin}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        return [
            client.get(POLLING),
            client.post(f"{POLLING}&sid={sid}", content=b"40", headers={"Content-Type": "text/plain;charset=UTF-8"}),
            client.get("/chat/"),
            client.get("/chat/project/settings?language=en-US"),
            client.post("/v1/chat/completions", json=chat),
            client.post("/v1/chat/completions", content=json.dumps(chat), headers={"Content-Type": "text/plain"}),
            client.get("/v1/models"),
            client.post("/concatenation/run", json={"query": QUESTION}),
            client.get("/status"),
            client.get("/docs"),
            client.get("/openapi.json"),
            *(
                client.options(path, headers=preflight)
                for path in (POLLING, "/chat/project/settings", "/v1/chat/completions", "/concatenation/run")
            ),
        ]


def allows(response: httpx.Response, origin: str) -> bool:
    """Whether a response lets a page of `origin` read it (or send credentials)."""
    allowed = response.headers.get("access-control-allow-origin")
    credentials = response.headers.get("access-control-allow-credentials", "").lower() == "true"
    return allowed in (origin, "*") or credentials


class TestEveryRoute:
    @pytest.mark.parametrize("origin", FOREIGN_ORIGINS)
    def test_a_foreign_origin_is_refused_everywhere_and_allowed_nowhere(self, chat_ui, llm, origin):
        calls = llm.stats.requests
        responses = sweep(chat_ui, origin)
        for response in responses:
            cors = {name: value for name, value in response.headers.items() if name.startswith("access-control-")}
            print(response.request.method, response.request.url.path, response.status_code, cors)
        assert [response.status_code for response in responses] == [403] * len(responses)
        assert not [response for response in responses if allows(response, origin)]
        assert all(FORBIDDEN in response.text for response in responses)
        assert llm.stats.requests == calls  # no question reached the LLM

    def test_an_openai_route_refuses_in_openais_shape(self, chat_ui):
        response = httpx.get(f"{chat_ui}/v1/models", headers={"Origin": "http://evil.example"}, timeout=10)
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "bad_origin"

    def test_no_origin_the_own_and_the_allowed_origin_pass(self, chat_ui):
        for headers in ({}, {"Origin": chat_ui}, {"Origin": ALLOWED_ORIGIN}):
            response = handshake(chat_ui, headers)
            assert response.status_code == 200, (headers, response.text)
            assert response.text.startswith('0{"sid":')
        assert httpx.get(f"{chat_ui}/v1/models", headers={"Origin": chat_ui}, timeout=10).status_code == 200

    def test_the_allowed_origins_preflight_is_answered_by_cors(self, chat_ui):
        headers = {"Origin": ALLOWED_ORIGIN, "Access-Control-Request-Method": "POST"}
        response = httpx.options(f"{chat_ui}/v1/chat/completions", headers=headers, timeout=10)
        assert response.status_code == 200
        assert response.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
        assert "access-control-allow-credentials" not in response.headers


HOSTILE_PAGE = """<!doctype html>
<meta charset="utf-8"><title>hostile</title><pre id="report"></pre>
<script>
const target = TARGET;
const polling = target + "/chat/ws/socket.io/?EIO=4&transport=polling";
const chat = JSON.stringify({model: "concatenation", messages: [{role: "user", content: QUESTION}]});

function read(request) {  // what the page's script can see of a fetch
  return request.then(
    async (response) => ({status: response.status, type: response.type, body: await response.text()}),
    (error) => ({error: String(error)}),
  );
}

function xhr(method, url, body) {
  return new Promise((resolve) => {
    const request = new XMLHttpRequest();
    request.open(method, url);
    request.withCredentials = true;
    request.onload = () => resolve({status: request.status, body: request.responseText});
    request.onerror = () => resolve({error: "network error", status: request.status, body: request.responseText});
    request.send(body ?? null);
  });
}

function websocket(url) {
  return new Promise((resolve) => {
    const seen = {opened: false, messages: []};
    const socket = new WebSocket(url);
    socket.onopen = () => { seen.opened = true; socket.send("40"); };
    socket.onmessage = (event) => seen.messages.push(String(event.data));
    socket.onclose = (event) => resolve({...seen, code: event.code});
    setTimeout(() => { socket.close(); resolve({...seen, timedOut: true}); }, 10000);
  });
}

async function attack() {
  const report = {};
  report.pollingFetch = await read(fetch(polling, {credentials: "include"}));
  report.pollingXhr = await xhr("GET", polling);
  const sid = ((report.pollingFetch.body || report.pollingXhr.body || "").match(/"sid":"([^"]+)"/) || [])[1];
  if (sid) {  // the handshake was read: join the session as Chainlit's client does
    report.connect = await xhr("POST", polling + "&sid=" + sid, "40");
    report.packets = await xhr("GET", polling + "&sid=" + sid);
  }
  report.pollingPost = await xhr("POST", polling, "40");
  report.websocket = await websocket(polling.replace("http://", "ws://").replace("=polling", "=websocket"));
  const json = {"Content-Type": "application/json"};
  report.completions = await read(fetch(target + "/v1/chat/completions",
    {method: "POST", credentials: "include", headers: json, body: chat}));
  report.completionsSimple = await read(fetch(target + "/v1/chat/completions",
    {method: "POST", credentials: "include", headers: {"Content-Type": "text/plain"}, body: chat}));
  report.completionsNoCors = await read(fetch(target + "/v1/chat/completions",
    {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: chat}));
  document.getElementById("report").textContent = JSON.stringify(report);
  document.title = "done";
}
attack();
</script>
"""


def hostile_page(target: str) -> bytes:
    page = HOSTILE_PAGE.replace("TARGET", json.dumps(target)).replace("QUESTION", json.dumps(QUESTION))
    return page.encode()


def test_a_page_of_another_origin_reads_nothing_and_the_chat_ui_still_works(chat_ui, llm):
    if CHROMIUM is None:
        pytest.skip("no Chromium: apt-get install chromium (make install-chat-ui), or set HAYSTACK_FUSION_CHROMIUM")
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright's Python driver (the `dev` extra)")
    blocked: list[str] = []
    answered: list[tuple[str, str, int]] = []  # what the app answered the hostile page's requests, as the browser saw

    with FileServer({"/hostile.html": hostile_page(chat_ui)}) as pages, sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page()
            page.route("**/*", local_only(blocked))
            network = page.context.new_cdp_session(page)  # the raw responses, those CORS hides from the page too
            network.send("Network.enable")
            sent: dict[str, tuple[str, str]] = {}
            network.on(
                "Network.requestWillBeSent",
                lambda event: sent.update({event["requestId"]: (event["request"]["method"], event["request"]["url"])}),
            )
            network.on(
                "Network.responseReceivedExtraInfo",
                lambda event: answered.append((*sent.get(event["requestId"], ("?", "")), event["statusCode"])),
            )
            console: list[str] = []
            page.on("console", lambda message: console.append(message.text))
            calls = llm.stats.requests
            page.goto(pages.url("/hostile.html"), wait_until="domcontentloaded")
            page.wait_for_function("document.title === 'done'", timeout=60_000)
            report = json.loads(page.inner_text("#report"))
            hostile_calls = llm.stats.requests - calls

            # the same browser at the server's own origin: the chat UI opens its socket.io session and starts a chat
            # (test_chat_ui.py asks it a question)
            own = browser.new_page()
            own.route("**/*", local_only(blocked))
            own_socket: list[int] = []
            own.on(
                "response",
                lambda response: own_socket.append(response.status) if "/chat/ws/socket.io/" in response.url else None,
            )
            own.goto(f"{chat_ui}/chat/", wait_until="domcontentloaded")
            own.get_by_text("Connected to concatenation").wait_for(timeout=60_000)
        finally:
            browser.close()

    print(json.dumps(report, indent=1))
    print(answered, console, own_socket, blocked)
    readable = json.dumps(report)
    assert "sid" not in readable  # no Engine.IO session was opened for it
    assert REPLY not in readable
    assert FORBIDDEN not in readable  # not even the refusal: CORS hides every answer from the script
    for name in ("pollingFetch", "completions", "completionsSimple"):
        assert "error" in report[name], (name, report[name])
    for name in ("pollingXhr", "pollingPost"):
        assert (report[name]["status"], report[name]["body"]) == (0, ""), (name, report[name])
    assert "connect" not in report
    assert report["completionsNoCors"] == {"status": 0, "type": "opaque", "body": ""}
    assert (report["websocket"]["opened"], report["websocket"]["messages"]) == (False, [])
    assert hostile_calls == 0
    refused = [status for _, url, status in answered if url.startswith(chat_ui)]  # before the app ran
    assert len(refused) >= 6, answered
    assert set(refused) == {403}, answered
    assert any("Unexpected response code: 403" in message for message in console), console  # the WebSocket
    assert own_socket, "the chat UI's socket.io requests"
    assert set(own_socket) <= {101, 200}, own_socket
