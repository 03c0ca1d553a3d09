"""Token usage of LLM calls (`haystack_fusion.llm`): one reply's, summed, cached prompt tokens."""

from typing import Any

import pytest
from haystack import Document
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.dataclasses import ChatMessage
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion import PostFusionVoter
from haystack_fusion.llm import (
    empty_usage,
    reply_usage,
    run_chat_calls,
    sum_usage,
)
from haystack_fusion.strategies import build_pipeline, run_strategy
from tests.unit.capitals_dataset import THREE_CAPITALS
from tests.unit.scripted_calls import echo_prompt, prompts_of


class TestUsageHelpers:
    def test_empty_usage(self):
        assert empty_usage() == {"prompt_tokens": 0, "completion_tokens": 0, "calls": 0, "failed_calls": 0}

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
        assert reply_usage(ChatMessage.from_assistant("x", meta={"usage": usage})).get("cached_tokens") == expected

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


def cut(text: str) -> ChatMessage:
    """A reply the token cap cut."""
    return ChatMessage.from_assistant(text, meta={"finish_reason": "length", "usage": {"completion_tokens": 4}})


class TestTruncatedUsage:
    def test_a_reply_cut_by_the_cap_counts_one(self):
        assert reply_usage(cut("Par"))["truncated"] == 1

    @pytest.mark.parametrize(
        "reply",
        [
            ChatMessage.from_assistant("Paris", meta={"finish_reason": "stop"}),
            ChatMessage.from_assistant("Paris"),
            ChatMessage.from_assistant("Paris", meta={"finish_reason": None}),  # ollama-haystack's mapped "length"
            None,
        ],
    )
    def test_other_replies_have_no_count(self, reply):
        assert "truncated" not in reply_usage(reply)

    def test_a_raw_ollama_done_reason_counts(self):
        assert reply_usage(ChatMessage.from_assistant("Par", meta={"done_reason": "length"}))["truncated"] == 1

    def test_sums_count_the_cut_calls(self):
        assert sum_usage([reply_usage(cut("a")), reply_usage(None), reply_usage(cut("b"))])["truncated"] == 2
        assert "truncated" not in sum_usage([reply_usage(ChatMessage.from_assistant("a"))])

    def test_a_fan_out_counts_its_cut_calls(self):
        generator = MockChatGenerator(responses=[cut("a"), ChatMessage.from_assistant("b"), cut("c")])
        prompts = [[ChatMessage.from_user(text)] for text in ("x", "y", "z")]
        result = run_chat_calls(generator, prompts, max_concurrency=1)
        assert result.usage["truncated"] == 2
        assert result.usage["calls"] == 3

    def test_a_strategy_counts_it_and_its_answer_keeps_the_finish_reason(self):
        store = InMemoryDocumentStore()
        store.write_documents(THREE_CAPITALS)
        pipeline = build_pipeline(
            "concatenation",
            retriever=InMemoryBM25Retriever(store, top_k=2),
            chat_generator=MockChatGenerator(responses=cut("Paris")),
        )
        run = run_strategy(pipeline, "What is the capital of France?")
        assert run.usage.truncated == 1
        assert run.answer.meta["finish_reason"] == "length"  # the answer builder passes the reply's meta on
