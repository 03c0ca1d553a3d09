"""
The plumbing of the package's LLM calls, under the components and over Haystack's ChatGenerators.

- `fanout`: the one fan-out of independent calls (`run_chat_calls`, `run_chat_calls_async`, `FanOutResult`), its
  kept worker threads and its concurrency bounds (`concurrency_ceiling`, `concurrency_limit`).
- `limits`: the process-wide limit on calls in flight (`max_calls_in_flight`, `CallSlots`) and
  `CallLimitedChatGenerator`, the ChatGenerator wrapper whose every call holds a slot.
- `usage`: token usage of one reply and of many (`reply_usage`, `sum_usage`), truncated replies.
- `kwargs`: the `generation_kwargs` a call adds: log-probabilities (`logprob_kwargs`), stop sequences (`stop_kwargs`).
- `tracing`: the span of each call a component makes (`trace_chat_call`, `record_chat_call`).
- `clients`: the generators' HTTP clients: requests counted per call, async clients bound to the running event
  loop, and what a client's exception says about its backend (`backend_unusable`).
"""

from haystack_fusion.llm.clients import ERROR_KINDS, backend_unusable, bind_async_client, exception_chain
from haystack_fusion.llm.fanout import (
    FanOutResult,
    check_max_concurrency,
    concurrency_ceiling,
    concurrency_limit,
    run_chat_calls,
    run_chat_calls_async,
    run_sync,
)
from haystack_fusion.llm.kwargs import (
    MAX_STOP_SEQUENCES,
    logprob_kwargs,
    merge_stop_sequences,
    stop_kwargs,
    supports_logprobs,
)
from haystack_fusion.llm.limits import (
    CallLimitedChatGenerator,
    CallSlots,
    call_slot,
    call_slot_async,
    calls_in_flight_limit,
    max_calls_in_flight,
    unwrap_call_limit,
)
from haystack_fusion.llm.tracing import INPUT_TOKENS_TAG, OUTPUT_TOKENS_TAG, record_chat_call, trace_chat_call
from haystack_fusion.llm.usage import (
    TRUNCATED_FINISH_REASON,
    USAGE_KEYS,
    cached_prompt_tokens,
    empty_usage,
    meta_truncated,
    reply_truncated,
    reply_usage,
    sum_usage,
)

__all__ = [
    "ERROR_KINDS",
    "INPUT_TOKENS_TAG",
    "MAX_STOP_SEQUENCES",
    "OUTPUT_TOKENS_TAG",
    "TRUNCATED_FINISH_REASON",
    "USAGE_KEYS",
    "CallLimitedChatGenerator",
    "CallSlots",
    "FanOutResult",
    "backend_unusable",
    "bind_async_client",
    "cached_prompt_tokens",
    "call_slot",
    "call_slot_async",
    "calls_in_flight_limit",
    "check_max_concurrency",
    "concurrency_ceiling",
    "concurrency_limit",
    "empty_usage",
    "exception_chain",
    "logprob_kwargs",
    "max_calls_in_flight",
    "merge_stop_sequences",
    "meta_truncated",
    "record_chat_call",
    "reply_truncated",
    "reply_usage",
    "run_chat_calls",
    "run_chat_calls_async",
    "run_sync",
    "stop_kwargs",
    "sum_usage",
    "supports_logprobs",
    "trace_chat_call",
    "unwrap_call_limit",
]
