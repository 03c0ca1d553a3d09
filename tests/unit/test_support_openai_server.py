"""
The test server itself (`tests.support.openai_server`): what it answers, checked with the real openai client.
"""

from __future__ import annotations

import concurrent.futures
import json

import openai
import pytest
from haystack import Document
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore
from haystack.utils import Secret

from haystack_fusion.strategies import build_pipeline, run_strategy
from haystack_fusion.testing import PromptReplies


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


def ask(server, *, content="Hi", max_retries=0, timeout=2.0):
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=max_retries, timeout=timeout)
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}])


class TestFaults:
    @pytest.mark.parametrize(
        ("kind", "error"),
        [
            ("rate_limit", openai.RateLimitError),
            ("server_error", openai.InternalServerError),
            ("reset", openai.APIConnectionError),
            ("hang", openai.APITimeoutError),
        ],
    )
    def test_retried_faults_cost_one_request_per_attempt(self, start_openai_server, kind, error):
        server = start_openai_server(fault_rate=1.0, faults=[kind], retry_after=0.05, hang_seconds=5)
        with pytest.raises(error):
            ask(server, max_retries=1, timeout=0.5)
        stats = server.stats.snapshot()
        assert (stats["requests"], stats["first_attempts"], stats["max_retry_count"]) == (2, 1, 1)
        assert stats["faults"] == {kind: 2}

    def test_a_429_says_when_to_retry(self, start_openai_server):
        server = start_openai_server(fault_rate=1.0, faults=["rate_limit"], retry_after=1.5)
        with pytest.raises(openai.RateLimitError) as raised:
            ask(server)
        assert raised.value.response.headers["retry-after"] == "2"
        assert raised.value.response.headers["retry-after-ms"] == "1500"

    def test_malformed_json_is_not_a_completion(self, start_openai_server):
        server = start_openai_server(fault_rate=1.0, faults=["malformed"])
        with pytest.raises(json.JSONDecodeError):  # as the openai client raises it
            ask(server, max_retries=2)
        assert server.stats.requests == 1

    def test_garbage_and_empty_are_well_formed_completions(self, start_openai_server):
        garbage = start_openai_server(fault_rate=1.0, faults=["garbage"])
        empty = start_openai_server(fault_rate=1.0, faults=["empty"])
        assert ask(garbage).choices[0].message.content not in ("", "Paris")
        assert ask(empty).choices[0].message.content == ""

    def test_faults_are_reproducible_and_a_repeat_is_drawn_afresh(self, start_openai_server):
        def run(seed):
            server = start_openai_server(fault_rate=0.5, faults=["server_error"], seed=seed)
            client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
            outcomes = []
            for i in range(20):
                for _ in range(2):  # the same request twice: its second arrival is drawn afresh
                    try:
                        client.chat.completions.create(
                            model="m", messages=[{"role": "user", "content": f"question {i}"}]
                        )
                        outcomes.append(True)
                    except openai.InternalServerError:
                        outcomes.append(False)
            return outcomes, server.stats.faults["server_error"]

        first, faults = run(seed=1)
        assert run(seed=1) == (first, faults)
        assert run(seed=2)[0] != first
        assert 8 <= faults <= 32
        assert first[0::2] != first[1::2]

    def test_a_full_server_throttles_with_429(self, start_openai_server):
        server = start_openai_server(capacity=2, latency=0.3, retry_after=0.05)
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            futures = [
                pool.submit(client.chat.completions.create, model="m", messages=[{"role": "user", "content": "Hi"}])
                for _ in range(6)
            ]
            errors = [future.exception() for future in futures]
        assert sum(isinstance(error, openai.RateLimitError) for error in errors) == server.stats.throttled >= 1
        assert sum(error is None for error in errors) >= 2


class TestPromptReplies:
    """Every prompt of the package, rendered as the strategies render it, gets a reply its parser reads."""

    def test_every_strategy_runs_end_to_end(self, start_openai_server):
        server = start_openai_server(reply=PromptReplies(answers=["Paris", "Lyon"], concatenation_unknown=1.0))
        store = InMemoryDocumentStore()
        store.write_documents(
            [Document(content=f"Passage {i}: Paris is the capital of France, Lyon a city.") for i in range(5)]
        )
        for strategy in ("concatenation", "post_fusion", "concat_pf", "sure", "chain_of_note", "cascade"):
            llm = OpenAIChatGenerator(api_base_url=server.base_url, api_key=Secret.from_token("x"), model="m")
            pipeline = build_pipeline(strategy, retriever=InMemoryBM25Retriever(store), chat_generator=llm)
            run = run_strategy(pipeline, "What is the capital of France?", top_k=5)
            assert run.usage.failed_calls == 0, strategy
            if strategy == "concatenation":
                assert run.answer.data == "unknown"
            else:
                assert run.answer.data in ("Paris", "Lyon"), strategy
            if strategy == "sure":
                assert sorted(run.evidence.candidates) == ["Lyon", "Paris"]
                assert run.evidence.to_dict()["label_summaries"] == 0


AGENT_TOOLS = [{"type": "function", "function": {"name": "answer_with_sure", "parameters": {"type": "object"}}}]


class TestAgentTurn:
    def test_a_request_with_tools_calls_the_first_tool_then_quotes_its_result(self, start_openai_server):
        server = start_openai_server(reply="Paris")
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        asked = [{"role": "user", "content": [{"type": "text", "text": "Capital of France?"}]}]
        first = client.chat.completions.create(model="m", messages=asked, tools=AGENT_TOOLS).choices[0]
        assert first.finish_reason == "tool_calls"
        call = first.message.tool_calls[0]
        assert (call.function.name, json.loads(call.function.arguments)) == (
            "answer_with_sure",
            {"query": "Capital of France?"},
        )
        answered = [
            *asked,
            first.message.model_dump(),
            {"role": "tool", "tool_call_id": call.id, "content": "Paris [1]"},
        ]
        second = client.chat.completions.create(model="m", messages=answered, tools=AGENT_TOOLS).choices[0]
        assert (second.finish_reason, second.message.content) == ("stop", "Based on the tool: Paris [1]")
        plain = client.chat.completions.create(model="m", messages=asked).choices[0].message.content
        assert plain == "Paris"  # a request without tools gets the reply
