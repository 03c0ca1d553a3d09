"""
The chat endpoint under load and abuse, for real: `haystack-fusion serve` with `concat_pf` on the OpenAI backend
against the project's test server (`tests.support.openai_server`, 200 ms per call), driven by the `openai`
client and httpx.

- Load: 100 requests from 50 concurrent clients with a tight admission limit; each is answered or refused with 503
  and `Retry-After`, none hangs, and the LLM server never sees more calls at once than the limit.
- Load behind a key: 10% of the requests without it are refused with 401, the others answered, memory flat.
- Limits: a too long question, no user message, a body that is not JSON and a wrong model name get a 4xx.
- Backends that cannot be reached: 503 with one line in the user's terms (the log names the URL and variable), no
  traceback, no secret.

The full 1,000-request run with latency percentiles and the server's memory is `research/benchmarks/load.py`.
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from haystack import Document

from haystack_fusion.backends import save_store
from tests.support.openai_server import OpenAIServer
from tests.support.serve_process import HayhooksProcess, free_port

httpx = pytest.importorskip("httpx", reason="the `serve` extra")
pytest.importorskip("hayhooks", reason="the `serve` extra (pip install 'haystack-fusion[serve]')")
openai = pytest.importorskip("openai")

DOCUMENTS = [
    Document(content="Paris is the capital and largest city of France.", meta={"title": "Paris"}),
    Document(content="France is a country in Western Europe; its capital is Paris.", meta={"title": "France"}),
    Document(content="Berlin is the capital of Germany.", meta={"title": "Berlin"}),
]
QUESTION = "What is the capital of France?"
SECRET = "sk-canary-4f1d9a7e-do-not-log"
LIMITS = {
    "HAYSTACK_FUSION_MAX_REQUESTS": "8",
    "HAYSTACK_FUSION_MAX_WAITING": "16",
    "HAYSTACK_FUSION_QUEUE_TIMEOUT": "5",
    "HAYSTACK_FUSION_MAX_QUESTION_CHARS": "500",
}


def openai_env(index, base_url: str) -> dict[str, str]:
    return {
        "HAYSTACK_FUSION_LLM": "openai",
        "OPENAI_API_KEY": SECRET,
        "OPENAI_BASE_URL": base_url,
        "HAYSTACK_FUSION_MAX_RETRIES": "0",
        "HAYSTACK_FUSION_TIMEOUT": "10",
        "HAYSTACK_FUSION_DOCUMENT_STORE": "memory",
        "HAYSTACK_FUSION_STORE": str(index),
    }


def ask_once(env: dict[str, str], workdir) -> tuple[httpx.Response, str]:
    """Serve concat_pf with `env`, ask `QUESTION` on the chat endpoint once; the response and the server's log."""
    with HayhooksProcess(["concat_pf"], env=env, workdir=workdir) as process:
        response = httpx.post(
            f"{process.url}/v1/chat/completions",
            json={"model": "concat_pf", "messages": [{"role": "user", "content": QUESTION}]},
            timeout=60,
        )
        return response, process.log()


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    path = tmp_path_factory.mktemp("index") / "index.json"
    save_store(DOCUMENTS, path)
    return path


@pytest.fixture(scope="module")
def llm_server():
    with OpenAIServer(reply="Paris", latency=0.2, max_requests=2000, lifetime=600) as server:
        yield server


@pytest.fixture(scope="module")
def hayhooks(tmp_path_factory, index, llm_server):
    env = {**openai_env(index, llm_server.base_url), **LIMITS}
    with HayhooksProcess(["concat_pf"], env=env, workdir=tmp_path_factory.mktemp("hayhooks")) as process:
        yield process


async def _load(url: str, requests: int, clients: int) -> dict[str, list]:
    """`requests` chat completions from `clients` concurrent workers: outcomes by kind."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    outcomes: dict[str, list] = {"answered": [], "refused": [], "other": []}
    remaining = iter(range(requests))

    async def worker() -> None:
        for _ in remaining:
            start = time.monotonic()
            try:
                completion = await client.chat.completions.create(
                    model="concat_pf", messages=[{"role": "user", "content": QUESTION}]
                )
                outcomes["answered"].append((time.monotonic() - start, completion.choices[0].message.content))
            except openai.APIStatusError as error:
                kind = "refused" if error.status_code in (429, 503) else "other"
                detail = (error.response.json().get("error") or {}).get("message")
                outcomes[kind].append((error.status_code, error.response.headers.get("retry-after"), detail))
            except Exception as error:  # a timeout would be a hang: reported, not raised
                outcomes["other"].append((type(error).__name__, str(error)))

    try:
        await asyncio.gather(*(worker() for _ in range(clients)))
    finally:
        await client.close()
    return outcomes


class TestLoad:
    def test_every_request_is_answered_or_cleanly_refused(self, hayhooks, llm_server):
        llm_server.reset()
        outcomes = asyncio.run(_load(hayhooks.url, requests=100, clients=50))
        assert outcomes["other"] == []
        assert len(outcomes["answered"]) + len(outcomes["refused"]) == 100
        assert outcomes["answered"], "some requests are answered"
        assert outcomes["refused"], "50 clients against 8 running + 16 waiting: some are refused"
        assert all(text.startswith("Paris\n\nSources:\n[1] ") for _, text in outcomes["answered"])
        for status, retry_after, message in outcomes["refused"]:
            assert status == 503
            assert retry_after == "5"
            assert "The server is busy" in message
        assert llm_server.stats.max_in_flight <= 8
        assert llm_server.stats.requests == len(outcomes["answered"])  # one call each; a refusal costs none
        assert "Traceback" not in hayhooks.log()


KEY = "hf-load-key-91ad"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory, index, llm_server):
    env = {**openai_env(index, llm_server.base_url), "HAYSTACK_FUSION_API_KEY": KEY}
    with HayhooksProcess(["concat_pf"], env=env, workdir=tmp_path_factory.mktemp("keyed")) as process:
        yield process


async def _keyed_load(url: str, requests: int, clients: int) -> dict[str, list]:
    """`requests` chat completions from `clients` workers; every tenth without the key (none, or a wrong one)."""
    keyed = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)
    wrong = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="not-the-key", max_retries=0, timeout=60)
    outcomes: dict[str, list] = {"answered": [], "unauthorized": [], "other": []}
    remaining = iter(range(requests))

    async def worker() -> None:
        for number in remaining:
            unauthenticated = number % 10 == 9
            try:
                if unauthenticated and number % 20 == 9:  # no Authorization header at all
                    body = {"model": "concat_pf", "messages": [{"role": "user", "content": QUESTION}]}
                    async with httpx.AsyncClient(timeout=60) as client:
                        response = await client.post(f"{url}/v1/chat/completions", json=body)
                    kind = "unauthorized" if response.status_code == 401 else "other"
                    outcomes[kind].append((number, response.status_code))
                    continue
                client = wrong if unauthenticated else keyed
                completion = await client.chat.completions.create(
                    model="concat_pf", messages=[{"role": "user", "content": QUESTION}]
                )
                outcomes["other" if unauthenticated else "answered"].append((number, completion))
            except openai.AuthenticationError:
                outcomes["unauthorized" if unauthenticated else "other"].append((number, 401))
            except Exception as error:
                outcomes["other"].append((number, repr(error)))

    try:
        await asyncio.gather(*(worker() for _ in range(clients)))
    finally:
        await keyed.close()
        await wrong.close()
    return outcomes


class TestKeyedLoad:
    def test_unauthenticated_requests_are_refused_and_the_others_answered(self, keyed, llm_server):
        """200 requests from 20 clients, 10% without the key; then 200 more: the server's memory stays flat."""
        asyncio.run(_keyed_load(keyed.url, requests=200, clients=20))  # warm-up
        rss_before = keyed.rss_bytes()
        llm_server.reset()
        outcomes = asyncio.run(_keyed_load(keyed.url, requests=200, clients=20))
        rss_after = keyed.rss_bytes()
        print(
            f"answered {len(outcomes['answered'])}, 401 {len(outcomes['unauthorized'])}, other {outcomes['other']}; "
            f"RSS {rss_before / 2**20:.1f} -> {rss_after / 2**20:.1f} MiB"
        )
        assert outcomes["other"] == []
        assert sorted(number for number, _ in outcomes["unauthorized"]) == list(range(9, 200, 10))
        assert len(outcomes["answered"]) == 180
        assert llm_server.stats.requests == 180  # a refused request costs no LLM call
        assert rss_after - rss_before < 32 * 2**20
        assert "Traceback" not in keyed.log()


class TestLimits:
    def post(self, hayhooks, **kwargs):
        return httpx.post(f"{hayhooks.url}/v1/chat/completions", timeout=30, **kwargs)

    def test_too_long_question(self, hayhooks):
        messages = [{"role": "user", "content": "why " * 126}]
        response = self.post(hayhooks, json={"model": "concat_pf", "messages": messages})
        assert response.status_code == 400
        assert "The question has 503 characters; this server answers questions of at most 500" in response.text

    def test_no_user_message(self, hayhooks):
        for messages in ([], [{"role": "system", "content": "Be brief."}]):
            response = self.post(hayhooks, json={"model": "concat_pf", "messages": messages})
            assert response.status_code == 400
            assert "`messages` must end with a user message" in response.text

    def test_not_json(self, hayhooks):
        response = self.post(hayhooks, content=b"{not json", headers={"Content-Type": "application/json"})
        assert response.status_code == 400  # as OpenAI answers an invalid body
        assert response.json()["error"]["message"].startswith("Invalid request body: not valid JSON")

    def test_wrong_model(self, hayhooks):
        response = self.post(hayhooks, json={"model": "gpt-4o", "messages": [{"role": "user", "content": QUESTION}]})
        assert response.status_code == 404
        assert "Pipeline 'gpt-4o' not found" in response.text

    def test_no_traceback_in_any_answer_or_log(self, hayhooks):
        for body in ({"model": "concat_pf", "messages": []}, {"model": "x", "messages": []}):
            assert "Traceback" not in self.post(hayhooks, json=body).text
        assert "Traceback" not in hayhooks.log()
        assert SECRET not in hayhooks.log()


class TestUnreachableBackends:
    def test_elasticsearch_on_a_closed_port(self, tmp_path):
        """Deployed with a warning (the server may come up later); each request: 503, the log naming
        ELASTICSEARCH_URL."""
        pytest.importorskip("haystack_integrations.document_stores.elasticsearch", reason="the `elasticsearch` extra")
        es_port, llm_port = free_port(), free_port()
        env = {
            "HAYSTACK_FUSION_LLM": "openai",
            "OPENAI_API_KEY": SECRET,
            "OPENAI_BASE_URL": f"http://127.0.0.1:{llm_port}/v1",
            "HAYSTACK_FUSION_DOCUMENT_STORE": "elasticsearch",
            "ELASTICSEARCH_URL": f"http://elastic:{SECRET}@127.0.0.1:{es_port}",
            "ELASTIC_API_KEY": SECRET,
        }
        with HayhooksProcess(["concat_pf"], env=env, workdir=tmp_path) as process:
            chat = {"model": "concat_pf", "messages": [{"role": "user", "content": QUESTION}]}
            response = httpx.post(f"{process.url}/v1/chat/completions", json=chat, timeout=60)
            assert response.status_code == 503
            detail = response.json()["error"]["message"]
            assert detail == "The document store cannot be reached; try again later"
            response = httpx.post(f"{process.url}/concat_pf/run", json={"query": QUESTION}, timeout=60)
            assert response.status_code == 503
            assert response.json()["detail"] == detail
            open_webui = {"User-Agent": "Python/3.11 aiohttp/3.12.15"}  # gets the status events
            streamed = httpx.post(
                f"{process.url}/v1/chat/completions", json={**chat, "stream": True}, headers=open_webui, timeout=60
            )
            assert streamed.status_code == 200
            assert f"Failed: {detail}" in streamed.text  # the last status, then the error chunk
            assert '"code":"backend_unavailable"' in streamed.text
            log = process.log()
        assert f"Elasticsearch is not reachable at ELASTICSEARCH_URL=http://127.0.0.1:{es_port}: [Errno 111]" in log
        assert "deployed anyway" in log
        # one line per request: the user's message and the operator's cause, the OS's words as the async client got
        # them ("Connect call failed ('127.0.0.1', port)")
        cause = (
            rf" \(cause: cannot connect to Elasticsearch at http://127\.0\.0\.1:{es_port} \([^\n]+\): check "
            r"\$ELASTICSEARCH_URL, and that the server is running\)"
        )
        for line in (
            "Failed POST /v1/chat/completions: HTTP 503 backend_unavailable: ",
            "Failed POST /concat_pf/run: HTTP 503 backend_unavailable: ",
            "Ended a streamed reply with HTTP 503 backend_unavailable: ",
        ):
            assert len(re.findall(re.escape(line + detail) + cause, log)) == 1, line
        assert "Traceback" not in log
        assert SECRET not in log + response.text + streamed.text

    def test_openai_base_url_on_a_closed_port(self, tmp_path, index):
        port = free_port()
        env = openai_env(index, f"http://127.0.0.1:{port}/v1")
        with HayhooksProcess(["concat_pf"], env=env, workdir=tmp_path) as process:
            client = openai.OpenAI(base_url=f"{process.url}/v1", api_key="unused", max_retries=0, timeout=60)
            with pytest.raises(openai.APIStatusError) as error:
                client.chat.completions.create(model="concat_pf", messages=[{"role": "user", "content": QUESTION}])
            log = process.log()
        assert error.value.status_code == 503
        assert error.value.body == {
            "message": "The language model server cannot be reached; try again later",
            "type": "server_error",
            "code": "backend_unavailable",
            "param": None,
        }
        assert (
            f"cannot connect to the OpenAI-compatible server at http://127.0.0.1:{port}/v1 (Connection refused): check "
            "--api-base-url or $OPENAI_BASE_URL, and that the server is running"
        ) in log
        assert "Traceback" not in log
        assert SECRET not in log

    def test_a_wrong_openai_key(self, tmp_path, index):
        with OpenAIServer(api_key="the-right-key", lifetime=120) as server:
            base_url = server.base_url
            env = openai_env(index, base_url)
            response, log = ask_once(env, tmp_path)
        assert response.status_code == 503
        assert response.json()["error"]["message"] == (
            "The language model server refused this service's access (HTTP 401 Unauthorized); its operator has to fix "
            "it"
        )
        assert (
            f"the OpenAI-compatible server at {base_url} refused the API key in $OPENAI_API_KEY (HTTP 401): "
            "set $OPENAI_API_KEY to a valid key"
        ) in log
        assert "Traceback" not in log
        assert SECRET not in log + response.text

    def test_ollama_on_a_closed_port(self, tmp_path, index):
        pytest.importorskip("haystack_integrations.components.generators.ollama", reason="the `ollama` extra")
        port = free_port()
        env = {
            "HAYSTACK_FUSION_LLM": "ollama",
            "OLLAMA_HOST": f"http://127.0.0.1:{port}",
            "HAYSTACK_FUSION_DOCUMENT_STORE": "memory",
            "HAYSTACK_FUSION_STORE": str(index),
        }
        response, log = ask_once(env, tmp_path)
        assert response.status_code == 503
        assert response.json()["error"]["message"] == "The language model server cannot be reached; try again later"
        assert (
            f"cannot connect to Ollama at http://127.0.0.1:{port}: check $OLLAMA_HOST, and that `ollama serve` is "
            "running"
        ) in log
        assert f"Ollama is not reachable at OLLAMA_HOST=http://127.0.0.1:{port}" in log
        assert "Traceback" not in log

    @pytest.mark.parametrize("strategy", ["post_fusion", "sure"])
    def test_every_llm_call_failed_is_a_503_not_an_unknown_answer(self, monkeypatch, index, strategy):
        """These strategies record each failed call as an abstention; when all failed, the wrapper answers 503."""
        from fastapi import HTTPException

        from haystack_fusion.serving.hayhooks import StrategyPipelineWrapper

        port = free_port()
        for variable, value in openai_env(index, f"http://127.0.0.1:{port}/v1").items():
            monkeypatch.setenv(variable, value)

        class Wrapper(StrategyPipelineWrapper):
            pass

        Wrapper.strategy = strategy

        wrapper = Wrapper()
        wrapper.setup()
        with pytest.raises(HTTPException) as error:
            asyncio.run(wrapper.run_api_async(QUESTION))
        assert error.value.status_code == 503
        assert error.value.detail == "The language model server cannot be reached; try again later"
