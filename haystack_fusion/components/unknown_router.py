"""UnknownRouter: sends a reply that says "unknown" (or is too uncertain) to a fallback branch (Liu et al. 3.1, 3.3)."""

from __future__ import annotations

from typing import Any, Literal

from haystack import Document, component, logging
from haystack.dataclasses import (
    ChatMessage,
    ComponentInfo,
    StreamingCallbackT,
    StreamingChunk,
    select_streaming_callback,
)

from haystack_fusion.answers import UnknownDetector, answer_confidence, check_answer, normalize_answer
from haystack_fusion.components.speculation import Speculation
from haystack_fusion.llm import InitSerialization, emit_chunk
from haystack_fusion.prompts import PROMPTS, extract_answer

logger = logging.getLogger(__name__)

Confidence = Literal["logprobs", "agreement", "none"]  # what the first reply's confidence is read from

CONFIDENCES: tuple[Confidence, ...] = ("logprobs", "agreement", "none")

_OUTPUT_TYPES: dict[str, Any] = {
    "known": list[ChatMessage],
    "unknown": list[ChatMessage],
    "fallback_query": str,
    "fallback_documents": list[Document],
    "reason": str,
    "fallback_speculation": Speculation,
}


@component
class UnknownRouter(InitSerialization):
    """
    Routes an LLM reply to `known` or `unknown` (with `fallback_query` and `fallback_documents`), so a pipeline can
    fall back when the model abstains (Liu et al., sections 3.1 and 3.3); rejected and, with `min_confidence`, too
    uncertain answers too. The confidence comes from token log-probabilities, or with `confidence="agreement"` from
    the share of m samples (`AbstainingChatGenerator(samples=m)`) agreeing with the reply. An accepted answer is
    streamed as one chunk.

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
        confidence: Confidence = "logprobs",
        streaming_callback: StreamingCallbackT | None = None,
    ) -> None:
        """
        :param answer_pattern: Regular expression whose first group is the answer (default: the first line, Figure 7);
            None judges the whole reply.
        :param unknown_patterns: Regular expressions that mark an abstention; None uses the shared defaults.
        :param min_confidence: Probability in (0, 1]: an answer whose confidence is below it goes to `unknown`; None,
            or a reply without log-probabilities (or without samples, for "agreement"), skips the check.
        :param demonstrations: The prompt's demonstration answers, checked against `documents`; None skips that rule.
        :param confidence: "logprobs" (`answers.answer_confidence` of the first reply), "agreement" (the share of the
            other replies, the samples, that give the first reply's answer) or "none" (no confidence check).
        :param streaming_callback: Called with one `StreamingChunk` holding the answer read from a `known` reply; not
            called for `unknown`. Sync for `run`; sync or async for `run_async`.
        :raises ValueError: If `min_confidence` is outside (0, 1], `confidence` is unknown or a pattern is not a valid
            regular expression.
        """
        if confidence not in CONFIDENCES:
            raise ValueError(f"`confidence` must be {', '.join(CONFIDENCES[:-1])} or none, got {confidence!r}")
        if min_confidence is not None and not 0 < min_confidence <= 1:
            raise ValueError(f"`min_confidence` must be in (0, 1], got {min_confidence}")
        self.answer_pattern = answer_pattern
        self.unknown_patterns = unknown_patterns
        self.min_confidence = min_confidence
        self.demonstrations = list(demonstrations) if demonstrations else None
        self.confidence = confidence
        self.streaming_callback = streaming_callback
        self._detector = UnknownDetector.from_patterns(unknown_patterns)

    def _answer(self, reply: ChatMessage) -> str:
        text = reply.text
        return extract_answer(self.answer_pattern, text) if self.answer_pattern else (text or "").strip()

    def _chunk(self, answer: str) -> StreamingChunk:
        """The streamed form of an accepted answer: one chunk, the whole answer."""
        info = ComponentInfo.from_component(self)
        return StreamingChunk(content=answer, component_info=info, index=0, start=True, finish_reason="stop")

    def _confidence(self, replies: list[ChatMessage], answer: str) -> float | None:
        """The first reply's confidence by `self.confidence`; None when it cannot be read."""
        if self.confidence == "logprobs":
            return answer_confidence(replies[0].meta, answer)
        if self.confidence == "none" or len(replies) < 2:
            return None
        samples = [normalize_answer(self._answer(reply)) for reply in replies[1:]]
        return samples.count(normalize_answer(answer)) / len(samples)

    def _reason(
        self, replies: list[ChatMessage], documents: list[Document] | None, query: str | None
    ) -> tuple[str | None, float | None]:
        """Why the first reply goes to the fallback (see `run`), or None when it answers; and its confidence."""
        if not replies:
            return "no reply", None
        answer = self._answer(replies[0])
        confidence = self._confidence(replies, answer)
        if self._detector.is_unknown(answer):
            return "unknown answer", confidence
        passages = [document.content or "" for document in documents or []]
        invalid = check_answer(answer, question=query, demonstrations=self.demonstrations or (), passages=passages)
        if invalid is not None:
            return f"invalid answer ({invalid})", confidence
        if self.min_confidence is not None and confidence is not None and confidence < self.min_confidence:
            return f"confidence {confidence:.2f} < {self.min_confidence}", confidence
        return None, confidence

    def _route(self, replies: list[ChatMessage], **fallback: Any) -> dict[str, Any]:
        if not replies:
            logger.warning("UnknownRouter received no reply; routing to the unknown branch.")
        reason, confidence = self._reason(replies, fallback["documents"], fallback["query"])
        if self.confidence == "agreement" and replies:  # the answer's confidence is the agreement, not its tokens'
            first = replies[0]
            meta = {**first.meta, "confidence": confidence, "agreement_samples": len(replies) - 1}
            replies = [ChatMessage.from_assistant(first.text or "", meta=meta, name=first.name)]
        else:
            replies = replies[:1]
        if reason is None:
            if fallback["speculation"] is not None:
                fallback["speculation"].cancel()
            return {"known": replies}
        given = {f"fallback_{name}": value for name, value in fallback.items() if value is not None}
        return {"unknown": replies, "reason": reason, **given}

    @component.output_types(**_OUTPUT_TYPES)
    def run(
        self,
        replies: list[ChatMessage],
        query: str | None = None,
        documents: list[Document] | None = None,
        streaming_callback: StreamingCallbackT | None = None,
        speculation: Speculation | None = None,
    ) -> dict[str, Any]:
        """
        :param replies: The generator's replies: the first is judged (none: `unknown`); with "agreement", the others
            are the samples it is compared with.
        :param query: The question, passed on as `fallback_query`.
        :param documents: The retrieved passages, passed on as `fallback_documents`.
        :param streaming_callback: Overrides the one given at init for this run.
        :param speculation: Post-fusion's round started ahead (`PostFusionSpeculator`): cancelled for `known`, passed
            on as `fallback_speculation` for `unknown`.
        :returns: Exactly one branch: `known` (the first reply; with "agreement" its `meta` gains `confidence` and
            `agreement_samples`, the number of samples), or `unknown` (the same) with `reason` ("no reply",
            "unknown answer", "invalid answer (...)" or "confidence 0.31 < 0.5") and the fallback inputs given.
        :raises ValueError: If the streaming callback is async (`run_async` takes those).
        """
        callback = select_streaming_callback(self.streaming_callback, streaming_callback, requires_async=False)
        output = self._route(replies, query=query, documents=documents, speculation=speculation)
        if callback is not None and "known" in output:
            callback(self._chunk(self._answer(replies[0])))
        return output

    @component.output_types(**_OUTPUT_TYPES)
    async def run_async(
        self,
        replies: list[ChatMessage],
        query: str | None = None,
        documents: list[Document] | None = None,
        streaming_callback: StreamingCallbackT | None = None,
        speculation: Speculation | None = None,
    ) -> dict[str, Any]:
        """Async form of `run`; the streaming callback may be sync or async (`Pipeline.stream()` injects one)."""
        callback = select_streaming_callback(self.streaming_callback, streaming_callback, requires_async=True)
        output = self._route(replies, query=query, documents=documents, speculation=speculation)
        if callback is not None and "known" in output:
            await emit_chunk(callback, self._chunk(self._answer(replies[0])))
        return output
