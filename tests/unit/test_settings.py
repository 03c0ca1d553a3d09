"""
Every environment variable the package reads, with its default and the error that names it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from haystack_fusion.settings import (
    DEFAULT_INDEX_PATH,
    MAX_CALLS_IN_FLIGHT_ENV,
    AccessSettings,
    backend_values,
    calls_in_flight_limit_from_env,
    index_path,
    serving_limit_values,
    squad_file,
    strategy_defaults,
)


class TestAccessSettings:
    def test_defaults_no_key_no_origins(self):
        assert AccessSettings.from_env({}) == AccessSettings(api_key=None, cors_origins=())
        assert AccessSettings.from_env({"HAYSTACK_FUSION_API_KEY": "  "}).api_key is None

    def test_reads_the_key_and_the_origins(self):
        env = {
            "HAYSTACK_FUSION_API_KEY": f" {KEY} ",
            "HAYSTACK_FUSION_CORS_ORIGINS": "https://app.example.com/, http://localhost:3000,,",
        }
        assert AccessSettings.from_env(env) == AccessSettings(
            api_key=KEY, cors_origins=("https://app.example.com", "http://localhost:3000")
        )

    @pytest.mark.parametrize("origin", ["*", "https://*.example.com", "app.example.com", "https://a.example/path"])
    def test_an_origin_that_is_not_one_is_refused_naming_the_variable(self, origin):
        with pytest.raises(ValueError, match=r"^HAYSTACK_FUSION_CORS_ORIGINS: .* is not a web origin"):
            AccessSettings.from_env({"HAYSTACK_FUSION_CORS_ORIGINS": origin})

    def test_a_key_with_whitespace_is_refused_naming_the_variable(self):
        with pytest.raises(ValueError, match=r"^HAYSTACK_FUSION_API_KEY: .*without whitespace"):
            AccessSettings.from_env({"HAYSTACK_FUSION_API_KEY": "two words"})


KEY = "k3y-for-tests"


class TestBackendValues:
    def test_own_variables_and_the_prefixed_ones_with_their_types(self):
        env = {
            "HAYSTACK_FUSION_STORE": "/data/index.json",
            "OPENAI_BASE_URL": "http://127.0.0.1:8000/v1",
            "HAYSTACK_FUSION_TOP_K": "7",
            "HAYSTACK_FUSION_TIMEOUT": "2.5",
            "HAYSTACK_FUSION_LOGPROBS": "yes",
            "HAYSTACK_FUSION_LLM": "openai",
        }
        fields = ["index_path", "api_base_url", "top_k", "timeout", "logprobs", "llm", "model"]
        assert backend_values(fields, env) == {
            "index_path": "/data/index.json",
            "api_base_url": "http://127.0.0.1:8000/v1",
            "top_k": 7,
            "timeout": 2.5,
            "logprobs": True,
            "llm": "openai",
        }

    def test_empty_variables_are_unset(self):
        assert backend_values(["top_k", "llm"], {"HAYSTACK_FUSION_TOP_K": "", "HAYSTACK_FUSION_LLM": ""}) == {}

    def test_a_number_variable_without_a_number_is_an_error(self):
        with pytest.raises(ValueError, match="many"):
            backend_values(["top_k"], {"HAYSTACK_FUSION_TOP_K": "many"})


class TestServingLimitValues:
    def test_reads_each_limit_with_its_type(self):
        env = {"HAYSTACK_FUSION_MAX_REQUESTS": "4", "HAYSTACK_FUSION_QUEUE_TIMEOUT": "1.5"}
        assert serving_limit_values(env) == {"max_requests": 4, "queue_timeout": 1.5}
        assert serving_limit_values({}) == {}

    def test_the_error_names_the_variable(self):
        with pytest.raises(ValueError, match=r"^HAYSTACK_FUSION_MAX_WAITING must be a number, got 'lots'"):
            serving_limit_values({"HAYSTACK_FUSION_MAX_WAITING": "lots"})

    def test_the_deprecated_name_still_sets_the_limit_with_a_warning(self):
        with pytest.warns(FutureWarning, match="HAYSTACK_FUSION_MAX_IN_FLIGHT is deprecated.*MAX_REQUESTS"):
            assert serving_limit_values({"HAYSTACK_FUSION_MAX_IN_FLIGHT": "2"}) == {"max_requests": 2}
        both = {"HAYSTACK_FUSION_MAX_IN_FLIGHT": "2", "HAYSTACK_FUSION_MAX_REQUESTS": "3"}
        assert serving_limit_values(both) == {"max_requests": 3}


class TestPaths:
    def test_index_path_option_then_variable_then_default(self, tmp_path):
        env = {"HAYSTACK_FUSION_STORE": str(tmp_path / "env.json")}
        assert index_path(str(tmp_path / "option.json"), env) == tmp_path / "option.json"
        assert index_path(None, env) == tmp_path / "env.json"
        assert index_path(None, {}) == Path(DEFAULT_INDEX_PATH).expanduser()

    def test_squad_file(self):
        assert squad_file({"HAYSTACK_FUSION_SQUAD": "/data/dev.json"}) == "/data/dev.json"
        assert squad_file({"HAYSTACK_FUSION_SQUAD": ""}) is None
        assert squad_file({}) is None


class TestStrategyDefaults:
    def test_the_embedded_model_gets_few_shot_candidates_and_a_note_budget(self):
        assert strategy_defaults("local") == {"few_shot": True, "note_generation_kwargs": {"max_tokens": 400}}

    @pytest.mark.parametrize("llm", ["openai", "ollama"])
    def test_chat_models_get_the_papers_defaults(self, llm):
        assert strategy_defaults(llm) == {}


class TestConcurrencyLimits:
    def test_calls_in_flight_limit(self):
        assert calls_in_flight_limit_from_env({}) is None
        assert calls_in_flight_limit_from_env({MAX_CALLS_IN_FLIGHT_ENV: "3"}) == 3

    @pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
    def test_anything_but_a_positive_integer_is_refused_naming_the_variable(self, value):
        with pytest.raises(ValueError, match=MAX_CALLS_IN_FLIGHT_ENV):
            calls_in_flight_limit_from_env({MAX_CALLS_IN_FLIGHT_ENV: value})
