"""Generation kwargs: stop sequences at the answer line merged with a generator's own, and log-probability kwargs."""

import pytest
from haystack.components.generators.chat import MockChatGenerator

from haystack_fusion.backends import BackendConfig, chat_generator
from haystack_fusion.llm import stop_kwargs
from haystack_fusion.prompts import ANSWER_LINE_STOP
from tests.unit.scripted_calls import kwargs_recording_generator

LOCAL_STOPS = ["\n\n", "\nQuestion:", "\nContext:"]


def merge_stop_sequences(own, extra):
    """The `stop` that `stop_kwargs` sends for a generator whose own stop sequences are `own`."""
    return stop_kwargs(kwargs_recording_generator({"stop": own}), extra)["stop"]


class TestMerge:
    def test_a_newline_makes_the_local_stops_redundant(self):
        assert merge_stop_sequences(LOCAL_STOPS, ["\n"]) == ["\n"]

    def test_nothing_new_keeps_the_generators_list(self):
        assert merge_stop_sequences(LOCAL_STOPS, ["\nContext:"]) == LOCAL_STOPS

    @pytest.mark.parametrize(("own", "expected"), [(None, ["\n"]), ("END", ["END", "\n"]), ([], ["\n"])])
    def test_shapes_of_the_generators_stop(self, own, expected):
        assert merge_stop_sequences(own, ["\n"]) == expected

    def test_at_most_four_the_shortest(self):
        assert merge_stop_sequences(["aaaa", "bbb", "cc", "d"], ["eeeee"]) == ["d", "cc", "bbb", "aaaa"]

    def test_stop_kwargs(self):
        generator = kwargs_recording_generator({"stop": LOCAL_STOPS, "max_tokens": 128})
        assert stop_kwargs(generator, ANSWER_LINE_STOP) == {"stop": ["\n"]}
        assert stop_kwargs(generator, (), {"temperature": 0.7}) == {"temperature": 0.7}
        assert stop_kwargs(generator, ANSWER_LINE_STOP, {"stop": ["X"]}) == {"stop": ["X", "\n"]}


def test_logprob_helpers():

    from haystack_fusion.backends import LocalChatGenerator
    from haystack_fusion.llm import logprob_kwargs

    assert logprob_kwargs(chat_generator(BackendConfig(llm="openai"))) == {}  # not every server returns them
    openai = chat_generator(BackendConfig(llm="openai", logprobs=True))
    assert logprob_kwargs(openai, 5) == {"logprobs": True, "top_logprobs": 5}
    if LocalChatGenerator is not None:
        local = LocalChatGenerator(generation_kwargs={"temperature": 0.0})
        assert logprob_kwargs(local) == {"logprobs": True, "top_logprobs": 0}
    assert logprob_kwargs(MockChatGenerator(responses=["x"])) == {}
    assert logprob_kwargs(chat_generator(BackendConfig(llm="ollama"))) == {}
