"""
The shipped YAML pipelines run as shipped: `Pipeline.loads` on the file's text, then `run({"query": ...})`, over a
saved in-memory index this test writes at the files' `index_path` (`~/.cache/haystack_fusion/index.json`, with
`$HOME` pointed at a temporary folder) with the packaged model, or with an OpenAI-compatible server on 127.0.0.1
(`OPENAI_BASE_URL`, `OPENAI_API_KEY`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from haystack import Document, Pipeline

import haystack_fusion  # noqa: F401  (allowlists the package for deserialization)
from haystack_fusion.backends import LocalChatGenerator, save_store
from haystack_fusion.serving.yaml import YAML_SUBDIR, pipeline_name
from haystack_fusion.strategies import STRATEGIES, get_strategy

YAML_DIR = Path(__file__).resolve().parents[2] / "pipelines" / YAML_SUBDIR

PASSAGES = [
    "The Varnholt Bridge crosses the Elsa river and was opened to traffic in 1911.",
    "Mira Tennant designed the Varnholt Bridge after winning a competition held by the town council.",
    "The town of Oberlinde is known for its glassworks, which employ about three hundred people.",
    "Oberlinde's football club plays its home games at the Riverside Ground beside the Elsa.",
    "A ferry carried people across the Elsa at Oberlinde before the bridge was built.",
]
QUESTION = "Who designed the Varnholt Bridge?"


@pytest.fixture
def shipped_index(tmp_path, monkeypatch) -> Path:
    """The passages saved where the shipped YAML's `index_path` points, under a temporary `$HOME`."""
    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / ".cache" / "haystack_fusion" / "index.json"
    save_store([Document(content=text) for text in PASSAGES], path)
    return path


def run_shipped(strategy: str, combination: str) -> tuple[dict, list]:
    """Load the shipped file as a user does and ask the question; returns the outputs and the strategy's answers."""
    pipeline = Pipeline.loads((YAML_DIR / f"{pipeline_name(strategy, combination)}.yml").read_text(encoding="utf-8"))
    outputs = pipeline.run({"query": QUESTION})
    return outputs, outputs[get_strategy(strategy).answer_component]["answers"]


@pytest.mark.parametrize("strategy", ["concatenation", "concat_pf"])
def test_embedded_default_yaml_runs_on_a_saved_index(strategy, shipped_index):
    if LocalChatGenerator is None:
        pytest.skip("the `local` extra (llama-cpp-python, the packaged model) is not installed")
    _, answers = run_shipped(strategy, "memory_bm25_local")
    assert len(answers) == 1
    answer = answers[0]
    assert isinstance(answer.data, str)
    assert answer.query == QUESTION
    retrieved = [document.content for document in answer.documents]
    assert retrieved, "the answer carries the passages it was read from"
    assert set(retrieved) <= set(PASSAGES)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_openai_compatible_yaml_runs_against_a_local_server(strategy, shipped_index, start_openai_server, monkeypatch):
    from haystack_fusion.testing import PromptReplies

    replies = PromptReplies(["Mira Tennant"], concatenation_unknown=0.0)
    server = start_openai_server(reply=replies, api_key="sk-test-local")
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-local")  # the server refuses any other key
    _, answers = run_shipped(strategy, "memory_bm25_openai")
    assert server.stats.first_attempts >= 1
    assert server.stats.refused == 0
    assert answers, f"{strategy} gave no answer"
    assert answers[0].data.startswith("Mira Tennant")  # SuRe numbers the candidates it asks for


def test_a_missing_index_fails_when_run_not_when_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no index saved there
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-local")
    text = (YAML_DIR / f"{pipeline_name('concatenation', 'memory_bm25_openai')}.yml").read_text(encoding="utf-8")
    pipeline = Pipeline.loads(text)
    with pytest.raises(Exception, match="haystack-fusion index") as caught:
        pipeline.run({"query": QUESTION})
    assert "index.json" in str(caught.value)
