"""
The `pipelines/` folder: generated from the registry (the repository keeps the embedded default's YAML), and the YAML
of every backend, generated into a temporary folder: loadable, deployable by Hayhooks, no YAML aliases.
"""

import os
from pathlib import Path

import pytest
import yaml
from haystack import Document, Pipeline

import haystack_fusion  # noqa: F401  (allowlists the package for deserialization)
from haystack_fusion.backends import BackendConfig, SavedInMemoryBM25Retriever, save_store
from haystack_fusion.cli import main
from haystack_fusion.serving.yaml import YAML_SUBDIR, backend_name, generate, pipeline_name, pipeline_yaml, render
from haystack_fusion.settings import DEFAULT_INDEX_PATH
from haystack_fusion.strategies import STRATEGIES, get_strategy

pytest.importorskip("haystack_integrations.document_stores.elasticsearch", reason="the `elasticsearch` extra")
pytest.importorskip("haystack_integrations.components.generators.ollama", reason="the `ollama` extra")
pytest.importorskip("haystack_integrations.components.embedders.sentence_transformers", reason="the `dense` extra")
pytest.importorskip("llama_cpp", reason="the `local` extra")

PIPELINES_DIR = Path(__file__).resolve().parents[2] / "pipelines"
EMBEDDED = "memory_bm25_local"
"""The backend of the YAML the repository keeps: `haystack-fusion pipelines`' default."""
BACKENDS = {
    backend_name(config): config
    for config in (
        BackendConfig(),
        BackendConfig(store="memory", retriever="bm25", llm="openai"),
        BackendConfig(store="elasticsearch", retriever="bm25", llm="openai"),
        BackendConfig(store="elasticsearch", retriever="bm25", llm="ollama"),
        BackendConfig(store="elasticsearch", retriever="dense", llm="openai"),
        BackendConfig(store="elasticsearch", retriever="hybrid", llm="openai"),
        BackendConfig(store="elasticsearch", retriever="hybrid", llm="ollama"),
    )
}
"""The backends whose YAML the tests generate: each store, retriever and LLM at least once."""
CASES = [pipeline_name(strategy, backend) for backend in BACKENDS for strategy in STRATEGIES]


@pytest.fixture(autouse=True)
def _no_openai_key(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@pytest.fixture(scope="module")
def rendered():
    return render()


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """The YAML folder of `generate` on every backend of `BACKENDS`, as `haystack-fusion pipelines` writes it."""
    out = tmp_path_factory.mktemp("pipelines")
    for config in BACKENDS.values():
        generate(out, config)
    return out / YAML_SUBDIR


def shipped_files() -> list[str]:
    return sorted(
        path.relative_to(PIPELINES_DIR).as_posix()
        for path in PIPELINES_DIR.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    )


def test_the_folder_is_exactly_what_the_registry_generates(rendered):
    regenerate = "run `haystack-fusion pipelines` from the repository's root"
    assert shipped_files() == list(rendered), regenerate
    stale = [name for name, text in rendered.items() if (PIPELINES_DIR / name).read_text(encoding="utf-8") != text]
    assert not stale, f"stale: {stale}; {regenerate}"


def test_a_wrapper_per_strategy_and_the_embedded_yaml_in_the_sub_folder():
    top_level = sorted(path.name for path in PIPELINES_DIR.iterdir())
    assert top_level == sorted([*STRATEGIES, YAML_SUBDIR]), "hayhooks run deploys every top-level *.yml"
    shipped_yaml = sorted(path.stem for path in (PIPELINES_DIR / YAML_SUBDIR).glob("*.yml"))
    assert shipped_yaml == sorted(pipeline_name(strategy, EMBEDDED) for strategy in STRATEGIES)


def test_no_yaml_anchors_or_aliases(generated):
    for path in generated.glob("*.yml"):
        text = path.read_text(encoding="utf-8")
        assert "&id" not in text, path.name
        assert "*id" not in text, path.name


def test_generate_writes_anywhere(tmp_path, rendered, generated):
    written = generate(tmp_path / "out")
    assert sorted(path.relative_to(tmp_path / "out").as_posix() for path in written) == list(rendered)
    assert sorted(path.stem for path in generated.glob("*.yml")) == sorted(CASES)


@pytest.mark.parametrize("name", CASES)
def test_loads_round_trips_and_keeps_secrets_out(name, generated, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    text = (generated / f"{name}.yml").read_text(encoding="utf-8")
    assert "sk-" not in text
    assert "placeholder-key" not in text
    pipeline = Pipeline.loads(text)
    assert Pipeline.loads(pipeline.dumps()) == pipeline
    strategy = name.split("__")[0]
    assert get_strategy(strategy).answer_component in dict(pipeline.walk())


@pytest.mark.parametrize("name", CASES)
def test_hayhooks_deploys_it(name, generated, monkeypatch):
    """As `hayhooks pipeline deploy-yaml` does: resolve the declared inputs/outputs, load the pipeline."""
    hayhooks_yaml = pytest.importorskip("hayhooks.server.utils.yaml_pipeline_wrapper", reason="the `serve` extra")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    wrapper = hayhooks_yaml.YAMLPipelineWrapper.from_yaml((generated / f"{name}.yml").read_text(encoding="utf-8"))
    wrapper.setup()
    assert set(wrapper.input_resolutions) == {"query"}
    assert "retriever.query" in wrapper.input_resolutions["query"].targets
    assert set(wrapper.output_resolutions) == {"answers"}


def components_of(text: str) -> dict:
    return yaml.safe_load(text)["components"]


def test_every_strategy_has_an_embedded_and_an_openai_compatible_yaml_over_the_saved_index(generated):
    for strategy in STRATEGIES:
        for backend, llm_type in (
            (EMBEDDED, "haystack_fusion.backends.local.LocalChatGenerator"),
            ("memory_bm25_openai", "haystack.components.generators.chat.openai.OpenAIChatGenerator"),
        ):
            text = (generated / f"{pipeline_name(strategy, backend)}.yml").read_text(encoding="utf-8")
            components = components_of(text)
            assert components["retriever"] == {
                "type": "haystack_fusion.backends.stores.SavedInMemoryBM25Retriever",
                "init_parameters": {"index_path": DEFAULT_INDEX_PATH, "scale_score": False, "top_k": 5},
            }
            assert f"type: {llm_type}" in text, (strategy, backend)  # some strategies nest the LLM
            if backend == "memory_bm25_openai":  # the openai client reads $OPENAI_BASE_URL when the URL is null
                assert "api_base_url: null" in text
                assert "api_base_url: http" not in text


def test_the_embedded_yaml_is_machine_independent(rendered):
    """No CPU count, model path or home folder written in: the loading machine supplies its own."""
    text = rendered[f"{YAML_SUBDIR}/{pipeline_name('concatenation', EMBEDDED)}.yml"]
    init = components_of(text)["llm"]["init_parameters"]["chat_generator"]["init_parameters"]  # in the call limit
    assert "n_threads" not in init["model_kwargs"]
    assert init["model"] is None
    assert "model_path" not in init["model_kwargs"]
    assert os.path.expanduser("~") not in text


class _BuiltError(Exception):
    """Stops `ask` with the pipeline it built, before a question reaches the LLM."""

    def __init__(self, pipeline: Pipeline) -> None:
        super().__init__("built")
        self.pipeline = pipeline


def asked_pipeline(strategy: str, index: Path, llm_flags: list[str], monkeypatch) -> dict:
    """`Pipeline.to_dict()` of the pipeline `haystack-fusion ask --strategy STRATEGY` builds (no LLM call made)."""

    def stop(pipeline, *_, **__):
        raise _BuiltError(pipeline)

    monkeypatch.setattr("haystack_fusion.cli.run_strategy", stop)
    with pytest.raises(_BuiltError) as built:
        main(["ask", "Which river?", "--strategy", strategy, "--store", str(index), *llm_flags])
    return built.value.pipeline.to_dict()


def without_retriever(data: dict) -> dict:
    """A pipeline's dict without its retriever: `ask` loads the saved index, the YAML names it (`index_path`)."""
    components = {name: value for name, value in data["components"].items() if name != "retriever"}
    return {**data, "components": components}


@pytest.mark.parametrize(
    ("llm_flags", "config"),
    [
        ([], None),  # the committed YAML: the embedded model
        (["--llm", "openai"], BackendConfig(llm="openai")),
        (["--fallback-llm", "openai"], BackendConfig(fallback_llm="openai")),
    ],
    ids=["committed", "openai", "local_to_openai"],
)
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_the_yaml_runs_a_strategy_with_the_settings_ask_does(strategy, llm_flags, config, tmp_path, monkeypatch):
    """The writer's YAML, loaded, is the pipeline `ask` builds on the same backend: LLM, fallback and every setting
    (the embedded model's few-shot candidate prompt and note budget of `settings.strategy_defaults` included)."""
    monkeypatch.delenv("HAYSTACK_FUSION_STORE", raising=False)
    index = tmp_path / "index.json"
    save_store([Document(content="The Loire flows through Orleans.")], index)
    if config is None:
        text = (PIPELINES_DIR / YAML_SUBDIR / f"{pipeline_name(strategy, EMBEDDED)}.yml").read_text(encoding="utf-8")
    else:
        text = pipeline_yaml(strategy, config)
    shipped = Pipeline.loads(text).to_dict()
    asked = asked_pipeline(strategy, index, llm_flags, monkeypatch)
    assert without_retriever(shipped) == without_retriever(asked)
    assert (
        shipped["components"]["retriever"]["init_parameters"]["top_k"]
        == (asked["components"]["retriever"]["init_parameters"]["top_k"])
    )


def test_local_generator_keeps_threads_it_was_given():
    from haystack_fusion.backends import LocalChatGenerator

    assert "n_threads" not in LocalChatGenerator().to_dict()["init_parameters"]["model_kwargs"]
    given = LocalChatGenerator(model_kwargs={"n_threads": 3}).to_dict()
    assert given["init_parameters"]["model_kwargs"]["n_threads"] == 3
    assert LocalChatGenerator.from_dict(given).model_kwargs["n_threads"] == 3


def test_the_command_writes_the_backend_it_is_given(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["pipelines", "--out", str(out), "--document-store", "elasticsearch", "--retriever", "hybrid",
                 "--llm", "openai", "--es-url", "https://es.example:9200", "--es-index", "passages"]) == 0  # fmt: skip
    assert "15 wrapper folders and 15 YAML pipelines on es_hybrid_openai" in capsys.readouterr().out
    assert sorted(path.stem for path in (out / YAML_SUBDIR).glob("*.yml")) == sorted(
        pipeline_name(strategy, "es_hybrid_openai") for strategy in STRATEGIES
    )
    for path in sorted((out / YAML_SUBDIR).glob("*.yml")):
        bm25 = components_of(path.read_text(encoding="utf-8"))["retriever"]["init_parameters"]["bm25_retriever"]
        store = bm25["init_parameters"]["document_store"]["init_parameters"]
        assert store["hosts"] == "https://es.example:9200", path.name
        assert store["index"] == "passages", path.name
    assert main(["pipelines", "--out", str(out), "--store", "/srv/index.json"]) == 0
    for path in sorted((out / YAML_SUBDIR).glob(f"*__{EMBEDDED}.yml")):
        assert components_of(path.read_text(encoding="utf-8"))["retriever"]["init_parameters"]["index_path"] == (
            "/srv/index.json"
        ), path.name


@pytest.mark.parametrize("retriever", ["dense", "hybrid"])
def test_dense_yaml_over_the_in_memory_store_is_refused_before_writing(retriever, tmp_path, capsys):
    assert main(["pipelines", "--out", str(tmp_path / "out"), "--retriever", retriever]) == 2
    assert "--document-store elasticsearch" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_wrappers_do_not_depend_on_the_backend():
    default = render()
    other = render(BackendConfig(store="elasticsearch", llm="ollama", elasticsearch_url="http://other:9200"))
    wrappers = {name: text for name, text in default.items() if not name.startswith(f"{YAML_SUBDIR}/")}
    assert wrappers == {name: text for name, text in other.items() if not name.startswith(f"{YAML_SUBDIR}/")}
    assert len(wrappers) == len(STRATEGIES)


class TestSavedInMemoryBM25Retriever:
    @pytest.fixture
    def index(self, tmp_path):
        path = tmp_path / "index.json"
        save_store([Document(content="The Elsa river runs past Oberlinde."), Document(content="Glass is made here.")],
                   path)  # fmt: skip
        return path

    def test_retrieves_from_the_saved_index(self, index):
        retriever = SavedInMemoryBM25Retriever(index_path=str(index), top_k=1)
        documents = retriever.run(query="Which river runs past Oberlinde?")["documents"]
        assert [document.content for document in documents] == ["The Elsa river runs past Oberlinde."]
        assert len(retriever.run(query="glass river", top_k=2)["documents"]) == 2

    def test_serializes_the_path_not_the_passages(self, index):
        retriever = SavedInMemoryBM25Retriever(index_path=str(index), top_k=3)
        data = retriever.to_dict()
        assert data["init_parameters"] == {"index_path": str(index), "top_k": 3, "scale_score": False}
        assert SavedInMemoryBM25Retriever.from_dict(data).to_dict() == data

    def test_expands_home_where_it_runs(self, index, monkeypatch):
        monkeypatch.setenv("HOME", str(index.parent))
        assert SavedInMemoryBM25Retriever(index_path="~/index.json").run(query="glass")["documents"]

    def test_loading_reads_nothing_and_a_missing_index_fails_with_the_command_to_make_one(self, tmp_path):
        retriever = SavedInMemoryBM25Retriever.from_dict(
            SavedInMemoryBM25Retriever(str(tmp_path / "no.json")).to_dict()
        )
        with pytest.raises(FileNotFoundError, match="haystack-fusion index"):
            retriever.warm_up()

    def test_top_k_below_one_is_refused(self):
        with pytest.raises(ValueError, match="top_k"):
            SavedInMemoryBM25Retriever(top_k=0)
