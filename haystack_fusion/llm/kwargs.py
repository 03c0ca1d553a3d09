"""The `generation_kwargs` our components add to a call: token log-probabilities, and a prompt's stop sequences."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from haystack_fusion.llm.limits import unwrap_call_limit

MAX_STOP_SEQUENCES = 4
"""OpenAI's limit on `stop` sequences per request."""


def supports_logprobs(chat_generator: Any) -> bool:
    """
    Whether this generator returns token log-probabilities when asked: the embedded model (`LocalChatGenerator`,
    which records them at no memory cost), or one whose own `generation_kwargs` ask for them (`--logprobs`). Other
    OpenAI-compatible servers are not asked: one that refuses fails the call (llama.cpp's server needs `logits_all`);
    ollama-haystack returns none.
    """
    chat_generator = unwrap_call_limit(chat_generator)
    if any(cls.__name__ == "LocalChatGenerator" for cls in type(chat_generator).__mro__):
        return True
    return bool((getattr(chat_generator, "generation_kwargs", None) or {}).get("logprobs"))


def logprob_kwargs(chat_generator: Any, top_logprobs: int = 0) -> dict[str, Any]:
    """
    :param top_logprobs: Alternatives per token to return as well (0: none; OpenAI allows up to 20).
    :returns: `{"logprobs": True, "top_logprobs": n}` for a `supports_logprobs` generator (`top_logprobs` even at 0:
        some OpenAI-compatible servers send log-probabilities only with it), else {}.
    """
    return {"logprobs": True, "top_logprobs": top_logprobs} if supports_logprobs(chat_generator) else {}


def merge_stop_sequences(own: Iterable[str] | str | None, extra: Iterable[str]) -> list[str]:
    r"""
    A generator's own stop sequences (first, in order) plus a prompt's, without the redundant ones: a sequence that
    contains another never ends a reply first (with `"\n"` added, `"\n\n"` and `"\nQuestion:"` go).

    :returns: The merged list; the `MAX_STOP_SEQUENCES` shortest when there are more.
    """
    merged: list[str] = []
    for sequence in [*([own] if isinstance(own, str) else list(own or [])), *extra]:
        if sequence and sequence not in merged:
            merged.append(sequence)
    kept = [s for s in merged if not any(other != s and other in s for other in merged)]
    return sorted(kept, key=len)[:MAX_STOP_SEQUENCES] if len(kept) > MAX_STOP_SEQUENCES else kept


def stop_kwargs(
    chat_generator: Any, stop: Sequence[str], generation_kwargs: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """
    The `generation_kwargs` of a call whose reply should end at any of `stop`, on top of the generator's own stops.

    :param chat_generator: Any ChatGenerator; one without `generation_kwargs` settings (a mock) gets none added.
    :param stop: The prompt's stop sequences (`PromptTemplate.stop`).
    :param generation_kwargs: The call's other `generation_kwargs` (their `stop` replaces the generator's).
    :returns: `generation_kwargs` with `stop` merged (`merge_stop_sequences`), or `generation_kwargs` itself (None
        included) when nothing is added.
    """
    settings = getattr(unwrap_call_limit(chat_generator), "generation_kwargs", None)
    if not stop or not isinstance(settings, dict):
        return generation_kwargs
    call = dict(generation_kwargs or {})
    own = call["stop"] if "stop" in call else settings.get("stop")
    return {**call, "stop": merge_stop_sequences(own, stop)}
