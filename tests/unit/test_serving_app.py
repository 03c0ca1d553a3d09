"""The served app's access rules (`settings.AccessSettings`, `serving.app.ApiKeyMiddleware`) and tool descriptions."""

from __future__ import annotations

import base64

import pytest

from haystack_fusion.cli import main
from haystack_fusion.settings import AccessSettings
from haystack_fusion.strategies import PAPERS, STRATEGIES, cite

pytest.importorskip("hayhooks", reason="the `serve` extra (pip install 'haystack-fusion[serve]')")
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect

from haystack_fusion.serving.app import UNAUTHORIZED, ApiKeyMiddleware
from haystack_fusion.serving.hayhooks import StrategyPipelineWrapper

KEY = "k3y-for-tests"


async def _echo(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.send_text("hello")
    await websocket.close()


@pytest.fixture
def client() -> TestClient:
    async def ok(_):
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[
            Route("/status", ok),
            Route("/v1/models", ok, methods=["GET", "OPTIONS"]),
            Route("/chat/{rest:path}", ok),
            WebSocketRoute("/chat/ws", _echo),
        ]
    )
    return TestClient(ApiKeyMiddleware(app, api_key=KEY, browser_paths=("/chat",)))


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": f"Basic {base64.b64encode(f'{user}:{password}'.encode()).decode()}"}


class TestApiKeyMiddleware:
    def test_status_is_open(self, client):
        assert client.get("/status").status_code == 200

    @pytest.mark.parametrize(
        "headers",
        [
            {},
            {"Authorization": "Bearer"},
            {"Authorization": "Bearer wrong"},
            {"Authorization": f"Bearer {KEY}x"},
            {"Authorization": KEY},
            {"Authorization": "Basic not-base64!"},
            basic("user", "wrong"),
        ],
    )
    def test_without_the_key_401_one_line(self, client, headers):
        response = client.get("/chat/page", headers=headers)
        assert response.status_code == 401
        assert response.json() == {"detail": UNAUTHORIZED}
        response = client.get("/v1/models", headers=headers)
        assert response.status_code == 401
        assert response.json() == {  # OpenAI's shape on the OpenAI-compatible routes
            "error": {
                "message": "Unauthorized: send the API key as Authorization: Bearer <key>",
                "type": "authentication_error",
                "code": "invalid_api_key",
                "param": None,
            }
        }
        assert response.headers["www-authenticate"] == "Bearer"

    @pytest.mark.parametrize("headers", [{"Authorization": f"Bearer {KEY}"}, {"Authorization": f"bearer {KEY}"}])
    def test_bearer_key(self, client, headers):
        assert client.get("/v1/models", headers=headers).text == "ok"

    def test_basic_with_the_key_as_password(self, client):
        assert client.get("/v1/models", headers=basic("anyone", KEY)).text == "ok"
        assert client.get("/v1/models", headers=basic("", KEY)).text == "ok"

    def test_the_chat_ui_asks_a_browser_for_basic_credentials(self, client):
        response = client.get("/chat/")
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == 'Basic realm="haystack-fusion", charset="UTF-8"'

    def test_a_preflight_passes_to_the_cors_middleware(self, client):
        headers = {"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST"}
        assert client.options("/v1/models", headers=headers).status_code == 200
        assert client.options("/v1/models").status_code == 401  # not a preflight

    def test_a_websocket_without_the_key_is_closed_before_it_opens(self, client):
        with pytest.raises(WebSocketDisconnect) as closed, client.websocket_connect("/chat/ws"):
            pass
        assert closed.value.code == 1008
        with client.websocket_connect("/chat/ws", headers={"Authorization": f"Bearer {KEY}"}) as websocket:
            assert websocket.receive_text() == "hello"

    def test_paths_are_matched_below_the_root_path(self):
        async def ok(_):
            return PlainTextResponse("ok")

        app = ApiKeyMiddleware(Starlette(routes=[Route("/status", ok)]), api_key=KEY)
        client = TestClient(app, root_path="/fusion")
        assert client.get("/fusion/status").status_code == 200


class TestToolDescriptions:
    def test_every_strategy_has_its_own_one_line_description(self):
        descriptions = [strategy.description for strategy in STRATEGIES.values()]
        assert len(set(descriptions)) == len(STRATEGIES)
        for strategy in STRATEGIES.values():
            assert "\n" not in strategy.description
            assert f"with {strategy.name}: {strategy.summary}." in strategy.description
            assert f"LLM calls per question: {strategy.calls} in {strategy.rounds} round" in strategy.description
            assert "paper 0" not in strategy.description.split("Source:")[1]
            assert "arXiv:" in strategy.description

    def test_cite_spells_out_each_paper(self):
        assert cite("Liu et al., section 3.3 + Kim et al., Eq. 4") == (
            "Liu et al. (arXiv:2308.12574), section 3.3 + Kim et al. (arXiv:2404.13081), Eq. 4"
        )
        assert PAPERS["Yu et al."] == "2311.09210"

    def test_a_wrapper_subclass_describes_its_strategy(self):
        class Wrapper(StrategyPipelineWrapper):
            strategy = "sure"

        doc = Wrapper.run_api_async.__doc__ or ""
        assert doc.splitlines()[0] == STRATEGIES["sure"].description
        assert ":param query: The question." in doc

    def test_a_wrapper_of_an_unknown_strategy_fails_at_once(self):
        with pytest.raises(ValueError, match="Unknown strategy 'nope'"):

            class Wrapper(StrategyPipelineWrapper):
                strategy = "nope"


class TestServeCommand:
    def test_the_chat_ui_is_not_part_of_the_mcp_app(self, capsys):
        assert main(["serve", "--mcp", "--with-chainlit"]) == 2
        assert "The chat UI is part of the HTTP app" in capsys.readouterr().err

    def test_without_a_backend_it_says_what_is_missing(self, capsys, monkeypatch):
        for variable in ("HAYSTACK_FUSION_LLM", "HAYSTACK_FUSION_DOCUMENT_STORE"):
            monkeypatch.delenv(variable, raising=False)
        assert main(["serve", "--strategy", "cascade"]) == 1
        assert "HAYSTACK_FUSION_LLM is not set" in capsys.readouterr().err

    def test_a_wildcard_origin_is_refused(self, capsys, monkeypatch):
        monkeypatch.setenv("HAYSTACK_FUSION_CORS_ORIGINS", "*")
        assert main(["serve"]) == 2
        assert "HAYSTACK_FUSION_CORS_ORIGINS: '*' is not a web origin" in capsys.readouterr().err


def test_the_chat_ui_without_chainlit_says_what_to_install(monkeypatch):
    import importlib.util

    from haystack_fusion.serving import app

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "chainlit" else find_spec(name, *a)
    )
    with pytest.raises(ImportError, match=r"The chat UI needs Chainlit: pip install -c constraints/chainlit.txt"):
        app.create_app(["concatenation"], with_chainlit=True, access=AccessSettings())


def test_the_chat_ui_gets_the_elements(monkeypatch, tmp_path):
    from hayhooks.settings import settings

    from haystack_fusion.serving import app
    from haystack_fusion.serving.hayhooks import CHAINLIT_ELEMENTS_DIR

    for name in ("durable_mode", "pipelines_dir", "cors_allow_origins", "cors_allow_origin_regex", "host"):
        monkeypatch.setattr(settings, name, getattr(settings, name))
    for name in ("cors_allow_methods", "cors_allow_headers", "cors_allow_credentials", "chainlit_enabled"):
        monkeypatch.setattr(settings, name, getattr(settings, name))
    monkeypatch.setattr(settings, "chainlit_custom_elements_dir", "")
    assert app._pin_hayhooks_settings(str(tmp_path), AccessSettings(), with_chainlit=True) is settings
    assert settings.chainlit_custom_elements_dir == str(CHAINLIT_ELEMENTS_DIR)


@pytest.mark.parametrize("api_key", [None, KEY])
def test_the_chat_uis_calls_say_whose_they_are_and_carry_the_key(api_key):
    from haystack_fusion.serving.app import ChatUiMiddleware
    from haystack_fusion.serving.protocol import CHAT_UI_CLIENT, CHAT_UI_HEADER

    async def headers(request):
        return PlainTextResponse(f"{request.headers.get(CHAT_UI_HEADER)} {request.headers.get('authorization')}")

    inner = Starlette(routes=[Route("/v1/models", headers)])
    client = TestClient(ChatUiMiddleware(inner, token="t0ken", api_key=api_key))
    bearer = None if api_key is None else f"Bearer {api_key}"
    # as httpx sends the chat UI's calls to Hayhooks' chainlit_base_url: http://chainlit:<token>@host:port
    assert client.get("/v1/models", headers=basic(CHAT_UI_CLIENT, "t0ken")).text == f"{CHAT_UI_CLIENT} {bearer}"
    wrong = basic(CHAT_UI_CLIENT, "guess")
    assert client.get("/v1/models", headers=wrong).text == f"None {wrong['Authorization']}"
    assert client.get("/v1/models").text == "None None"


def test_pinned_hayhooks_version():
    """`backends.pinned` sets Hayhooks' settings and builds its MCP app from internals tested on one version."""
    from importlib.metadata import version

    from haystack_fusion.backends import pinned

    assert version("hayhooks") == pinned.HAYHOOKS_VERSION


def test_the_pinned_hayhooks_uses_refuse_another_version(monkeypatch):
    from haystack_fusion.backends import pinned

    monkeypatch.setattr(pinned, "version", lambda name: "0.0.1")
    with pytest.raises(
        pinned.PinnedVersionError, match=r"hayhooks 2\.1\.0, and 0\.0\.1 is installed: install hayhooks==2\.1\.0 "
    ):
        pinned.set_hayhooks_settings(durable_mode=True)


def test_a_body_that_does_not_validate_is_a_422_without_the_request_s_values():
    from fastapi import Body, FastAPI
    from fastapi.exceptions import RequestValidationError

    from haystack_fusion.serving.app import _validation_error

    app = FastAPI()
    app.add_exception_handler(RequestValidationError, _validation_error)

    @app.post("/concatenation/run")
    def run(query: str = Body(embed=True)) -> dict:  # pragma: no cover - never reached
        return {}

    response = TestClient(app).post("/concatenation/run", json={"query": {"private": "my secret question"}})
    assert response.status_code == 422
    assert "secret" not in response.text
    assert response.json()["detail"][0]["loc"] == ["body", "query"]
