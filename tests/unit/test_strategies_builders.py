"""
The pipelines the builders make for each strategy: YAML round trips, the answer component and the query inputs.
"""

import pytest
from haystack import Pipeline
from haystack.components.generators.chat import MockChatGenerator, OpenAIChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

import haystack_fusion  # noqa: F401  (allowlists the package for deserialization)
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
    def test_a_copy_with_the_stops(self, monkeypatch):
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        original = OpenAIChatGenerator(generation_kwargs={"max_completion_tokens": 16})
        copy = chain_generator(original, ANSWER_LINE_STOP)
        assert copy is not original
        assert copy.generation_kwargs == {"max_completion_tokens": 16, "stop": ["\n"]}
        assert original.generation_kwargs == {"max_completion_tokens": 16}

    def test_a_limited_generator_gives_a_limited_copy(self, monkeypatch):
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        original = OpenAIChatGenerator(generation_kwargs={"max_completion_tokens": 16})
        limited = CallLimitedChatGenerator(chat_generator=original)
        copy = chain_generator(limited, ANSWER_LINE_STOP)
        assert isinstance(copy, CallLimitedChatGenerator)
        assert copy is not limited
        assert unwrap_call_limit(copy) is not original
        assert unwrap_call_limit(copy).generation_kwargs == {"max_completion_tokens": 16, "stop": ["\n"]}
        assert original.generation_kwargs == {"max_completion_tokens": 16}

    def test_no_copy_without_stops_or_generation_kwargs(self, monkeypatch):
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        generator = OpenAIChatGenerator()
        assert chain_generator(generator, ()) is generator
        mock = MockChatGenerator(responses=["a"])
        assert chain_generator(mock, ANSWER_LINE_STOP) is mock

    def test_the_yaml_shows_the_stops(self, monkeypatch):
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        pipe = build_pipeline("concatenation", retriever=_retriever(), chat_generator=OpenAIChatGenerator())
        assert pipe.get_component("llm").generation_kwargs == {"stop": ["\n"]}

    def test_chain_of_thought_prompts_have_no_answer_line_stop(self):
        assert PROMPTS["pruning"].stop == ()
        assert PROMPTS["figure7"].stop == ANSWER_LINE_STOP


def _retriever():
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
    from haystack.document_stores.in_memory import InMemoryDocumentStore

    return InMemoryBM25Retriever(document_store=InMemoryDocumentStore())
