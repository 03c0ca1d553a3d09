"""
The package's LLM calls over Haystack's ChatGenerators: one fan-out (`run_chat_calls`, `run_chat_calls_async`), one
process-wide limit (`CallLimitedChatGenerator`), token usage, the `generation_kwargs` a call adds, and what a
client's exception says about its backend.
"""

from haystack_fusion.llm.clients import ERROR_KINDS, backend_unusable, exception_chain
from haystack_fusion.llm.fanout import (
    INPUT_TOKENS_TAG,
    OUTPUT_TOKENS_TAG,
    FanOutResult,
    check_max_concurrency,
    run_chat_calls,
    run_chat_calls_async,
)
from haystack_fusion.llm.kwargs import logprob_kwargs, merge_stop_sequences, stop_kwargs, supports_logprobs
from haystack_fusion.llm.limits import (
    CallLimitedChatGenerator,
    calls_in_flight_limit,
    max_calls_in_flight,
    unwrap_call_limit,
)
from haystack_fusion.llm.usage import (
    TRUNCATED_FINISH_REASON,
    cached_prompt_tokens,
    empty_usage,
    meta_truncated,
    reply_usage,
    sum_usage,
)

__all__ = [
    "ERROR_KINDS",
    "INPUT_TOKENS_TAG",
    "OUTPUT_TOKENS_TAG",
    "TRUNCATED_FINISH_REASON",
    "CallLimitedChatGenerator",
    "FanOutResult",
    "backend_unusable",
    "cached_prompt_tokens",
    "calls_in_flight_limit",
    "check_max_concurrency",
    "empty_usage",
    "exception_chain",
    "logprob_kwargs",
    "max_calls_in_flight",
    "merge_stop_sequences",
    "meta_truncated",
    "reply_usage",
    "run_chat_calls",
    "run_chat_calls_async",
    "stop_kwargs",
    "sum_usage",
    "supports_logprobs",
    "unwrap_call_limit",
]
