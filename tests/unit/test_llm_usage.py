"""Token usage of LLM calls (`haystack_fusion.llm.usage`): one reply's, summed, cached prompt tokens."""

from typing import Any

import pytest
from haystack import Document
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage

from haystack_fusion import PostFusionVoter
from haystack_fusion.llm import USAGE_KEYS, cached_prompt_tokens, empty_usage, reply_usage, run_chat_calls, sum_usage
from tests.unit.scripted_calls import echo_prompt, prompts_of


class TestUsageHelpers:
    def test_empty_usage(self):
        assert empty_usage() == {"prompt_tokens": 0, "completion_tokens": 0, "calls": 0, "failed_calls": 0}
        assert tuple(empty_usage()) == USAGE_KEYS

    def test_sum_usage(self):
        total = sum_usage(
            [
                {"prompt_tokens": 3, "completion_tokens": 1, "calls": 1},
                None,
                {"prompt_tokens": 2, "failed_calls": 1, "rounds": 1, "flag": True, "model": "x"},
            ]
        )
        assert total == {"prompt_tokens": 5, "completion_tokens": 1, "calls": 1, "failed_calls": 1, "rounds": 1}

    def test_reply_usage(self):
        reply = ChatMessage.from_assistant("x", meta={"usage": {"prompt_tokens": 7, "completion_tokens": 2}})
        assert reply_usage(reply) == {"prompt_tokens": 7, "completion_tokens": 2, "calls": 1, "failed_calls": 0}
        assert reply_usage(ChatMessage.from_assistant("x")) == {
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "calls": 1,
            "failed_calls": 0,
        }
        assert reply_usage(None)["calls"] == 1


def openai_usage(prompt: int, cached: Any = "absent") -> dict[str, Any]:
    """A reply's `meta["usage"]` as Haystack's OpenAIChatGenerator serializes the openai client's CompletionUsage."""
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}
    if cached == "details are null":
        usage["prompt_tokens_details"] = None
    elif cached != "absent":
        usage["prompt_tokens_details"] = {"audio_tokens": 0, "cached_tokens": cached}
    return usage


class TestCachedTokens:
    @pytest.mark.parametrize(
        ("usage", "expected"),
        [
            (openai_usage(100, 64), 64),
            (openai_usage(100, 0), 0),  # reported: no cache hit
            (openai_usage(100), None),  # not reported
            (openai_usage(100, None), None),
            (openai_usage(100, "details are null"), None),
            ({"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": True}}, None),
            (None, None),
        ],
    )
    def test_cached_prompt_tokens(self, usage, expected):
        assert cached_prompt_tokens(usage) == expected

    def test_reply_usage_reports_them_only_when_given(self):
        reported = ChatMessage.from_assistant("x", meta={"usage": openai_usage(100, 64)})
        assert reply_usage(reported) == {
            "prompt_tokens": 100,
            "completion_tokens": 1,
            "calls": 1,
            "failed_calls": 0,
            "cached_tokens": 64,
        }
        assert reply_usage(ChatMessage.from_assistant("x", meta={"usage": openai_usage(100, 0)}))["cached_tokens"] == 0
        assert "cached_tokens" not in reply_usage(ChatMessage.from_assistant("x", meta={"usage": openai_usage(100)}))
        assert "cached_tokens" not in reply_usage(None)

    def test_sum_usage_keeps_absent_absent(self):
        assert "cached_tokens" not in sum_usage([{"prompt_tokens": 3, "calls": 1}, None])
        assert sum_usage([{"cached_tokens": 0}, {"prompt_tokens": 3}])["cached_tokens"] == 0
        assert sum_usage([{"cached_tokens": 5}, {"cached_tokens": 7}, {"prompt_tokens": 3}])["cached_tokens"] == 12

    @pytest.mark.parametrize("cached", [[64, 0, 32], [64, "absent", 32]])
    def test_fan_out_sums_the_reported_ones(self, cached):
        replies = [ChatMessage.from_assistant("a", meta={"usage": openai_usage(100, c)}) for c in cached]
        generator = MockChatGenerator(response_fn=lambda messages: replies[int(messages[-1].text)])
        result = run_chat_calls(generator, prompts_of(["0", "1", "2"]))
        assert result.usage["prompt_tokens"] == 300
        assert result.usage["cached_tokens"] == 96

    def test_fan_out_without_reports_has_no_key(self):
        result = run_chat_calls(MockChatGenerator(response_fn=echo_prompt), prompts_of(["a", "b"]))
        assert "cached_tokens" not in result.usage

    def test_components_report_them(self):
        usage = openai_usage(50, 40)
        voter = PostFusionVoter(
            chat_generator=MockChatGenerator(
                response_fn=lambda messages: ChatMessage.from_assistant("Paris", meta={"usage": usage})
            )
        )
        documents = [Document(content=f"passage {i}") for i in range(3)]
        answer = voter.run(query="q?", documents=documents)["answers"][0]
        assert answer.meta["usage"]["cached_tokens"] == 120
        assert answer.meta["usage"]["prompt_tokens"] == 150
