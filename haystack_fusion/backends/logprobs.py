"""
Token log-probabilities, what `answers.answer_confidence` reads and a confidence threshold (tau, `min_confidence`)
routes on: the embedded model's, recorded while it decodes (`LogprobRecorder`), and those of OpenAI-compatible
servers (`OPENAI_LOGPROBS_KWARGS`, and a warning when a server sends none although asked).
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from haystack import logging
from haystack.dataclasses import GeneratedAnswer

logger = logging.getLogger(__name__)

OPENAI_LOGPROBS_KWARGS: dict[str, Any] = {"logprobs": True, "top_logprobs": 0}
"""The `generation_kwargs` that ask an OpenAI-compatible server for each generated token's log-probability:
llama-cpp-python's server sends them only when `top_logprobs` is given too, and OpenAI, vLLM and llama.cpp's servers
all accept 0 (no alternatives)."""


Step = tuple[int, float, list[tuple[int, float]]]
"""One generated token: (token id, log-probability, its alternatives as (token id, log-probability), best first)."""


class LogprobRecorder:
    """
    A llama-cpp-python logits processor (`create_completion(logits_processor=...)`) that records each generated
    token's log-probability and changes no logit, so the model needs no `logits_all=True`. Each step sees the next
    token's logits (before penalties, temperature or a grammar) and the tokens so far, whose last the previous step
    chose; the last step's token is the row's most probable one whose bytes end the reply (greedy decoding's choice).

    :param top_logprobs: Alternatives to record per token.
    """

    def __init__(self, top_logprobs: int = 0) -> None:
        self.top_logprobs = top_logprobs
        self.steps: list[Step] = []
        self._row: Any = None

    def __call__(self, input_ids: Any, logits: Any) -> Any:
        """Record the previous step's token against its row and keep this one; `logits` are returned as they are."""
        if self._row is not None:
            self.steps.append(self.step(int(input_ids[-1]), self._row))
        self._row = np.array(logits, dtype=np.float32)
        return logits

    def step(self, token: int, logits: Any) -> Step:
        """
        The log-softmax of one row of logits at `token` and at its `top_logprobs` best tokens (natural logs, <= 0).
        """
        highest = float(logits.max())
        log_total = highest + math.log(float(np.exp(logits - highest).sum(dtype=np.float64)))
        top: list[tuple[int, float]] = []
        if self.top_logprobs > 0:
            best = np.argpartition(-logits, min(self.top_logprobs, len(logits) - 1))[: self.top_logprobs]
            top = [(int(i), float(logits[i]) - log_total) for i in best[np.argsort(-logits[best], kind="stable")]]
        return token, float(logits[token]) - log_total, top

    def openai(self, text: str | None, detokenize: Callable[[list[int]], bytes]) -> dict[str, Any]:
        """
        The reply's tokens in the OpenAI shape of OpenAIChatGenerator's `meta["logprobs"]`: `{"content": [{"token",
        "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}`, only those inside the reply's text
        (not a stop sequence's, not end-of-generation), as OpenAI does.

        :param text: The reply's text.
        :param detokenize: Token ids -> bytes (the model's detokenizer).
        """
        budget = (text or "").encode("utf-8")
        steps = self.steps
        rest = budget[len(b"".join(detokenize([token]) for token, _, _ in steps)) :]
        if rest and self._row is not None:
            best = np.argpartition(-self._row, min(64, len(self._row) - 1))[:64]
            last = next((int(i) for i in best[np.argsort(-self._row[best])] if detokenize([int(i)]) == rest), None)
            steps = steps if last is None else [*steps, self.step(last, self._row)]

        def entry(token: int, logprob: float) -> dict[str, Any]:
            piece = detokenize([token])
            return {"token": piece.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(piece)}

        content: list[dict[str, Any]] = []
        used = 0
        for token, logprob, top in steps:
            shown = entry(token, logprob)
            used += len(shown["bytes"])
            if used > len(budget) or not shown["bytes"]:
                break
            content.append({**shown, "top_logprobs": [entry(*alternative) for alternative in top]})
        return {"content": content}


_warned: set[str] = set()
_lock = threading.Lock()


def missing_logprobs(generator: Any, answers: Iterable[GeneratedAnswer]) -> str | None:
    """
    Whether a server sent no token log-probabilities although `generator` asked for them: an answer built from one
    reply (with its `finish_reason`) and no `meta["logprobs"]` shows it; a vote or SuRe's pick says nothing.

    :param generator: The ChatGenerator the answers came from (its `generation_kwargs` and `api_base_url` are read).
    :param answers: A run's answers (`StrategyRun.answers`).
    :returns: None when the generator did not ask for them, or no answer shows them missing; else one line naming the
        server (without credentials) and what was sent.
    """
    # errors imports config, which imports this module
    from haystack_fusion.backends.errors import OPENAI_DEFAULT_URL, safe_url

    kwargs = getattr(generator, "generation_kwargs", None) or {}
    asked = {name: kwargs[name] for name in ("logprobs", "top_logprobs") if name in kwargs}
    if not kwargs.get("logprobs"):
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
