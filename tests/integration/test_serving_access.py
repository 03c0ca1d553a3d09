"""
Who can reach `haystack-fusion serve`, for real: servers on 127.0.0.1 over the embedded model, driven by real clients
(httpx, the `openai` client, the MCP client).

- Nothing deploys at run time: `POST /deploy_files` with a wrapper whose `setup()` writes a file, `/deploy-yaml` and
  `/undeploy/{name}` find no route (and a web page of another origin is refused before that); over MCP there is no
  deploy tool and calling one fails. The file is never written.
- A request from another web origin gets 403, its CORS preflight too; the origins of `HAYSTACK_FUSION_CORS_ORIGINS`
  pass (`test_chat_ui_origin.py` sweeps every route, the chat UI's included).
- With `HAYSTACK_FUSION_API_KEY` set, every route but `GET /status` answers 401 (one line) without the key, and the
  OpenAI client with `api_key=<key>` is answered; the MCP endpoint too.
- Each strategy's MCP tool carries its own description (`Strategy.description`).
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest

from haystack_fusion.backends import save_store
from haystack_fusion.serving.app import UNAUTHORIZED
from haystack_fusion.strategies import STRATEGIES
from tests.support.serve_process import HayhooksProcess

from .conftest import local_serving_env

httpx = pytest.importorskip("httpx", reason="the `serve` extra")
pytest.importorskip("hayhooks", reason="the `serve` extra (pip install 'haystack-fusion[serve]')")
openai = pytest.importorskip("openai")
pytest.importorskip("mcp", reason="Hayhooks' `mcp` extra (the `serve` extra installs it)")
from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

KEY = "hf-test-key-7c1e0b"
ALLOWED_ORIGIN = "https://app.example.com"
EVIL_ORIGIN = "http://evil.example"
MCP_STRATEGIES = ["concatenation", "cascade", "sure"]


def hostile_wrapper(marker: Path) -> str:
    """A wrapper whose `setup()` writes `marker`: deploying it would run code on the server."""
    return (
        "from pathlib import Path\n"
        "from hayhooks import BasePipelineWrapper\n\n\n"
        "class PipelineWrapper(BasePipelineWrapper):\n"
        "    def setup(self) -> None:\n"
        f"        Path({str(marker)!r}).write_text('deployed')\n\n"
        "    def run_api(self, query: str) -> str:\n"
        "        return query\n"
    )


EMPTY_YAML = "components: {}\nconnections: []\n"
"""A YAML pipeline with nothing in it: `/deploy-yaml` must find no route for it either."""


@pytest.fixture(scope="module")
def env(tmp_path_factory, squad) -> dict[str, str]:
    index = tmp_path_factory.mktemp("access") / "index.json"
    save_store(squad[0], index)
    return local_serving_env(index)


@pytest.fixture(scope="module")
def open_server(tmp_path_factory, env):
    """The documented command with no key set."""
    with HayhooksProcess(["concatenation"], env=env, workdir=tmp_path_factory.mktemp("open")) as process:
        yield process


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory, env):
    """The documented command with a key and one allowed origin."""
    keyed = {**env, "HAYSTACK_FUSION_API_KEY": KEY, "HAYSTACK_FUSION_CORS_ORIGINS": ALLOWED_ORIGIN}
    with HayhooksProcess(["concatenation"], env=keyed, workdir=tmp_path_factory.mktemp("keyed")) as process:
        yield process


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory, env):
    with HayhooksProcess(MCP_STRATEGIES, env=env, workdir=tmp_path_factory.mktemp("mcp"), args=("--mcp",)) as process:
        yield process


@pytest.fixture(scope="module")
def keyed_mcp_server(tmp_path_factory, env):
    keyed = {**env, "HAYSTACK_FUSION_API_KEY": KEY}
    workdir = tmp_path_factory.mktemp("keyed_mcp")
    with HayhooksProcess(["concatenation"], env=keyed, workdir=workdir, args=("--mcp",)) as process:
        yield process


def preflight(url: str, origin: str) -> httpx.Response:
    headers = {"Origin": origin, "Access-Control-Request-Method": "POST"}
    return httpx.options(url, headers={**headers, "Access-Control-Request-Headers": "content-type"}, timeout=10)


def deploy_attempts(url: str, marker: Path, headers: dict[str, str] | None = None) -> list[httpx.Response]:
    """The deploy, deploy-YAML and undeploy requests."""
    headers = headers or {}
    files = {"pipeline_wrapper.py": hostile_wrapper(marker)}
    return [
        httpx.post(f"{url}/deploy_files", json={"name": "pwned", "files": files, "overwrite": True}, headers=headers),
        httpx.post(f"{url}/deploy-yaml", json={"name": "pwned", "source_code": EMPTY_YAML}, headers=headers),
        httpx.post(f"{url}/undeploy/concatenation", headers=headers),
        httpx.delete(f"{url}/undeploy/concatenation", headers=headers),
    ]


async def mcp_session(url: str, work, headers: dict[str, str] | None = None):
    async with (
        httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=300)) as http_client,
        streamable_http_client(f"{url}/mcp", http_client=http_client) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        return await work(session)


class TestNothingDeploys:
    def test_a_cross_origin_preflight_is_refused(self, open_server):
        for path in ("/deploy_files", "/v1/chat/completions", "/concatenation/run"):
            response = preflight(f"{open_server.url}{path}", EVIL_ORIGIN)
            print(path, response.status_code, dict(response.headers))
            assert response.status_code == 403
            assert "access-control-allow-origin" not in response.headers

    def test_deploy_routes_are_absent_and_nothing_is_written(self, open_server, tmp_path):
        marker = tmp_path / "deployed.txt"
        responses = deploy_attempts(open_server.url, marker)
        print([(response.request.method, response.request.url.path, response.status_code) for response in responses])
        assert all(response.status_code in (404, 405) for response in responses)
        from_a_page = deploy_attempts(open_server.url, marker, {"Origin": EVIL_ORIGIN})
        assert [response.status_code for response in from_a_page] == [403] * len(from_a_page)
        assert not marker.exists()
        models = httpx.get(f"{open_server.url}/v1/models", timeout=10).json()["data"]
        assert [model["id"] for model in models] == ["concatenation"]

    def test_status_says_only_that_the_server_is_up(self, open_server, keyed_server):
        for server in (open_server, keyed_server):
            response = httpx.get(f"{server.url}/status", timeout=10)
            assert response.status_code == 200
            assert response.json() == {"status": "Up!"}

    def test_no_deploy_tool_over_mcp(self, mcp_server, tmp_path):
        marker = tmp_path / "deployed.txt"

        async def work(session):
            tools = (await session.list_tools()).tools
            result = await session.call_tool(
                "deploy_pipeline", {"name": "pwned", "files": {"pipeline_wrapper.py": hostile_wrapper(marker)}}
            )
            undeploy = await session.call_tool("undeploy_pipeline", {"pipeline_name": "concatenation"})
            return tools, result, undeploy

        tools, result, undeploy = asyncio.run(mcp_session(mcp_server.url, work))
        names = [tool.name for tool in tools]
        print(names, result.content[0].text)
        assert "deploy_pipeline" not in names
        assert "undeploy_pipeline" not in names
        assert result.isError
        assert undeploy.isError
        assert "durable mode" in result.content[0].text
        assert not marker.exists()


class TestToolDescriptions:
    def test_each_strategy_is_a_tool_with_its_own_description(self, mcp_server):
        async def work(session):
            return (await session.list_tools()).tools

        tools = {tool.name: tool for tool in asyncio.run(mcp_session(mcp_server.url, work))}
        for tool in tools.values():
            print(f"{tool.name}: {tool.description}")
        assert set(tools) == {*MCP_STRATEGIES, "get_all_pipeline_statuses", "get_pipeline_status"}
        descriptions = [tools[name].description for name in MCP_STRATEGIES]
        assert descriptions == [STRATEGIES[name].description for name in MCP_STRATEGIES]
        assert len(set(descriptions)) == len(descriptions)
        assert "arXiv:2404.13081" in tools["sure"].description
        assert "1+2K+K(K-1) in 3 rounds" in tools["sure"].description
        assert tools["concatenation"].inputSchema["required"] == ["query"]

    def test_a_strategy_tool_answers(self, mcp_server, questions):
        async def work(session):
            return await session.call_tool("concatenation", {"query": questions[2].question})

        result = asyncio.run(mcp_session(mcp_server.url, work))
        assert not result.isError, result.content
        assert '"answer"' in result.content[0].text
        assert '"sources"' in result.content[0].text


class TestKey:
    def test_openai_client_without_the_key_gets_401(self, keyed_server, questions):
        for api_key in ("not-the-key", KEY[:-1]):
            client = openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key=api_key, max_retries=0)
            with pytest.raises(openai.AuthenticationError) as error:
                client.chat.completions.create(
                    model="concatenation", messages=[{"role": "user", "content": questions[2].question}]
                )
            assert error.value.status_code == 401
            assert error.value.body["code"] == "invalid_api_key"  # OpenAI's error shape: the client reads it
            assert "send the API key as Authorization: Bearer <key>" in error.value.message
            assert b"\n" not in error.value.response.content

    def test_openai_client_with_the_key_is_answered(self, keyed_server, questions):
        client = openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key=KEY, max_retries=0)
        completion = client.chat.completions.create(
            model="concatenation", messages=[{"role": "user", "content": questions[2].question}]
        )
        assert "\n\nSources:\n[1] " in completion.choices[0].message.content

    def test_every_route_but_status_needs_the_key(self, keyed_server, tmp_path):
        url = keyed_server.url
        refused = [
            httpx.get(f"{url}/v1/models"),
            httpx.post(f"{url}/concatenation/run", json={"query": "Who?"}),
            httpx.get(f"{url}/docs"),
            httpx.get(f"{url}/openapi.json"),
            httpx.get(f"{url}/status/concatenation"),
            httpx.get(f"{url}/traces"),
            httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer"}),
            httpx.get(f"{url}/v1/models", headers={"Authorization": f"Basic {base64.b64encode(b'u:no').decode()}"}),
            *deploy_attempts(url, tmp_path / "deployed.txt"),
        ]
        assert [response.status_code for response in refused] == [401] * len(refused)
        openai_routes = [response for response in refused if response.url.path.startswith("/v1/")]
        assert len(openai_routes) == 3
        assert all(response.json()["error"]["code"] == "invalid_api_key" for response in openai_routes)
        assert all(response.json() == {"detail": UNAUTHORIZED} for response in refused if response not in openai_routes)
        assert all(response.headers["www-authenticate"] == "Bearer" for response in refused)
        assert not (tmp_path / "deployed.txt").exists()

    def test_the_key_opens_the_routes_but_not_deployment(self, keyed_server, tmp_path):
        bearer = {"Authorization": f"Bearer {KEY}"}
        basic = {"Authorization": f"Basic {base64.b64encode(f'anyone:{KEY}'.encode()).decode()}"}
        assert httpx.get(f"{keyed_server.url}/v1/models", headers=bearer).status_code == 200
        assert httpx.get(f"{keyed_server.url}/v1/models", headers=basic).status_code == 200
        run = httpx.post(f"{keyed_server.url}/concatenation/run", json={"query": "Who?"}, headers=bearer, timeout=120)
        assert run.status_code == 200, run.text
        marker = tmp_path / "deployed.txt"
        assert all(response.status_code in (404, 405) for response in deploy_attempts(keyed_server.url, marker, bearer))
        assert not marker.exists()

    def test_cors_allows_the_configured_origin_only(self, keyed_server):
        allowed = preflight(f"{keyed_server.url}/v1/chat/completions", ALLOWED_ORIGIN)
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
        assert allowed.headers["access-control-allow-methods"] == "GET, POST"
        refused = preflight(f"{keyed_server.url}/v1/chat/completions", EVIL_ORIGIN)
        assert refused.status_code == 403
        assert "access-control-allow-origin" not in refused.headers

    def test_mcp_needs_the_key(self, keyed_mcp_server):
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        headers = {"Accept": "application/json, text/event-stream"}
        response = httpx.post(f"{keyed_mcp_server.url}/mcp/", json=initialize, headers=headers)
        assert response.status_code == 401
        assert response.json() == {"detail": UNAUTHORIZED}
        assert httpx.get(f"{keyed_mcp_server.url}/status").json() == {"status": "ok"}

        async def work(session):
            return [tool.name for tool in (await session.list_tools()).tools]

        names = asyncio.run(mcp_session(keyed_mcp_server.url, work, {"Authorization": f"Bearer {KEY}"}))
        assert "concatenation" in names

    def test_mcp_refuses_other_web_origins_and_hosts(self, keyed_mcp_server):
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {KEY}"}
        url = f"{keyed_mcp_server.url}/mcp/"
        assert httpx.post(url, json=initialize, headers={**headers, "Origin": EVIL_ORIGIN}).status_code == 403
        assert httpx.post(url, json=initialize, headers={**headers, "Host": "evil.example"}).status_code == 400
        assert httpx.post(url, json=initialize, headers=headers).status_code == 200  # an MCP client sends no Origin
