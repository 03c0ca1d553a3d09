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
from dataclasses import dataclass
from typing import Any

import numpy as np
from haystack import logging
from haystack.dataclasses import GeneratedAnswer

logger = logging.getLogger(__name__)

OPENAI_LOGPROBS_KWARGS: dict[str, Any] = {"logprobs": True, "top_logprobs": 0}
"""The `generation_kwargs` that ask an OpenAI-compatible server for each generated token's log-probability."""


@dataclass(frozen=True)
class TokenLogprob:
    """
    One generated token's log-probability, read from the logits of the position that produced it.

    :param token: The token id.
    :param logprob: Natural log of the token's probability under the model's softmax (before any sampling
        transformation: temperature, top-k, grammar), <= 0.
    :param top: Up to `top_logprobs` (token id, log-probability) pairs, most probable first.
    """

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    @classmethod
    def from_logits(cls, token: int, logits: Any, top_logprobs: int = 0) -> TokenLogprob:
        """
        Log-softmax of one row of logits at `token` (and its `top_logprobs` best tokens), in O(vocabulary) memory
        that is freed at once: only the scalars are kept, so a reply's trace grows with its length, not with the
        vocabulary.
        """
        highest = float(logits.max())
        log_total = highest + math.log(float(np.exp(logits - highest).sum(dtype=np.float64)))
        top: tuple[tuple[int, float], ...] = ()
        if top_logprobs > 0:
            best = np.argpartition(-logits, min(top_logprobs, len(logits) - 1))[:top_logprobs]
            best = best[np.argsort(-logits[best], kind="stable")]
            top = tuple((int(i), float(logits[i]) - log_total) for i in best)
        return cls(token, float(logits[token]) - log_total, top)


class LogprobRecorder:
    """
    A llama-cpp-python logits processor (`create_completion(logits_processor=...)`) that records each generated
    token's `TokenLogprob` and changes no logit, so the model needs no `logits_all=True`.

    At each decoding step it sees the model's logits for the next token (before penalties, temperature, top-k or a
    grammar) and the tokens so far, whose last is the one the previous step chose: the step's row is kept until then.
    The last step's token is never seen that way; `trace` finds it from the reply's text.

    :param top_logprobs: Alternatives to record per token.
    """

    def __init__(self, top_logprobs: int = 0) -> None:
        self.top_logprobs = top_logprobs
        self.steps: list[TokenLogprob] = []
        self._prompt_tokens: int | None = None
        self._last: Any = None

    def __call__(self, input_ids: Any, logits: Any) -> Any:
        """Record the previous step's token against its row; keep this step's row. Returns `logits` as they are."""
        if self._prompt_tokens is not None and self._last is not None:
            self.steps.append(TokenLogprob.from_logits(int(input_ids[-1]), self._last, self.top_logprobs))
        self._prompt_tokens = len(input_ids)
        self._last = np.array(logits, dtype=np.float32)
        return logits

    def trace(self, text: str | None, detokenize: Callable[[list[int]], bytes]) -> list[TokenLogprob]:
        """
        The generated tokens' log-probabilities, the last step's included when its token ends the reply (a reply cut
        at `max_tokens`): the most probable token of the last row whose bytes are the reply's remaining ones (for
        greedy decoding, with or without a grammar, the token chosen).
        """
        rest = (text or "").encode("utf-8")[len(b"".join(detokenize([step.token]) for step in self.steps)) :]
        if not rest or self._last is None:
            return self.steps
        best = np.argpartition(-self._last, min(64, len(self._last) - 1))[:64]
        for token in best[np.argsort(-self._last[best], kind="stable")]:
            if detokenize([int(token)]) == rest:
                return [*self.steps, TokenLogprob.from_logits(int(token), self._last, self.top_logprobs)]
        return self.steps


def openai_logprobs(trace: list[TokenLogprob], text: str | None, detokenize: Callable[[list[int]], bytes]) -> dict:
    """
    A reply's token trace in the OpenAI shape that Haystack's OpenAIChatGenerator puts in `meta["logprobs"]`:
    `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}`.

    Only the tokens whose bytes lie inside the reply's text are listed: the tokens of a stop sequence that cut the
    reply, and the end-of-generation token, are left out, as OpenAI does.

    :param trace: One `TokenLogprob` per sampled token, in order.
    :param text: The reply's text.
    :param detokenize: Token ids -> bytes (the model's detokenizer).
    """

    def entry(token: int, logprob: float) -> dict[str, Any]:
        piece = detokenize([token])
        return {"token": piece.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(piece)}

    budget = len((text or "").encode("utf-8"))
    content: list[dict[str, Any]] = []
    used = 0
    for step in trace:
        shown = entry(step.token, step.logprob)
        used += len(shown["bytes"])
        if used > budget or not shown["bytes"]:
            break
        content.append({**shown, "top_logprobs": [entry(token, logprob) for token, logprob in step.top]})
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
