"""`speculative`: taken by concat_pf and cascade only, serialized in their YAML, set by the CLI and the environment."""

from __future__ import annotations

import pytest
from haystack import Pipeline
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore
from haystack.utils import Secret

import haystack_fusion  # noqa: F401  (allowlists the package for deserialization)
from haystack_fusion.backends import BackendConfig, backend_pipeline
from haystack_fusion.cli import _strategy_options, build_parser, main
from haystack_fusion.components.speculation import PostFusionSpeculator
from haystack_fusion.settings import strategy_defaults
from haystack_fusion.strategies import STRATEGIES, FusionAnswerer, build_pipeline, strategy_settings


@pytest.fixture
def llm(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "not-used")
    return OpenAIChatGenerator(api_key=Secret.from_env_var("OPENAI_API_KEY"), model="test")


@pytest.mark.parametrize("strategy", ["concat_pf", "cascade"])
def test_it_adds_the_speculator_and_round_trips(strategy, llm):
    pipe = build_pipeline(strategy, chat_generator=llm, speculative=True)
    speculator = pipe.get_component("fallback_speculator")
    assert isinstance(speculator, PostFusionSpeculator)
    assert speculator._voter is pipe.get_component("voter")
    assert Pipeline.loads(pipe.dumps()) == pipe
    assert "fallback_speculator" not in build_pipeline(strategy, chat_generator=llm).graph


@pytest.mark.parametrize("strategy", sorted(set(STRATEGIES) - {"concat_pf", "cascade"}))
def test_other_strategies_refuse_it_and_shared_settings_leave_it_out(strategy, llm):
    with pytest.raises(ValueError, match="`speculative` is for concat_pf and cascade"):
        build_pipeline(strategy, chat_generator=llm, speculative=True)
    assert strategy_settings(strategy, {"speculative": True}) == {}


def test_fusion_answerer_takes_it(llm):
    answerer = FusionAnswerer(strategy="concat_pf", chat_generator=llm, settings={"speculative": True})
    assert "fallback_speculator" in answerer.pipeline.graph


def test_the_cli_flag_and_the_environment_variable(monkeypatch):
    parser = build_parser()
    for command in (["ask", "Who?"], ["eval", "--dataset", "d.json", "--out", "o"], ["pipelines"]):
        assert parser.parse_args([*command, "--speculative"]).speculative is True
    assert _strategy_options(parser.parse_args(["ask", "Who?", "--speculative"]), "openai")["speculative"] is True
    assert "speculative" not in _strategy_options(parser.parse_args(["ask", "Who?"]), "openai")
    assert strategy_defaults("openai", {"HAYSTACK_FUSION_SPECULATIVE": "1"}) == {"speculative": True}
    assert strategy_defaults("openai", {"HAYSTACK_FUSION_SPECULATIVE": "0"}) == {}


def test_pipelines_writes_it_into_the_yaml_of_a_server_llm(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert main(["pipelines", "--out", str(tmp_path), "--llm", "openai", "--speculative"]) == 0
    concat_pf = (tmp_path / "yaml" / "concat_pf__memory_bm25_openai.yml").read_text(encoding="utf-8")
    assert "PostFusionSpeculator" in concat_pf
    assert "PostFusionSpeculator" not in (tmp_path / "yaml" / "sure__memory_bm25_openai.yml").read_text()
    assert "fallback_speculator" in Pipeline.loads(concat_pf).graph


def test_serving_reads_the_environment_variable(monkeypatch):
    monkeypatch.setenv("HAYSTACK_FUSION_SPECULATIVE", "1")
    monkeypatch.setenv("OPENAI_API_KEY", "not-used")
    for strategy, speculates in (("cascade", True), ("sure", False)):
        retriever = InMemoryBM25Retriever(InMemoryDocumentStore())
        pipe = backend_pipeline(strategy, BackendConfig(llm="openai"), retriever=retriever)
        assert ("fallback_speculator" in pipe.graph) is speculates
