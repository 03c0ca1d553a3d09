"""
The test server itself (`tests/openai_server.py`): what it answers, checked with the real openai client.
"""

from __future__ import annotations

import openai
import pytest


class TestApiKey:
    def test_a_wrong_key_gets_401_in_openais_shape(self, start_openai_server):
        server = start_openai_server(api_key="sk-right-key-1234")
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-wrong-key-9876", max_retries=2)
        with pytest.raises(openai.AuthenticationError) as raised:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}])
        assert raised.value.status_code == 401
        assert "Incorrect API key provided" in raised.value.message
        assert "sk-wrong-key-9876" not in raised.value.message  # masked, as api.openai.com does
        assert raised.value.code == "invalid_api_key"
        assert server.stats.requests == 1  # a 401 is not retried

    def test_the_right_key_is_answered(self, start_openai_server):
        server = start_openai_server(api_key="sk-right-key-1234", reply="Paris")
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-right-key-1234", max_retries=0)
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}])
        assert reply.choices[0].message.content == "Paris"
