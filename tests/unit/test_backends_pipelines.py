"""`backends.backend_pipeline`: a strategy on a backend, the LLM's defaults under the caller's settings."""

import json

import pytest
from haystack import Document

from haystack_fusion.backends import BackendConfig, backend_pipeline, save_store
from haystack_fusion.testing import ScriptedChatGenerator

pytest.importorskip("llama_cpp", reason="the `local` extra")


@pytest.fixture
def embedded(tmp_path) -> BackendConfig:
    """The embedded model over a saved index (the model itself loads on `warm_up` only)."""
    index = tmp_path / "index.json"
    save_store([Document(content="The Loire flows through Orleans.")], index)
    return BackendConfig(index_path=str(index))


def settings_named(pipeline, name: str) -> list:
    """The values of init parameter `name` across the pipeline's components."""
    components = pipeline.to_dict()["components"].values()
    return [component["init_parameters"][name] for component in components if name in component["init_parameters"]]


def test_the_embedded_model_gets_its_defaults_and_explicit_settings_win(embedded):
    assert settings_named(backend_pipeline("sure", embedded), "few_shot") == [True]
    assert settings_named(backend_pipeline("sure", embedded, {"few_shot": False}), "few_shot") == [False]
    assert settings_named(backend_pipeline("chain_of_note", embedded), "generation_kwargs") == [{"max_tokens": 400}]
    chat = BackendConfig(index_path=embedded.index_path, llm="openai")
    assert settings_named(backend_pipeline("sure", chat), "few_shot") == [False]


def test_the_backend_fallback_only_for_fallback_strategies(embedded):
    config = BackendConfig(index_path=embedded.index_path, fallback_llm="openai")
    later_rounds = json.dumps(backend_pipeline("concat_pf", config).to_dict()["components"]["voter"])
    assert "OpenAIChatGenerator" in later_rounds
    assert "OpenAIChatGenerator" not in json.dumps(backend_pipeline("concatenation", config).to_dict())


def test_without_a_backend_the_settings_are_all_and_a_generator_is_required():
    generator = ScriptedChatGenerator("Paris")
    pipeline = backend_pipeline("sure", None, {"num_candidates": 3}, chat_generator=generator)
    assert settings_named(pipeline, "few_shot") == [False]
    assert "retriever" not in pipeline.to_dict()["components"]
    with pytest.raises(ValueError, match="`config` or a `chat_generator`"):
        backend_pipeline("sure", None)
