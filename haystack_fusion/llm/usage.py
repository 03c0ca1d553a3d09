"""
Token usage of LLM calls, read from the replies' `meta`: one reply's, and records summed key by key.

A usage record counts `prompt_tokens` and `completion_tokens` (tokens), `calls` and `failed_calls` (always present),
and `rounds`, `cached_tokens`, `cached_calls` and `truncated` only when something reported them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from haystack.dataclasses import ChatMessage

TRUNCATED_FINISH_REASON = "length"
"""The `meta["finish_reason"]` of a reply the token cap (`max_tokens`) cut (OpenAI, the embedded model)."""


def empty_usage() -> dict[str, int]:
    """A usage record with every counter at zero: prompt / completion tokens, calls made and calls failed."""
    return dict.fromkeys(("prompt_tokens", "completion_tokens", "calls", "failed_calls"), 0)


def sum_usage(usages: Iterable[Mapping[str, Any] | None]) -> dict[str, int]:
    """
    Add usage records key by key (None entries skipped).

    :returns: The four counters of `empty_usage`, plus each optional key any input had (never 0 for one none had).
    """
    total = empty_usage()
    for usage in usages:
        for key, value in (usage or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + int(value)
    return total


def cached_prompt_tokens(usage: Mapping[str, Any] | None) -> int | None:
    """
    The prompt tokens a provider served from its prefix cache: OpenAI's `usage.prompt_tokens_details.cached_tokens`
    (the embedded model reports its reused prefix there too).

    :param usage: A reply's `meta["usage"]`, or None.
    :returns: The cached prompt tokens (>= 0; 0 is a reported miss), or None when the provider reported none.
    """
    details = (usage or {}).get("prompt_tokens_details")
    value = details.get("cached_tokens") if isinstance(details, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


def meta_truncated(meta: Mapping[str, Any]) -> bool | None:
    """
    Whether the reply behind this `meta` (a reply's, or an answer's that copies it) was cut by the token cap.

    Read from `finish_reason` (OpenAI-compatible servers, the embedded model) or a raw Ollama `done_reason`;
    ollama-haystack (7.x) maps a "length" `done_reason` to None, so an Ollama reply is never seen as cut.

    :returns: True or False when the meta says how the reply finished; None when it does not.
    """
    reasons = (meta.get("finish_reason"), meta.get("done_reason"))
    if reasons == (None, None):
        return None
    return TRUNCATED_FINISH_REASON in reasons


def reply_usage(reply: ChatMessage | None) -> dict[str, int]:
    """
    The usage of one call, read from its reply's `meta["usage"]` as OpenAI-style generators report it.

    :param reply: A generator reply, or None for a failed call.
    :returns: `prompt_tokens` and `completion_tokens` (0 when not reported), `calls` = 1, `failed_calls` = 0, plus
        `cached_tokens` (`cached_prompt_tokens`) when reported, `cached_calls` = 1 for a reply the embedded model's
        reply cache gave (`meta["cached"]`), and `truncated` = 1 for a reply the token cap cut.
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
    if reply is not None and meta_truncated(reply.meta):
        counted["truncated"] = 1
    return counted
