"""The embedded generator's settings, serialization and reply-cache keys (no model is loaded here)."""

from __future__ import annotations

import pytest
from haystack.dataclasses import ChatMessage

from haystack_fusion.backends import LlamaCppChatGenerator, LocalChatGenerator, _is_greedy

pytestmark = pytest.mark.skipif(LlamaCppChatGenerator is None, reason="the `local` extra is not installed")

PROMPT = [ChatMessage.from_user("Question: What is the capital of France?\nAnswer:")]


class TestLocalChatGenerator:
    def test_round_trip_keeps_the_cache_settings(self):
        generator = LocalChatGenerator(prefix_cache=False, reply_cache=False)
        data = generator.to_dict()
        assert data["init_parameters"]["prefix_cache"] is False
        assert data["init_parameters"]["reply_cache"] is False
        assert data["init_parameters"]["n_batch"] == 512
        assert LocalChatGenerator.from_dict(data).to_dict() == data

    def test_greedy_calls_have_a_cache_key(self):
        generator = LocalChatGenerator()
        key = generator._cache_key(PROMPT, None, {})
        assert key is not None
        assert key == LocalChatGenerator()._cache_key(PROMPT, None, {})  # shared by every generator
        assert generator._cache_key(PROMPT, {"max_tokens": 8}, {}) != key  # the settings are part of the key
        assert generator._cache_key("plain text prompt", None, {}) is not None

    @pytest.mark.parametrize(
        ("init", "generation_kwargs", "kwargs"),
        [
            ({}, {"temperature": 0.7}, {}),  # sampling
            ({}, None, {"streaming_callback": print}),  # streaming
            ({"reply_cache": False}, None, {}),
            ({"generation_kwargs": {"temperature": 0.8}}, None, {}),
        ],
    )
    def test_calls_that_are_never_cached(self, init, generation_kwargs, kwargs):
        assert LocalChatGenerator(**init)._cache_key(PROMPT, generation_kwargs, kwargs) is None

    def test_greedy(self):
        assert _is_greedy({"temperature": 0.0})
        assert _is_greedy({"temperature": 0.7, "top_k": 1})
        assert not _is_greedy({})  # llama-cpp-python's default temperature is 0.8
        assert not _is_greedy({"temperature": 0.2})
