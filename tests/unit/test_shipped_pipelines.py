"""The YAML pipelines shipped in `pipelines/`: generated from the registry, loadable, deployable by Hayhooks."""

import pytest
from haystack import Pipeline

import haystack_fusion  # noqa: F401  (allowlists the package for deserialization)
from haystack_fusion.serving import COMBINATIONS, PIPELINES_DIR, pipeline_name, pipeline_yaml
from haystack_fusion.strategies import STRATEGIES, get_strategy

pytest.importorskip("haystack_integrations.document_stores.elasticsearch", reason="the `elasticsearch` extra")
pytest.importorskip("haystack_integrations.components.generators.ollama", reason="the `ollama` extra")
pytest.importorskip("haystack_integrations.components.embedders.sentence_transformers", reason="the `dense` extra")

SHIPPED = sorted(PIPELINES_DIR.glob("*.yml"))
CASES = [(strategy, combination) for strategy in STRATEGIES for combination in COMBINATIONS]


@pytest.fixture(autouse=True)
def _no_openai_key(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def test_every_strategy_and_combination_is_shipped_and_nothing_else():
    assert [path.stem for path in SHIPPED] == sorted(pipeline_name(s, c) for s, c in CASES)


@pytest.mark.parametrize(("strategy", "combination"), CASES)
def test_shipped_file_is_what_the_registry_generates(strategy, combination):
    path = PIPELINES_DIR / f"{pipeline_name(strategy, combination)}.yml"
    assert path.read_text(encoding="utf-8") == pipeline_yaml(strategy, COMBINATIONS[combination]), (
        f"{path.name} is stale: run `haystack-fusion pipelines`"
    )


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.stem)
def test_loads_round_trips_and_keeps_secrets_out(path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    text = path.read_text(encoding="utf-8")
    assert "sk-" not in text
    assert "placeholder-key" not in text
    pipeline = Pipeline.loads(text)
    assert Pipeline.loads(pipeline.dumps()) == pipeline
    strategy = path.stem.split("__")[0]
    assert get_strategy(strategy).answer_component in dict(pipeline.walk())


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.stem)
def test_hayhooks_deploys_it(path, monkeypatch):
    """As `hayhooks pipeline deploy-yaml` does: resolve the declared inputs/outputs, load the pipeline."""
    hayhooks_yaml = pytest.importorskip("hayhooks.server.utils.yaml_pipeline_wrapper", reason="the `serve` extra")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    wrapper = hayhooks_yaml.YAMLPipelineWrapper.from_yaml(path.read_text(encoding="utf-8"))
    wrapper.setup()
    assert set(wrapper.input_resolutions) == {"query"}
    assert "retriever.query" in wrapper.input_resolutions["query"].targets
    assert set(wrapper.output_resolutions) == {"answers"}
