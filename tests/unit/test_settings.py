"""
Every environment variable the package reads, with its default and the error that names it.
"""

from __future__ import annotations

import pytest

from haystack_fusion.settings import AccessSettings


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
