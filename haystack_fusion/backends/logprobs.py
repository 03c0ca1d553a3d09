"""
Token log-probabilities from OpenAI-compatible servers: how they are asked for, and what is said when a server
sends none although they were asked for.

They are what `answers.answer_confidence` reads, and so what a confidence threshold (tau, `min_confidence`) of
`concat_pf` and `cascade` routes on. OpenAI returns them for `"logprobs": true`; llama-cpp-python's server returns
them only when the request also carries `top_logprobs` (with `"logprobs": true` alone it answers `"logprobs": null`),
and `"top_logprobs": 0` (no alternatives, only the chosen token's log-probability) is accepted by OpenAI, vLLM and
llama.cpp's servers alike: `OPENAI_LOGPROBS_KWARGS` sends both.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from typing import Any

from haystack import logging
from haystack.dataclasses import GeneratedAnswer

logger = logging.getLogger(__name__)

OPENAI_LOGPROBS_KWARGS: dict[str, Any] = {"logprobs": True, "top_logprobs": 0}
"""The `generation_kwargs` that ask an OpenAI-compatible server for each generated token's log-probability."""

_warned: set[str] = set()
_lock = threading.Lock()


def _asked_for(generator: Any) -> dict[str, Any]:
    kwargs = getattr(generator, "generation_kwargs", None) or {}
    return (
        {name: kwargs[name] for name in ("logprobs", "top_logprobs") if name in kwargs}
        if kwargs.get("logprobs")
        else {}
    )


def missing_logprobs(generator: Any, answers: Iterable[GeneratedAnswer]) -> str | None:
    """
    Whether a server sent no token log-probabilities although `generator` asked for them.

    An answer built from one reply carries the reply's meta (its `finish_reason`); such an answer without
    `meta["logprobs"]` shows that the server did not send them. Answers built otherwise (a vote, SuRe's pick) say
    nothing either way.

    :param generator: The ChatGenerator the answers came from (its `generation_kwargs` and `api_base_url` are read).
    :param answers: A run's answers (`StrategyRun.answers`).
    :returns: None when the generator did not ask for them, or no answer shows them missing; else one line naming the
        server (without credentials) and what was sent.
    """
    # errors imports config, which imports this module
    from haystack_fusion.backends.errors import OPENAI_DEFAULT_URL, safe_url

    asked = _asked_for(generator)
    if not asked:
        return None
    if not any("finish_reason" in answer.meta and not answer.meta.get("logprobs") for answer in answers):
        return None
    server = safe_url(getattr(generator, "api_base_url", None) or OPENAI_DEFAULT_URL)
    return (
        f"the OpenAI-compatible server at {server} returned no token log-probabilities although the requests asked "
        f"for them ({json.dumps(asked)}): answers carry no confidence, so a confidence threshold (tau, "
        "--min-confidence) never routes a question"
    )


def warn_missing_logprobs(generator: Any, answers: Iterable[GeneratedAnswer]) -> str | None:
    """
    `missing_logprobs`, logged as a warning once per process for each distinct message.

    :returns: The message (every time it applies, for the caller to record), or None.
    """
    message = missing_logprobs(generator, answers)
    if message is not None:
        with _lock:
            first = message not in _warned
            _warned.add(message)
        if first:
            logger.warning("{message}", message=message)
    return message
