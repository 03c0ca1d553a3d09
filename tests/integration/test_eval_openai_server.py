"""`haystack-fusion eval --llm openai` against llama-cpp-python's OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from haystack_fusion.cli import main
from haystack_fusion.corpus import default_squad_path
from haystack_fusion.evaluation.records import RESULTS_FILE, read_records

from .test_openai_compatible_server import server_url  # noqa: F401  (the module-scoped server fixture)

STRATEGIES = "concatenation,concat_pf,base"


@pytest.mark.parametrize("retriever", ["bm25", "hybrid"])
def test_eval_on_a_server_names_the_backend(retriever, server_url, squad, tmp_path, monkeypatch, capsys):  # noqa: F811
    if retriever == "hybrid":
        pytest.importorskip("haystack_integrations.components.embedders.sentence_transformers", reason="`dense` extra")
    monkeypatch.setenv("OPENAI_API_KEY", "not-needed-by-a-local-server")
    out = tmp_path / retriever
    args = ["eval", "--dataset", str(default_squad_path()), "--strategies", STRATEGIES, "--sample", "2"]
    args += ["--top-k", "2", "--llm", "openai", "--model", "gemma3-270m", "--api-base-url", server_url]
    args += ["--retriever", retriever, "--max-tokens", "24", "--timeout", "300", "--max-retries", "0"]
    assert main([*args, "--out", str(out)]) == 0
    records = read_records(out / RESULTS_FILE)
    assert len(records) == 3 * 2
    assert all(record.score.calls >= 1 and record.score.prompt_tokens > 0 for record in records)
    report = (out / "results.md").read_text()
    assert f"LLM: openai gemma3-270m at {server_url}" in report.splitlines()[0]
    assert ("hybrid" if retriever == "hybrid" else "BM25") in report.splitlines()[0]
    assert len({(record.strategy, record.fingerprint) for record in records}) == 3  # one fingerprint per strategy


def test_ask_cascade_through_a_server(server_url, squad, tmp_path, monkeypatch, capsys):  # noqa: F811
    """`ask --strategy cascade --llm openai` against the server: no log-probabilities asked, the text signal decides."""
    monkeypatch.setenv("OPENAI_API_KEY", "not-needed-by-a-local-server")
    store = str(tmp_path / "index.json")
    assert main(["index", str(default_squad_path()), "--store", store]) == 0
    capsys.readouterr()
    question = squad[1][0].question  # read from the dataset at run time
    args = ["ask", question, "--strategy", "cascade", "--top-k", "3", "--store", store, "--json"]
    args += ["--llm", "openai", "--model", "gemma3-270m", "--api-base-url", server_url, "--max-tokens", "24"]
    assert main([*args, "--timeout", "300"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["answer"].strip()
    assert result["evidence"]["stages"][0]["stage"] == "concatenation"
    assert result["usage"]["failed_calls"] == 0
