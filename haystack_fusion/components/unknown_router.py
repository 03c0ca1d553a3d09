"""UnknownRouter: sends a reply that says "unknown" (or is too uncertain) to a fallback branch (Liu et al. 3.1, 3.3)."""

from __future__ import annotations

from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict, logging
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
    Routes an LLM reply to a `known` or an `unknown` branch, so a pipeline can fall back when the model abstains.

    Liu et al. (section 3.1) has the model say "unknown" when the passages do not answer the question; Post-Fusion
    as the Fallback (section 3.3) then answers again with per-passage post-fusion. The router reads the answer out of
    the first reply with the prompt's answer pattern and asks the shared `UnknownDetector`. An answer the validator
    rejects (`answers.check_answer`) goes to the fallback too, and so, with `min_confidence` and a reply that
    carries token log-probabilities, does an answer whose confidence is below it ("modeling uncertainty"). Only the
    chosen branch is emitted; the `unknown` branch passes `query` and `documents` on as `fallback_query` and
    `fallback_documents`, what the fallback component needs.

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
        Create an UnknownRouter.

        :param answer_pattern: Regular expression whose first group is the answer in the reply (default: the first
            line, as the Figure 7 prompt asks); None judges the whole reply.
        :param unknown_patterns: Regular expressions that mark an abstention; None uses the shared defaults
            (`haystack_fusion.answers.DEFAULT_UNKNOWN_PATTERNS`).
        :param min_confidence: Probability in (0, 1]: an answer whose confidence (the geometric mean of its
            tokens' probabilities, `answers.answer_confidence`) is below it goes to `unknown`. None disables the
            check (Liu et al.'s behaviour), and so does a reply without log-probabilities: ask the generator for them
            with `generation_kwargs={"logprobs": True}` (OpenAIChatGenerator, the embedded `LocalChatGenerator`).
        :param demonstrations: The demonstration answers of the prompt behind the replies
            (`PromptTemplate.demonstrations`), checked against the `documents` given to `run`; None skips that rule.
        :raises ValueError: If `min_confidence` is outside (0, 1] or a pattern is not a valid regular expression.
        """
        if min_confidence is not None and not 0 < min_confidence <= 1:
            raise ValueError(f"`min_confidence` must be in (0, 1], got {min_confidence}")
        self.answer_pattern = answer_pattern
        self.unknown_patterns = unknown_patterns
        self.min_confidence = min_confidence
        self.demonstrations = list(demonstrations) if demonstrations else None
        self._detector = UnknownDetector.from_patterns(unknown_patterns)

    def to_dict(self) -> dict[str, Any]:
        """Serialize this component to a dictionary."""
        return default_to_dict(
            self,
            answer_pattern=self.answer_pattern,
            unknown_patterns=self.unknown_patterns,
            min_confidence=self.min_confidence,
            demonstrations=self.demonstrations,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UnknownRouter:
        """Deserialize this component from a dictionary."""
        return default_from_dict(cls, data)

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
        Route the replies by their first reply.

        :param replies: The generator's replies; only the first is judged. An empty list is routed to `unknown`.
        :param query: The question: the answer checks reject an answer that repeats it; passed on as `fallback_query`.
        :param documents: The retrieved passages, passed on as `fallback_documents`.
        :returns: Exactly one branch:
            - `known`: the replies, when the first reply answers;
            - `unknown`: the replies, with `reason` ("no reply", "unknown answer", "invalid answer (<the validator's
              reason>)" or "confidence 0.31 < 0.5"), and `fallback_query` and `fallback_documents` when given.
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
        """Async form of `run`, with the same inputs and outputs (routing makes no I/O)."""
        return self.run(replies=replies, query=query, documents=documents)
