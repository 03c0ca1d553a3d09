"""
The pipelines the builders make for each strategy: YAML round trips, the answer component and the query inputs.
"""

import logging
import threading
from typing import Any

import pytest
from haystack import Document, Pipeline
from haystack.components.generators.chat import MockChatGenerator, OpenAIChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore
from haystack.utils import Secret

import haystack_fusion  # noqa: F401  (allowlists the package for deserialization)
from haystack_fusion import FusionAnswerer
from haystack_fusion.breaker import CircuitBreaker
from haystack_fusion.llm import CallLimitedChatGenerator, unwrap_call_limit
from haystack_fusion.prompts import ANSWER_LINE_STOP, PROMPTS
from haystack_fusion.strategies import STRATEGIES, build_pipeline, get_strategy
from haystack_fusion.strategies.registry import _chain_generator as chain_generator
from tests.unit.scripted_pipelines import (
    make_pipeline,
)


class TestPipelines:
    @pytest.mark.parametrize("name", list(STRATEGIES))
    def test_yaml_round_trip(self, name):
        pipeline = build_pipeline(
            name,
            retriever=InMemoryBM25Retriever(InMemoryDocumentStore()),
            chat_generator=MockChatGenerator(responses=["Paris"]),
        )
        loaded = Pipeline.loads(pipeline.dumps())
        assert loaded == pipeline
        # The default concurrency (all of a round's calls at once) serializes as null and loads back as None.
        assert all(getattr(c, "max_concurrency", None) is None for _, c in loaded.walk())

    @pytest.mark.parametrize("name", list(STRATEGIES))
    def test_yaml_round_trip_with_config(self, name):
        pipeline = build_pipeline(
            name,
            retriever=InMemoryBM25Retriever(InMemoryDocumentStore(), top_k=7),
            chat_generator=MockChatGenerator(responses=["Paris", "unknown"]),
            max_concurrency=2,
            samples_per_passage=3,
            max_passage_chars=None,
        )
        assert Pipeline.loads(pipeline.dumps()) == pipeline

    @pytest.mark.parametrize("name", list(STRATEGIES))
    def test_answer_component_and_query_inputs(self, name):
        pipeline = make_pipeline(name, MockChatGenerator(responses="Paris"))
        strategy = get_strategy(name)
        assert strategy.answer_component in dict(pipeline.walk())
        assert "answers" in pipeline.get_component(strategy.answer_component).__haystack_output__._sockets_dict
        inputs = pipeline.inputs()
        assert "query" in inputs["retriever"]
        # Every unconnected mandatory input is a `query` socket, so {"query": ...} per component runs the pipeline.
        for sockets in inputs.values():
            mandatory = {socket for socket, info in sockets.items() if info["is_mandatory"]}
            assert mandatory <= {"query"}


class TestChainGenerator:
    """A one-prompt chain sends its prompt's stop sequences with each call, at run time: no copy of the generator."""

    def test_the_generator_wrapped_with_the_stops(self, monkeypatch):
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        original = OpenAIChatGenerator(generation_kwargs={"max_completion_tokens": 16})
        wrapped = chain_generator(original, ANSWER_LINE_STOP)
        assert isinstance(wrapped, CallLimitedChatGenerator)
        assert unwrap_call_limit(wrapped) is original
        assert wrapped.generation_kwargs == {"stop": ["\n"]}
        assert original.generation_kwargs == {"max_completion_tokens": 16}

    def test_a_limited_generator_is_rewrapped_with_its_breaker(self, monkeypatch):
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        original = OpenAIChatGenerator(generation_kwargs={"max_completion_tokens": 16})
        limited = CallLimitedChatGenerator(chat_generator=original, breaker=CircuitBreaker.shared("chain-test"))
        wrapped = chain_generator(limited, ANSWER_LINE_STOP)
        assert isinstance(wrapped, CallLimitedChatGenerator)
        assert wrapped is not limited
        assert wrapped.breaker is limited.breaker
        assert unwrap_call_limit(wrapped) is original
        assert wrapped.generation_kwargs == {"stop": ["\n"]}

    def test_not_wrapped_without_stops_or_generation_kwargs(self, monkeypatch):
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        generator = OpenAIChatGenerator()
        assert chain_generator(generator, ()) is generator
        mock = MockChatGenerator(responses=["a"])
        assert chain_generator(mock, ANSWER_LINE_STOP) is mock

    def test_the_yaml_shows_the_stops(self, monkeypatch):
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        pipe = build_pipeline("concatenation", retriever=_retriever(), chat_generator=OpenAIChatGenerator())
        assert pipe.get_component("llm").generation_kwargs == {"stop": ["\n"]}
        assert Pipeline.loads(pipe.dumps()).get_component("llm").generation_kwargs == {"stop": ["\n"]}

    @pytest.mark.parametrize("strategy", ["concatenation", "concat_pf", "post_fusion", "pf_concat"])
    def test_a_token_secret_generator_is_used_as_given_and_its_calls_carry_the_stops(
        self, strategy, start_openai_server, caplog
    ):
        bodies: list[dict[str, Any]] = []
        lock = threading.Lock()

        def reply(body: dict[str, Any]) -> str:
            with lock:
                bodies.append(body)
            return "Paris"

        server = start_openai_server(reply=reply)
        generator = OpenAIChatGenerator(api_key=Secret.from_token("x"), api_base_url=server.base_url, max_retries=0)
        with caplog.at_level(logging.WARNING):
            pipe = build_pipeline(strategy, chat_generator=generator)
            FusionAnswerer(strategy=strategy, chat_generator=generator)
        assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == []
        documents = [Document(content="Paris is the capital of France."), Document(content="Lyon is in France.")]
        pipe.run({"query": "What is the capital of France?", "documents": documents})
        assert bodies
        assert all(body.get("stop") == ["\n"] for body in bodies)

    def test_chain_of_thought_prompts_have_no_answer_line_stop(self):
        assert PROMPTS["pruning"].stop == ()
        assert PROMPTS["figure7"].stop == ANSWER_LINE_STOP


def _retriever():
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
    from haystack.document_stores.in_memory import InMemoryDocumentStore

    return InMemoryBM25Retriever(document_store=InMemoryDocumentStore())
