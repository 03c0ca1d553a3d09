"""Stop sequences at the answer line (issue 16, item 2): merging, the chain's generator copy, per-call kwargs."""

from typing import Any

import pytest
from haystack import Document
from haystack.components.generators.chat import MockChatGenerator, OpenAIChatGenerator

from haystack_fusion import NoteTaker, PostFusionVoter
from haystack_fusion.llm import CallLimitedChatGenerator, merge_stop_sequences, stop_kwargs
from haystack_fusion.prompts import ANSWER_LINE_STOP, PROMPTS
from haystack_fusion.strategies import build_pipeline, chain_generator
from haystack_fusion.testing import ScriptedChatGenerator

LOCAL_STOPS = ["\n\n", "\nQuestion:", "\nContext:"]


def recording_generator(generation_kwargs: dict[str, Any] | None = None) -> ScriptedChatGenerator:
    """A chat generator that answers "Paris" and records each call's `generation_kwargs` (in `kwargs`)."""
    # a generator with settings (a dict, even empty), as a real one: the components add their stops to it
    return ScriptedChatGenerator("Paris", generation_kwargs=generation_kwargs or {})


class TestMerge:
    def test_a_newline_makes_the_local_stops_redundant(self):
        assert merge_stop_sequences(LOCAL_STOPS, ["\n"]) == ["\n"]

    def test_nothing_new_keeps_the_generators_list(self):
        assert merge_stop_sequences(LOCAL_STOPS, []) == LOCAL_STOPS
        assert merge_stop_sequences(LOCAL_STOPS, ["\nContext:"]) == LOCAL_STOPS

    @pytest.mark.parametrize(("own", "expected"), [(None, ["\n"]), ("END", ["END", "\n"]), ([], ["\n"])])
    def test_shapes_of_the_generators_stop(self, own, expected):
        assert merge_stop_sequences(own, ["\n"]) == expected

    def test_at_most_four_the_shortest(self):
        assert merge_stop_sequences(["aaaa", "bbb", "cc", "d"], ["eeeee"]) == ["d", "cc", "bbb", "aaaa"]

    def test_stop_kwargs(self):
        generator = recording_generator({"stop": LOCAL_STOPS, "max_tokens": 128})
        assert stop_kwargs(generator, ANSWER_LINE_STOP) == {"stop": ["\n"]}
        assert stop_kwargs(generator, (), {"temperature": 0.7}) == {"temperature": 0.7}
        assert stop_kwargs(generator, ANSWER_LINE_STOP, {"stop": ["X"]}) == {"stop": ["X", "\n"]}


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
        assert copy.chat_generator is not original
        assert copy.chat_generator.generation_kwargs == {"max_completion_tokens": 16, "stop": ["\n"]}
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
        off = build_pipeline(
            "concatenation", retriever=_retriever(), chat_generator=OpenAIChatGenerator(), stop_sequences=False
        )
        assert off.get_component("llm").generation_kwargs == {}

    def test_chain_of_thought_prompts_have_no_answer_line_stop(self):
        assert PROMPTS["pruning"].stop == ()
        assert PROMPTS["figure7"].stop == ANSWER_LINE_STOP


class TestPerCall:
    def test_voter(self):
        generator = recording_generator({"stop": LOCAL_STOPS})
        voter = PostFusionVoter(chat_generator=generator, max_concurrency=1)
        voter.run(query="Capital?", documents=[Document(content="Paris."), Document(content="Lyon.")])
        assert generator.kwargs == [{"stop": ["\n"]}, {"stop": ["\n"]}]

    def test_voter_off_calls_as_before(self):
        generator = recording_generator({"stop": LOCAL_STOPS})
        voter = PostFusionVoter(chat_generator=generator, max_concurrency=1, stop_sequences=False)
        voter.run(query="Capital?", documents=[Document(content="Paris.")])
        assert generator.kwargs == [None]
        assert voter.to_dict()["init_parameters"]["stop_sequences"] is False
        assert PostFusionVoter(chat_generator=generator).to_dict()["init_parameters"]["stop_sequences"] is True

    def test_voter_sampling_keeps_its_temperature(self):
        generator = recording_generator()
        voter = PostFusionVoter(chat_generator=generator, max_concurrency=1, samples_per_passage=2)
        voter.run(query="Capital?", documents=[Document(content="Paris.")])
        assert generator.kwargs == [{"temperature": 0.7, "stop": ["\n"]}] * 2

    def test_note_synthesis_stops_the_notes_do_not(self):
        generator = recording_generator({"stop": LOCAL_STOPS})
        taker = NoteTaker(chat_generator=generator, mode="per_document", generation_kwargs={"max_tokens": 400})
        taker.run(query="Capital?", documents=[Document(content="Paris is the capital.")])
        assert generator.kwargs[0] == {"max_tokens": 400}
        assert generator.kwargs[-1] == {"max_tokens": 400, "stop": ["\n"]}


def _retriever():
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
    from haystack.document_stores.in_memory import InMemoryDocumentStore

    return InMemoryBM25Retriever(document_store=InMemoryDocumentStore())
