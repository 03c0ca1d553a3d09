"""
Token usage of LLM calls: one reply's usage as the generator reports it, and usage records summed key by key.

A usage record is a dict of counts: `prompt_tokens` and `completion_tokens` (tokens), `calls` and `failed_calls`
(`USAGE_KEYS`, always present), and the optional `rounds`, `cached_tokens`, `cached_calls`, `http_requests` and
`truncated`, present only when something reported them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from haystack.dataclasses import ChatMessage

USAGE_KEYS = ("prompt_tokens", "completion_tokens", "calls", "failed_calls")
"""The counters every usage record has."""


def empty_usage() -> dict[str, int]:
    """A usage record with every counter at zero: prompt / completion tokens, calls made and calls failed."""
    return dict.fromkeys(USAGE_KEYS, 0)


def sum_usage(usages: Iterable[Mapping[str, Any] | None]) -> dict[str, int]:
    """
    Add usage records key by key.

    :param usages: Records with any of `prompt_tokens`, `completion_tokens`, `calls`, `failed_calls` (and `rounds`,
        `cached_tokens`, `cached_calls`, `http_requests`, `truncated`, summed too when present); None entries are
        skipped.
    :returns: A dict with every key of `USAGE_KEYS` (counts of tokens and calls), plus each optional key that any
        input had (absent from all inputs: absent here too, never 0).
    """
    total = empty_usage()
    for usage in usages:
        for key, value in (usage or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + int(value)
    return total


def cached_prompt_tokens(usage: Mapping[str, Any] | None) -> int | None:
    """
    The prompt tokens a provider served from its prompt (prefix) cache, as one reply's usage reports them.

    Read from OpenAI's `usage.prompt_tokens_details.cached_tokens` (a nested dict in the `meta["usage"]` of Haystack's
    OpenAIChatGenerator replies; the embedded `LocalChatGenerator` reports its reused prefix in the same place).

    :param usage: A reply's `meta["usage"]`, or None.
    :returns: The cached prompt tokens (an integer >= 0; 0 is a reported miss), or None when the provider reported
        none (no `prompt_tokens_details`, or its `cached_tokens` is missing or null): not reported is not a miss.
    """
    details = (usage or {}).get("prompt_tokens_details")
    value = details.get("cached_tokens") if isinstance(details, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


TRUNCATED_FINISH_REASON = "length"
"""The finish reason of a reply cut by the token cap (`max_tokens`), as OpenAIChatGenerator and the embedded
`LocalChatGenerator` (llama.cpp's `finish_reason`) put it in `meta["finish_reason"]`."""


def reply_truncated(reply: ChatMessage | None) -> bool:
    """
    Whether a reply was cut by the token cap rather than ended by the model or a stop sequence.

    Read from `meta["finish_reason"] == "length"` (OpenAIChatGenerator, the embedded `LocalChatGenerator`, any
    OpenAI-compatible server), or a raw Ollama `meta["done_reason"] == "length"`. ollama-haystack (7.x) maps Ollama's
    `done_reason` to `finish_reason` and drops "length" (it becomes None), so an Ollama reply is never seen as cut.

    :param reply: A generator reply, or None for a failed call.
    :returns: True for a reply cut by the cap; False otherwise (a failed call and a reply that says nothing too).
    """
    return reply is not None and bool(meta_truncated(reply.meta))


def meta_truncated(meta: Mapping[str, Any]) -> bool | None:
    """
    Whether the reply behind this `meta` (a reply's, or an AnswerBuilder answer's, which copies it) was cut by the
    token cap, as `reply_truncated` reads it.

    :param meta: A reply's or an answer's `meta`.
    :returns: True or False when it says how the reply finished (`finish_reason` or Ollama's `done_reason`); None
        when it does not.
    """
    reasons = (meta.get("finish_reason"), meta.get("done_reason"))
    if reasons == (None, None):
        return None
    return TRUNCATED_FINISH_REASON in reasons


def reply_usage(reply: ChatMessage | None) -> dict[str, int]:
    """
    The token usage of one reply, read from `reply.meta["usage"]` as OpenAI-style generators report it.

    :param reply: A generator reply, or None for a failed call.
    :returns: `prompt_tokens` and `completion_tokens` (0 when the generator reported none) and `calls` = 1, plus
        `cached_tokens` (prompt tokens the provider's prefix cache served, `cached_prompt_tokens`) only when the
        reply reports them, `cached_calls` = 1 for a reply the embedded model's reply cache gave
        (`meta["cached"]`): it still counts the tokens of the call it stands for, and `truncated` = 1 for a reply
        cut by the token cap (`reply_truncated`). `truncated` is absent, not 0, for a reply that was not cut, as every
        optional key is; summed, it is the number of calls cut.
    """
    usage = (reply.meta.get("usage") if reply is not None else None) or {}
    counted = {
        "prompt_tokens": int(usage.get("prompt_tokens") or 0),
        "completion_tokens": int(usage.get("completion_tokens") or 0),
        "calls": 1,
        "failed_calls": 0,
    }
    cached_tokens = cached_prompt_tokens(usage)
    if cached_tokens is not None:
        counted["cached_tokens"] = cached_tokens
    if reply is not None and reply.meta.get("cached"):
        counted["cached_calls"] = 1
    if reply_truncated(reply):
        counted["truncated"] = 1
    return counted
