"""
The `generation_kwargs` our components add to a call: token log-probabilities where the generator returns them, and
the prompt's stop sequences on top of the generator's own.

Each function reads the generator's own settings (`generation_kwargs`, its class) through a
`CallLimitedChatGenerator`, which only adds a call slot to the generator it wraps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from haystack_fusion.llm.limits import unwrap_call_limit


def supports_logprobs(chat_generator: Any) -> bool:
    """
    Whether this generator returns token log-probabilities when asked: the embedded model (`LocalChatGenerator`,
    which records them at no memory cost), or a generator whose own `generation_kwargs` already ask for them
    (OpenAIChatGenerator made with `logprobs=True`, `--logprobs` on the command line). An OpenAI-compatible server
    is not asked unless told to: not every server returns them (llama.cpp's needs `logits_all`, whose memory grows
    with the context times the vocabulary) and one that refuses fails the call. ollama-haystack returns none (7.x).
    """
    chat_generator = unwrap_call_limit(chat_generator)
    if any(cls.__name__ == "LocalChatGenerator" for cls in type(chat_generator).__mro__):
        return True
    return bool((getattr(chat_generator, "generation_kwargs", None) or {}).get("logprobs"))


def logprob_kwargs(chat_generator: Any, top_logprobs: int = 0) -> dict[str, Any]:
    """
    The `generation_kwargs` that ask this generator for token log-probabilities, or {} when it is not to be asked.

    :param chat_generator: Any ChatGenerator.
    :param top_logprobs: Alternatives per token to return as well (0: none; OpenAI allows up to 20).
    :returns: `{"logprobs": True, "top_logprobs": n}` for `supports_logprobs` generators, else {}: `top_logprobs`
        even at 0, because some OpenAI-compatible servers send log-probabilities only with it
        (`backends.logprobs.OPENAI_LOGPROBS_KWARGS`).
    """
    if not supports_logprobs(chat_generator):
        return {}
    return {"logprobs": True, "top_logprobs": top_logprobs}


MAX_STOP_SEQUENCES = 4
"""OpenAI's limit on `stop` sequences per request."""


def merge_stop_sequences(own: Iterable[str] | str | None, extra: Iterable[str]) -> list[str]:
    r"""
    A generator's own stop sequences plus a prompt's, without the redundant ones.

    A sequence that contains another one never ends a reply first (the other occurs at or before it), so it is
    dropped: with `"\n"` added, the embedded model's `"\n\n"`, `"\nQuestion:"` and `"\nContext:"` all go. The
    generator's own sequences keep their order and come first, so adding nothing new returns them unchanged.

    :param own: The generator's `generation_kwargs["stop"]` (a list, one string, or None).
    :param extra: The prompt's stop sequences (`PromptTemplate.stop`).
    :returns: The merged list (at most `MAX_STOP_SEQUENCES` when the inputs allow it: the shortest are kept).
    """
    listed = [own] if isinstance(own, str) else list(own or [])
    merged: list[str] = []
    for sequence in [*listed, *extra]:
        if sequence and sequence not in merged:
            merged.append(sequence)
    kept = [s for s in merged if not any(other != s and other in s for other in merged)]
    if len(kept) > MAX_STOP_SEQUENCES:
        kept = sorted(kept, key=len)[:MAX_STOP_SEQUENCES]
    return kept


def stop_kwargs(
    chat_generator: Any, stop: Sequence[str], generation_kwargs: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """
    The `generation_kwargs` of a call whose reply should end at any of `stop` (a short-answer prompt ends at its
    answer line), on top of the generator's own stop sequences.

    :param chat_generator: Any ChatGenerator. One with `generation_kwargs` settings (OpenAI, Ollama, llama.cpp,
        the embedded model) gets the stops, its own `generation_kwargs["stop"]` kept; one without (mocks, custom
        generators whose `run` may not take `generation_kwargs`) gets `generation_kwargs` unchanged.
    :param stop: The prompt's stop sequences (`PromptTemplate.stop`); empty returns `generation_kwargs` unchanged.
    :param generation_kwargs: The call's other `generation_kwargs`, or None (their `stop`, when set, replaces the
        generator's, as a call's own settings do).
    :returns: `generation_kwargs` with `stop` set to `merge_stop_sequences` of the stops in force and `stop`; the
        given `generation_kwargs` itself (None included) when nothing is added.
    """
    settings = getattr(unwrap_call_limit(chat_generator), "generation_kwargs", None)
    if not stop or not isinstance(settings, dict):
        return generation_kwargs
    call = dict(generation_kwargs or {})
    own = call["stop"] if "stop" in call else settings.get("stop")
    return {**call, "stop": merge_stop_sequences(own, stop)}
