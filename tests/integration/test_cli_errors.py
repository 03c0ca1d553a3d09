"""
The `haystack-fusion` command against backends that cannot be used: a closed port for
Elasticsearch, Ollama and an OpenAI-compatible server, a wrong API key (the test server of
`tests.support.openai_server` with `api_key`), and a wrong Elasticsearch index (needs a server: runs when
`ELASTICSEARCH_URL` is set).

Each must end with one line on stderr that names the URL or the environment variable, a non-zero exit status, no
traceback, and no secret (a recognisable fake key, and a password in the Elasticsearch URL) anywhere in the output or
the log records.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from haystack_fusion.cli import main
from tests.integration.conftest import free_port

FAKE_KEY = "sk-haystack-fusion-test-" + "SECRET0123456789"
"""A recognisable fake OpenAI key: it must never appear in anything the command prints or logs."""
ES_PASSWORD = "es-pass-SECRET-4321"


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    """A saved in-memory index of one small text folder."""
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "paris.txt").write_text("Paris is the capital and most populous city of France.", encoding="utf-8")
    path = tmp_path / "index.json"
    assert main(["index", str(folder), "--store", str(path)]) == 0
    return path


@pytest.fixture
def secrets_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    monkeypatch.setenv("ELASTIC_API_KEY", FAKE_KEY)
    for variable in ("OPENAI_BASE_URL", "HAYSTACK_FUSION_LLM", "HAYSTACK_FUSION_DOCUMENT_STORE"):
        monkeypatch.delenv(variable, raising=False)


def closed_port_url(path: str = "") -> str:
    """An http URL on 127.0.0.1 whose port was free a moment ago: connections to it are refused."""
    return f"http://127.0.0.1:{free_port()}{path}"


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> tuple[int, str]:
    """Run `haystack-fusion argv` in-process; return the exit status and the error line, after the common checks."""
    capsys.readouterr()
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        status = main(argv)
    captured = capsys.readouterr()
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert status == 1
    for text in (captured.out, captured.err, logged):
        assert FAKE_KEY not in text
        assert ES_PASSWORD not in text
        assert "Traceback" not in text
    errors = [line for line in captured.err.splitlines() if line.startswith("haystack-fusion:")]
    assert len(errors) == 1, captured.err
    return status, errors[0]


@pytest.mark.usefixtures("secrets_env")
class TestClosedPorts:
    @pytest.mark.parametrize("strategy", ["concatenation", "post_fusion", "chain_of_note"])
    def test_openai_base_url_that_refuses(self, strategy, store_path, capsys, caplog):
        url = closed_port_url("/v1")
        argv = ["ask", "Capital of France?", "--store", str(store_path), "--strategy", strategy]
        _, line = run_cli([*argv, "--llm", "openai", "--api-base-url", url, "--max-retries", "1"], capsys, caplog)
        assert line.startswith(f"haystack-fusion: cannot connect to the OpenAI-compatible server at {url}")
        assert "--api-base-url or $OPENAI_BASE_URL" in line

    def test_openai_base_url_from_the_environment(self, store_path, capsys, caplog, monkeypatch):
        url = closed_port_url("/v1")
        monkeypatch.setenv("OPENAI_BASE_URL", url)
        _, line = run_cli(
            ["ask", "Capital?", "--store", str(store_path), "--llm", "openai", "--max-retries", "0"], capsys, caplog
        )
        assert f"at {url} (Connection refused)" in line

    @pytest.mark.parametrize("strategy", ["concatenation", "post_fusion"])
    def test_ollama_closed_port(self, strategy, store_path, capsys, caplog, monkeypatch):
        pytest.importorskip("haystack_integrations.components.generators.ollama", reason="the `ollama` extra")
        url = closed_port_url()
        monkeypatch.setenv("OLLAMA_HOST", url)
        argv = ["ask", "Capital?", "--store", str(store_path), "--llm", "ollama", "--strategy", strategy]
        _, line = run_cli(argv, capsys, caplog)
        assert line == (
            f"haystack-fusion: cannot connect to Ollama at {url}: check $OLLAMA_HOST, and that `ollama serve` is "
            "running"
        )

    @pytest.mark.parametrize("command", ["index", "ask"])
    def test_elasticsearch_closed_port(self, command, tmp_path, capsys, caplog, monkeypatch):
        pytest.importorskip("haystack_integrations.document_stores.elasticsearch", reason="the `elasticsearch` extra")
        url = closed_port_url()
        monkeypatch.setenv("ELASTICSEARCH_URL", url.replace("http://", f"http://elastic:{ES_PASSWORD}@"))
        (tmp_path / "a.txt").write_text("Paris is in France.", encoding="utf-8")
        argv = ["index", str(tmp_path)] if command == "index" else ["ask", "Capital?"]
        _, line = run_cli([*argv, "--document-store", "elasticsearch"], capsys, caplog)
        assert line == (
            f"haystack-fusion: cannot connect to Elasticsearch at {url} (Connection refused): check "
            "$ELASTICSEARCH_URL, and that the server is running"
        )


@pytest.mark.usefixtures("secrets_env")
@pytest.mark.parametrize("strategy", ["concatenation", "post_fusion", "sure"])
def test_wrong_api_key(strategy, store_path, start_openai_server, capsys, caplog):
    server = start_openai_server(api_key="sk-the-right-key-0000", max_requests=50)
    argv = ["ask", "Capital?", "--store", str(store_path), "--strategy", strategy, "--llm", "openai"]
    _, line = run_cli([*argv, "--api-base-url", server.base_url, "--max-retries", "3"], capsys, caplog)
    assert line.startswith(f"haystack-fusion: the OpenAI-compatible server at {server.base_url} refused the API ")
    assert "$OPENAI_API_KEY" in line
    assert server.stats.requests >= 1
    assert server.stats.retries == 0  # the openai client does not retry a 401


def test_the_installed_command_prints_one_line_and_no_traceback(store_path):
    """The real entry point in its own process, as a newcomer runs it: stderr is the error line and nothing else."""
    url = closed_port_url("/v1")
    env = {**os.environ, "OPENAI_API_KEY": FAKE_KEY, "HAYSTACK_TELEMETRY_ENABLED": "False"}
    command = Path(sys.executable).parent / "haystack-fusion"
    argv = ["ask", "Capital?", "--store", str(store_path), "--llm", "openai", "--api-base-url", url]
    result = subprocess.run(
        [str(command), *argv, "--max-retries", "0"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"haystack-fusion: cannot connect to the OpenAI-compatible server at {url} (Connection refused): check "
        "--api-base-url or $OPENAI_BASE_URL, and that the server is running"
    ]
    assert FAKE_KEY not in result.stderr


@pytest.mark.elasticsearch
@pytest.mark.skipif(not os.environ.get("ELASTICSEARCH_URL"), reason="ELASTICSEARCH_URL is not set")
def test_elasticsearch_wrong_index_is_named_and_not_created(capsys, caplog):
    pytest.importorskip("haystack_integrations.document_stores.elasticsearch", reason="the `elasticsearch` extra")
    from elasticsearch import Elasticsearch

    index = f"haystack_fusion_missing_{uuid.uuid4().hex[:8]}"
    capsys.readouterr()
    status = main(["ask", "Capital?", "--document-store", "elasticsearch", "--es-index", index])
    err = capsys.readouterr().err
    assert status == 1
    assert err.strip().splitlines()[-1].startswith("haystack-fusion: Elasticsearch at ")
    assert f"has no index {index!r}" in err
    assert "Traceback" not in err
    with Elasticsearch(os.environ["ELASTICSEARCH_URL"], api_key=os.environ.get("ELASTIC_API_KEY") or None) as client:
        assert not client.indices.exists(index=index)
