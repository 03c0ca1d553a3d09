"""UnknownRouter: sends a reply that says "unknown" (or is too uncertain) to a fallback branch (Liu et al. 3.1, 3.3)."""

from __future__ import annotations

from typing import Any

from haystack import Document, component, logging
from haystack.dataclasses import ChatMessage

from haystack_fusion.answers import UnknownDetector, answer_confidence, check_answer
from haystack_fusion.prompts import PROMPTS, extract_answer

logger = logging.getLogger(__name__)

_OUTPUT_TYPES: dict[str, Any] = {
    "known": list[ChatMessage],
    "unknown": list[ChatMessage],
    "fallback_query": str,
    "fallback_documents": list[Document],
    "reason": str,
}


@component
class UnknownRouter:
    """
    Routes an LLM reply to `known` or `unknown`, so a pipeline can fall back when the model abstains (Liu et al.,
    section 3.1 "unknown"; section 3.3 Post-Fusion as the Fallback). Rejected answers (`answers.check_answer`) and,
    with `min_confidence`, too uncertain ones go to `unknown` too, which passes `fallback_query` and
    `fallback_documents` on.

    ### Usage example
    ```python
    from haystack.dataclasses import ChatMessage
    from haystack_fusion import UnknownRouter

    router = UnknownRouter()
    print(router.run(replies=[ChatMessage.from_assistant("unknown")], query="Who?", documents=[]))
    # {'unknown': [...], 'reason': 'unknown answer', 'fallback_query': 'Who?', 'fallback_documents': []}
    ```
    """

    def __init__(
        self,
        *,
        answer_pattern: str | None = PROMPTS["figure7"].answer_pattern,
        unknown_patterns: list[str] | None = None,
        min_confidence: float | None = None,
        demonstrations: list[str] | None = None,
    ) -> None:
        """
        :param answer_pattern: Regular expression whose first group is the answer (default: the first line, Figure 7);
            None judges the whole reply.
        :param unknown_patterns: Regular expressions that mark an abstention; None uses the shared defaults.
        :param min_confidence: Probability in (0, 1]: an answer whose confidence (`answers.answer_confidence`) is
            below it goes to `unknown`; None, or a reply without log-probabilities, skips the check.
        :param demonstrations: The prompt's demonstration answers, checked against `documents`; None skips that rule.
        :raises ValueError: If `min_confidence` is outside (0, 1] or a pattern is not a valid regular expression.
        """
        if min_confidence is not None and not 0 < min_confidence <= 1:
            raise ValueError(f"`min_confidence` must be in (0, 1], got {min_confidence}")
        self.answer_pattern = answer_pattern
        self.unknown_patterns = unknown_patterns
        self.min_confidence = min_confidence
        self.demonstrations = list(demonstrations) if demonstrations else None
        self._detector = UnknownDetector.from_patterns(unknown_patterns)

    def _reason(self, reply: ChatMessage | None, documents: list[Document] | None, query: str | None) -> str | None:
        """Why one reply goes to the fallback (see `run`), or None when it answers."""
        if reply is None:
            return "no reply"
        text = reply.text
        answer = extract_answer(self.answer_pattern, text) if self.answer_pattern else (text or "").strip()
        if self._detector.is_unknown(answer):
            return "unknown answer"
        passages = [document.content or "" for document in documents or []]
        invalid = check_answer(answer, question=query, demonstrations=self.demonstrations or (), passages=passages)
        if invalid is not None:
            return f"invalid answer ({invalid})"
        if self.min_confidence is not None:
            confidence = answer_confidence(reply.meta, answer)
            if confidence is not None and confidence < self.min_confidence:
                return f"confidence {confidence:.2f} < {self.min_confidence}"
        return None

    @component.output_types(**_OUTPUT_TYPES)
    def run(
        self, replies: list[ChatMessage], query: str | None = None, documents: list[Document] | None = None
    ) -> dict[str, Any]:
        """
        :param replies: The generator's replies; only the first is judged (none: `unknown`).
        :param query: The question, passed on as `fallback_query`.
        :param documents: The retrieved passages, passed on as `fallback_documents`.
        :returns: Exactly one branch: `known` (the replies), or `unknown` (the replies) with `reason` ("no reply",
            "unknown answer", "invalid answer (...)" or "confidence 0.31 < 0.5") and the fallback inputs given.
        """
        if not replies:
            logger.warning("UnknownRouter received no reply; routing to the unknown branch.")
        reason = self._reason(replies[0] if replies else None, documents, query)
        if reason is None:
            return {"known": replies}
        output: dict[str, Any] = {"unknown": replies, "reason": reason}
        if query is not None:
            output["fallback_query"] = query
        if documents is not None:
            output["fallback_documents"] = documents
        return output

    @component.output_types(**_OUTPUT_TYPES)
    async def run_async(
        self, replies: list[ChatMessage], query: str | None = None, documents: list[Document] | None = None
    ) -> dict[str, Any]:
        """Async form of `run`."""
        return self.run(replies=replies, query=query, documents=documents)
