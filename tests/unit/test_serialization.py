"""Every component serializes every init parameter (the prompts too when unset) and `from_dict` round-trips it."""

import copy
import inspect
from typing import Any

import pytest
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.generators.utils import print_streaming_chunk
from haystack.core.serialization import component_from_dict, component_to_dict
from haystack.dataclasses import ChatMessage

from haystack_fusion.breaker import CircuitBreaker
from haystack_fusion.components import (
    AbstainingChatGenerator,
    CandidateSummarizer,
    CheckedAnswerBuilder,
    NoteTaker,
    PassageFormatter,
    PostFusionVoter,
    SplitVoteRouter,
    SummaryVerifier,
    UnknownRouter,
)
from haystack_fusion.llm import CallLimitedChatGenerator
from haystack_fusion.testing import ScriptedChatGenerator


def llm() -> MockChatGenerator:
    return MockChatGenerator(responses=["Paris"])


SYSTEM = "You answer in German."
GERMAN = "Kontext: {{ passages }}\nFrage: {{ query }}\nAntwort:"

COMPONENTS: dict[str, Any] = {
    "voter": lambda: PostFusionVoter(chat_generator=llm()),
    "voter_prompts": lambda: PostFusionVoter(
        chat_generator=llm(), prompt=[ChatMessage.from_user(GERMAN)], system_prompt=SYSTEM, samples_per_passage=3
    ),
    "summarizer": lambda: CandidateSummarizer(chat_generator=llm()),
    "summarizer_prompts": lambda: CandidateSummarizer(
        chat_generator=llm(), mode="generic", summary_prompt=GERMAN, system_prompt=SYSTEM
    ),
    "verifier": lambda: SummaryVerifier(chat_generator=llm()),
    "verifier_ranker": lambda: SummaryVerifier(
        chat_generator=llm(), document_ranker=ScriptedChatGenerator(), scoring="probability"
    ),
    "note_taker": lambda: NoteTaker(chat_generator=llm()),
    "note_taker_streaming": lambda: NoteTaker(
        chat_generator=llm(), mode="per_document", streaming_callback=print_streaming_chunk, generation_kwargs={"a": 1}
    ),
    "abstaining": lambda: AbstainingChatGenerator(chat_generator=llm(), samples=2),
    "router": lambda: UnknownRouter(),
    "router_streaming": lambda: UnknownRouter(streaming_callback=print_streaming_chunk, min_confidence=0.5),
    "call_limit": lambda: CallLimitedChatGenerator(chat_generator=llm()),
    "call_limit_settings": lambda: CallLimitedChatGenerator(
        chat_generator=llm(), breaker=CircuitBreaker.shared("serialization-test"), generation_kwargs={"stop": ["\n"]}
    ),
    "split_router": lambda: SplitVoteRouter(min_vote_share=0.5),
    "passages": lambda: PassageFormatter(layout="titled"),
    "answer_builder": lambda: CheckedAnswerBuilder(pattern="^(.*)$", demonstrations=["1925"]),
}


@pytest.mark.parametrize("name", list(COMPONENTS))
def test_every_init_parameter_is_written(name):
    component = COMPONENTS[name]()
    written = component_to_dict(component, name)["init_parameters"]
    assert set(written) == set(list(inspect.signature(type(component).__init__).parameters)[1:])


@pytest.mark.parametrize("name", list(COMPONENTS))
def test_from_dict_round_trips(name):
    component = COMPONENTS[name]()
    data = component_to_dict(component, name)
    restored = component_from_dict(type(component), copy.deepcopy(data), name)  # from_dict changes its input
    assert component_to_dict(restored, name) == data


def test_the_prompts_come_back_as_templates():
    voter = COMPONENTS["voter_prompts"]()
    restored = PostFusionVoter.from_dict(voter.to_dict())
    assert restored.prompt == [ChatMessage.from_user(GERMAN)]
    assert restored.system_prompt == SYSTEM
    assert (
        NoteTaker.from_dict(COMPONENTS["note_taker_streaming"]().to_dict()).streaming_callback is print_streaming_chunk
    )
    breaker = CallLimitedChatGenerator.from_dict(COMPONENTS["call_limit_settings"]().to_dict()).breaker
    assert breaker is CircuitBreaker.shared("serialization-test")
