"""
Token log-probabilities, what `answers.answer_confidence` reads and a confidence threshold (tau, `min_confidence`)
routes on: the embedded model's, recorded while it decodes (`LogprobRecorder`), and those of OpenAI-compatible
servers (`OPENAI_LOGPROBS_KWARGS`; `checks.missing_logprobs` tells when a server sends none although asked).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

OPENAI_LOGPROBS_KWARGS: dict[str, Any] = {"logprobs": True, "top_logprobs": 0}
"""The `generation_kwargs` that ask an OpenAI-compatible server for each generated token's log-probability:
llama-cpp-python's server sends them only when `top_logprobs` is given too, and OpenAI, vLLM and llama.cpp's servers
all accept 0 (no alternatives)."""


Step = tuple[int, float, list[tuple[int, float]]]
"""One generated token: (token id, log-probability, its alternatives as (token id, log-probability), best first)."""


class LogprobRecorder:
    """
    A llama-cpp-python logits processor that records each generated token's log-probability and changes no logit (no
    `logits_all=True` needed). A step sees the next token's logits and the tokens so far, the last chosen by the
    previous step; the last step's token is the most probable one whose bytes end the reply (greedy's choice).

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
        """The log-softmax of a row of logits at `token` and at its `top_logprobs` best tokens (natural logs)."""
        highest = float(logits.max())
        log_total = highest + math.log(float(np.exp(logits - highest).sum(dtype=np.float64)))
        top: list[tuple[int, float]] = []
        if self.top_logprobs > 0:
            best = np.argpartition(-logits, min(self.top_logprobs, len(logits) - 1))[: self.top_logprobs]
            top = [(int(i), float(logits[i]) - log_total) for i in best[np.argsort(-logits[best], kind="stable")]]
        return token, float(logits[token]) - log_total, top

    def openai(self, text: str | None, detokenize: Callable[[list[int]], bytes]) -> dict[str, Any]:
        """The reply's tokens in OpenAI's `meta["logprobs"]` shape, `{"content": [{"token", "logprob", "bytes",
        "top_logprobs": [...]}]}`, only those inside `text` (as OpenAI does); `detokenize`: token ids -> bytes."""
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
