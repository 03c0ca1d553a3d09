"""
Token log-probabilities: the embedded model's, recorded while it decodes (`LogprobRecorder`) and shaped as OpenAI's
(`openai_logprobs`); and those of OpenAI-compatible servers, how they are asked for and what is said when a server
sends none although they were asked for.

They are what `answers.answer_confidence` reads, and so what a confidence threshold (tau, `min_confidence`) of
`concat_pf` and `cascade` routes on. OpenAI returns them for `"logprobs": true`; llama-cpp-python's server returns
them only when the request also carries `top_logprobs` (with `"logprobs": true` alone it answers `"logprobs": null`),
and `"top_logprobs": 0` (no alternatives, only the chosen token's log-probability) is accepted by OpenAI, vLLM and
llama.cpp's servers alike: `OPENAI_LOGPROBS_KWARGS` sends both.
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
"""The `generation_kwargs` that ask an OpenAI-compatible server for each generated token's log-probability."""


Step = tuple[int, float, list[tuple[int, float]]]
"""One generated token: (token id, log-probability, its alternatives as (token id, log-probability), best first)."""


class LogprobRecorder:
    """
    A llama-cpp-python logits processor (`create_completion(logits_processor=...)`) that records each generated
    token's log-probability and changes no logit, so the model needs no `logits_all=True`.

    At each decoding step it sees the logits for the next token (before penalties, temperature, top-k or a grammar)
    and the tokens so far, whose last is the one the previous step chose: a step's row is kept until then. The last
    step's token is never seen that way; `openai` takes the most probable token of the last row whose bytes end the
    reply (for greedy decoding, with or without a grammar, the one chosen).

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
        The log-softmax of one row of logits at `token` and at its `top_logprobs` best tokens (natural logs, <= 0);
        only these scalars are kept, so a reply's record grows with its length, not with the vocabulary.
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
        The reply's tokens in the OpenAI shape that Haystack's OpenAIChatGenerator puts in `meta["logprobs"]`:
        `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}`. Only the
        tokens whose bytes lie inside the reply's text are listed: those of a stop sequence that cut the reply and the
        end-of-generation token are left out, as OpenAI does.

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
