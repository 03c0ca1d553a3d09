"""
The served OpenAPI spec, fuzzed: schemathesis generates requests for every operation `haystack-fusion serve` lists
(valid and invalid bodies, edge-case strings, the served strategy names) and checks each response: no server error
(5xx) and no status the spec does not document. The server runs behind an API key on 127.0.0.1, its LLM the package's
OpenAI-compatible test server answering each prompt in the form its parser reads (`PromptReplies`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from haystack import Document

from haystack_fusion.backends import save_store
from haystack_fusion.testing import PromptReplies
from tests.support.openai_server import OpenAIServer
from tests.support.serve_process import HayhooksProcess

pytest.importorskip("hayhooks", reason="the `serve` extra (pip install 'haystack-fusion[serve]')")
pytest.importorskip("schemathesis", reason="schemathesis (the `dev` extra)")

KEY = "hf-schema-key-5d1f"
AUTH = {"Authorization": f"Bearer {KEY}"}
STRATEGIES = ["concatenation", "cascade"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    work = tmp_path_factory.mktemp("schema")
    index = work / "index.json"
    save_store(
        [
            Document(content="Post-fusion answers with the majority vote of the replies.", meta={"title": "pf.md"}),
            Document(content="Chain-of-Note writes a reading note per passage.", meta={"title": "con.md"}),
        ],
        index,
    )
    with OpenAIServer(reply=PromptReplies(), max_requests=100_000, lifetime=3600) as llm:
        env = {
            "HAYSTACK_FUSION_LLM": "openai",
            "HAYSTACK_FUSION_DOCUMENT_STORE": "memory",
            "HAYSTACK_FUSION_STORE": str(index),
            "OPENAI_BASE_URL": llm.base_url,
            "OPENAI_API_KEY": "x",
            "HAYSTACK_FUSION_MAX_RETRIES": "0",
            "HAYSTACK_FUSION_API_KEY": KEY,
        }
        with HayhooksProcess(STRATEGIES, env=env, workdir=work) as server:
            yield server


def test_no_server_error_and_no_undocumented_status(served, tmp_path):
    """schemathesis' own command (`st run`), as a user runs it: every operation, its coverage and fuzzing phases, a
    fixed seed; it exits non-zero on any failed check."""
    command = [
        str(Path(sys.executable).with_name("st")),
        "run",
        f"{served.url}/openapi.json",
        "--header",
        f"Authorization: Bearer {KEY}",
        "--checks",
        "not_a_server_error,status_code_conformance",
        "--phases",
        "examples,coverage,fuzzing",
        "--max-examples",
        "25",
        "--workers",
        "1",
        "--seed",
        "0",
        "--no-color",
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=1800, cwd=tmp_path, check=False)
    summary = run.stdout[run.stdout.find("SUMMARY") :]
    assert run.returncode == 0, run.stdout[-6000:]
    assert "Tested: 7" in summary
    assert "passed" in summary


def test_the_spec_lists_what_is_served(served):
    import httpx

    spec = httpx.get(f"{served.url}/openapi.json", headers=AUTH).json()
    assert sorted(spec["paths"]) == sorted(
        ["/status", "/models", "/v1/models", "/chat/completions", "/v1/chat/completions"]
        + [f"/{strategy}/run" for strategy in STRATEGIES]
    )
    model = spec["components"]["schemas"]["ChatRequest"]["properties"]["model"]
    assert model["enum"] == sorted(STRATEGIES)
    chat = spec["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"400", "401", "404", "413", "502", "503"} <= set(chat)
    assert "422" not in chat
    assert chat["400"]["content"]["application/json"]["schema"]["required"] == ["error"]
    assert httpx.get(f"{served.url}/traces", headers=AUTH).status_code == 404
    assert httpx.post(f"{served.url}/v1/files", headers=AUTH, files={"file": b"x"}).status_code == 404
