"""
The YAML pipelines run as a user runs them: `Pipeline.loads` on the file's text, then `run({"query": ...})`, over a
saved in-memory index this test writes at the files' `index_path` (`~/.cache/haystack_fusion/index.json`, with
`$HOME` pointed at a temporary folder): the repository's files with the packaged model, and the files
`haystack-fusion pipelines --llm openai` writes with an OpenAI-compatible server on 127.0.0.1 (`OPENAI_BASE_URL`,
`OPENAI_API_KEY`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from haystack import Document, Pipeline

import haystack_fusion  # noqa: F401  (allowlists the package for deserialization)
from haystack_fusion.backends import BackendConfig, LocalChatGenerator, save_store
from haystack_fusion.serving.yaml import YAML_SUBDIR, generate, pipeline_name
from haystack_fusion.strategies import STRATEGIES, get_strategy

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "pipelines" / YAML_SUBDIR

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


@pytest.fixture(scope="module")
def openai_yaml(tmp_path_factory) -> Path:
    """The folder of YAML `haystack-fusion pipelines --llm openai` writes."""
    out = tmp_path_factory.mktemp("pipelines")
    generate(out, BackendConfig(llm="openai"))
    return out / YAML_SUBDIR


def run_yaml(folder: Path, strategy: str, backend: str) -> list:
    """Load the file as a user does and ask the question; returns the strategy's answers."""
    pipeline = Pipeline.loads((folder / f"{pipeline_name(strategy, backend)}.yml").read_text(encoding="utf-8"))
    return pipeline.run({"query": QUESTION})[get_strategy(strategy).answer_component]["answers"]


@pytest.mark.parametrize("strategy", ["concatenation", "concat_pf"])
def test_embedded_default_yaml_runs_on_a_saved_index(strategy, shipped_index):
    if LocalChatGenerator is None:
        pytest.skip("the `local` extra (llama-cpp-python, the packaged model) is not installed")
    answers = run_yaml(SHIPPED_DIR, strategy, "memory_bm25_local")
    assert len(answers) == 1
    answer = answers[0]
    assert isinstance(answer.data, str)
    assert answer.query == QUESTION
    retrieved = [document.content for document in answer.documents]
    assert retrieved, "the answer carries the passages it was read from"
    assert set(retrieved) <= set(PASSAGES)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_openai_compatible_yaml_runs_against_a_local_server(
    strategy, openai_yaml, shipped_index, start_openai_server, monkeypatch
):
    from haystack_fusion.testing import PromptReplies

    replies = PromptReplies(["Mira Tennant"], concatenation_unknown=0.0)
    server = start_openai_server(reply=replies, api_key="sk-test-local")
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-local")  # the server refuses any other key
    answers = run_yaml(openai_yaml, strategy, "memory_bm25_openai")
    assert server.stats.first_attempts >= 1
    assert server.stats.refused == 0
    assert answers, f"{strategy} gave no answer"
    assert answers[0].data.startswith("Mira Tennant")  # SuRe numbers the candidates it asks for


def test_a_missing_index_fails_when_run_not_when_loaded(openai_yaml, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no index saved there
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-local")
    text = (openai_yaml / f"{pipeline_name('concatenation', 'memory_bm25_openai')}.yml").read_text(encoding="utf-8")
    pipeline = Pipeline.loads(text)
    with pytest.raises(Exception, match="haystack-fusion index") as caught:
        pipeline.run({"query": QUESTION})
    assert "index.json" in str(caught.value)
