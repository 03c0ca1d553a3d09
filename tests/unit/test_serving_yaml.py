"""The shipped `pipelines/` folder: generated from the registry, loadable, deployable by Hayhooks, no YAML aliases."""

from pathlib import Path

import pytest
from haystack import Pipeline

import haystack_fusion  # noqa: F401  (allowlists the package for deserialization)
from haystack_fusion.serving.yaml import COMBINATIONS, YAML_SUBDIR, generate, pipeline_name, render
from haystack_fusion.strategies import STRATEGIES, get_strategy

pytest.importorskip("haystack_integrations.document_stores.elasticsearch", reason="the `elasticsearch` extra")
pytest.importorskip("haystack_integrations.components.generators.ollama", reason="the `ollama` extra")
pytest.importorskip("haystack_integrations.components.embedders.sentence_transformers", reason="the `dense` extra")

PIPELINES_DIR = Path(__file__).resolve().parents[2] / "pipelines"
SHIPPED_YAML = sorted((PIPELINES_DIR / YAML_SUBDIR).glob("*.yml"))
CASES = [(strategy, combination) for strategy in STRATEGIES for combination in COMBINATIONS]


@pytest.fixture(autouse=True)
def _no_openai_key(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@pytest.fixture(scope="module")
def rendered():
    return render()


def shipped_files() -> list[str]:
    return sorted(
        path.relative_to(PIPELINES_DIR).as_posix()
        for path in PIPELINES_DIR.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    )


def test_the_folder_is_exactly_what_the_registry_generates(rendered):
    assert shipped_files() == list(rendered), "run `haystack-fusion pipelines`"
    stale = [name for name, text in rendered.items() if (PIPELINES_DIR / name).read_text(encoding="utf-8") != text]
    assert not stale, f"stale: {stale}; run `haystack-fusion pipelines`"


def test_a_wrapper_per_strategy_and_yaml_only_in_the_sub_folder():
    top_level = sorted(path.name for path in PIPELINES_DIR.iterdir())
    assert top_level == sorted([*STRATEGIES, YAML_SUBDIR]), "hayhooks run deploys every top-level *.yml"
    assert [path.stem for path in SHIPPED_YAML] == sorted(pipeline_name(s, c) for s, c in CASES)


def test_no_yaml_anchors_or_aliases(rendered):
    for name, text in rendered.items():
        assert "&id" not in text, name
        assert "*id" not in text, name


def test_generate_writes_anywhere(tmp_path, rendered):
    written = generate(tmp_path / "out")
    assert sorted(path.relative_to(tmp_path / "out").as_posix() for path in written) == list(rendered)


@pytest.mark.parametrize("path", SHIPPED_YAML, ids=lambda path: path.stem)
def test_loads_round_trips_and_keeps_secrets_out(path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    text = path.read_text(encoding="utf-8")
    assert "sk-" not in text
    assert "placeholder-key" not in text
    pipeline = Pipeline.loads(text)
    assert Pipeline.loads(pipeline.dumps()) == pipeline
    strategy = path.stem.split("__")[0]
    assert get_strategy(strategy).answer_component in dict(pipeline.walk())


@pytest.mark.parametrize("path", SHIPPED_YAML, ids=lambda path: path.stem)
def test_hayhooks_deploys_it(path, monkeypatch):
    """As `hayhooks pipeline deploy-yaml` does: resolve the declared inputs/outputs, load the pipeline."""
    hayhooks_yaml = pytest.importorskip("hayhooks.server.utils.yaml_pipeline_wrapper", reason="the `serve` extra")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    wrapper = hayhooks_yaml.YAMLPipelineWrapper.from_yaml(path.read_text(encoding="utf-8"))
    wrapper.setup()
    assert set(wrapper.input_resolutions) == {"query"}
    assert "retriever.query" in wrapper.input_resolutions["query"].targets
    assert set(wrapper.output_resolutions) == {"answers"}
