"""The concatenation stage's components: the passages as one context block, the call (a failure reported, not
raised) and the answer read and validated."""

from __future__ import annotations

from typing import Any

from haystack import Document, component
from haystack.components.builders import AnswerBuilder
from haystack.components.generators.chat.types import ChatGenerator
from haystack.dataclasses import ChatMessage, GeneratedAnswer

from haystack_fusion.answers import check_answer, invalid_answer
from haystack_fusion.llm import (
    DEFAULT_SAMPLING_KWARGS,
    ChatGeneratorWrapper,
    Round,
    Rounds,
    backend_unusable,
    failures_meta,
    meta_truncated,
    round_usage,
)
from haystack_fusion.prompts import DEFAULT_MAX_PASSAGE_CHARS, PASSAGE_LAYOUTS, PassageLayout, format_passages


@component
class PassageFormatter:
    """
    Turns passages into the prompts' delimited context block, for retriever -> PassageFormatter -> ChatPromptBuilder.

    ### Usage example
    ```python
    from haystack import Document
    from haystack_fusion.components import PassageFormatter

    print(PassageFormatter().run(documents=[Document(content="Paris is in France.")])["passages"])
    ```
    """

    def __init__(
        self,
        *,
        max_passage_chars: int | None = DEFAULT_MAX_PASSAGE_CHARS,
        layout: PassageLayout = "numbered",
        datamark: bool = False,
    ) -> None:
        """
        :param max_passage_chars: Per-passage context budget in characters; None for no limit.
        :param layout: "numbered" (`[i]`, Liu et al.'s figures) or "titled" (`Passage #i Title/Text`, Kim et al.).
        :param datamark: Datamark the passage text (" ^ " between words; "spotlighting") against injected instructions.
        :raises ValueError: If `max_passage_chars` is not positive or `layout` is unknown.
        """
        if max_passage_chars is not None and max_passage_chars <= 0:
            raise ValueError(f"`max_passage_chars` must be positive or None, got {max_passage_chars}")
        if layout not in PASSAGE_LAYOUTS:
            raise ValueError(f"`layout` must be one of {', '.join(PASSAGE_LAYOUTS)}, got {layout!r}")
        self.max_passage_chars = max_passage_chars
        self.layout = layout
        self.datamark = datamark

    @component.output_types(passages=str)
    def run(self, documents: list[Document]) -> dict[str, Any]:
        """:returns: `passages`: the context block of the documents, best-ranked first ("" for none)."""
        return {"passages": format_passages(documents, self.max_passage_chars, self.layout, datamark=self.datamark)}


@component
class AbstainingChatGenerator(ChatGeneratorWrapper):
    """
    Calls a ChatGenerator once per run; a failed call gives no reply and a report in `meta["failures"]`, so
    `UnknownRouter` can fall back to post-fusion (an unusable backend raises). With `samples` m > 0, m sampled calls
    follow a successful one (self-consistency, Liu et al., section 4.4) for `UnknownRouter(confidence="agreement")`.

    ### Usage example
    ```python
    from haystack.dataclasses import ChatMessage
    from haystack_fusion.components import AbstainingChatGenerator
    from haystack_fusion.testing import ScriptedChatGenerator

    llm = AbstainingChatGenerator(chat_generator=ScriptedChatGenerator(fail_on="France"))  # a failing call
    result = llm.run(messages=[ChatMessage.from_user("What is the capital of France?")])
    print(result["replies"], result["meta"]["failures"][0]["error_type"])  # [] RuntimeError
    ```
    """

    _ROUND_MAY_FAIL = True  # a failed call is no reply, for the fallback to post-fusion

    def __init__(
        self,
        *,
        chat_generator: ChatGenerator,
        samples: int = 0,
        sampling_generation_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """
        :param samples: m, sampled calls after a successful first one (0: none).
        :param sampling_generation_kwargs: The sampled calls' `generation_kwargs`, on top of the call's; None:
            `{"temperature": 0.7}` (Liu et al., section 4.4).
        :raises ValueError: If `samples` is negative.
        """
        if samples < 0:
            raise ValueError(f"`samples` must be at least 0, got {samples}")
        self._chat_generator = chat_generator
        self.samples = samples
        self.sampling_generation_kwargs = sampling_generation_kwargs

    def _rounds(self, messages: list[ChatMessage], generation_kwargs: dict[str, Any] | None) -> Rounds:
        calls = yield Round([messages], generation_kwargs, raise_if=backend_unusable)
        assert calls is not None  # a round of one call
        reply, sampled = calls.replies[0], None
        if self.samples and reply is not None:
            sampling = {**(generation_kwargs or {}), **(self.sampling_generation_kwargs or DEFAULT_SAMPLING_KWARGS)}
            sampled = yield Round([messages] * self.samples, sampling, raise_if=backend_unusable)
        samples = [sample for sample in (sampled.replies if sampled else []) if sample is not None]
        return {
            "replies": [] if reply is None else [reply, *samples],
            "meta": {"usage": round_usage(calls, sampled), "failures": failures_meta(calls, sampled)},
        }

    @component.output_types(replies=list[ChatMessage], meta=dict[str, Any])
    def run(self, messages: list[ChatMessage], generation_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        """
        :returns: `replies` (the first reply, then the samples that did not fail; [] when the first call failed) and
            `meta`: `usage` and `failures`.
        :raises Exception: The generator's exception when the backend is unusable (refused connection or key).
        """
        return self._drive(self._rounds(messages, generation_kwargs))

    @component.output_types(replies=list[ChatMessage], meta=dict[str, Any])
    async def run_async(
        self, messages: list[ChatMessage], generation_kwargs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Async form of `run`."""
        return await self._drive_async(self._rounds(messages, generation_kwargs))


@component
class CheckedAnswerBuilder(AnswerBuilder):
    """
    Reads answers as Haystack's `AnswerBuilder` does, then empties what `answers.check_answer` rejects (`meta`:
    `answer_source="invalid"`, `invalid_reason`, `rejected_answer`); `meta["truncated"]` when the reply says.

    ### Usage example
    ```python
    from haystack import Document
    from haystack.dataclasses import ChatMessage
    from haystack_fusion.components import CheckedAnswerBuilder

    builder = CheckedAnswerBuilder(pattern=r"^\\s*([^\\n]*)", demonstrations=["1925"])
    result = builder.run(
        query="When was he born?",
        replies=[ChatMessage.from_assistant("1925")],
        documents=[Document(content="He was born in 1931.")],
    )
    answer = result["answers"][0]
    print(repr(answer.data), answer.meta["invalid_reason"])  # '' 'demonstration answer'
    ```
    """

    def __init__(
        self,
        pattern: str | None = None,
        reference_pattern: str | None = None,
        last_message_only: bool = False,
        *,
        return_only_referenced_documents: bool = True,
        expand_reference_ranges: bool = False,
        demonstrations: list[str] | None = None,
    ) -> None:
        """
        The parameters but the last are AnswerBuilder's.

        :param demonstrations: The prompt's demonstration answers; one no passage contains is rejected (None: no check).
        :raises ValueError: If `pattern` has more than one group (AnswerBuilder's check).
        """
        AnswerBuilder.__init__(  # the @component decorator rebuilds the class: no zero-argument super()
            self,
            pattern=pattern,
            reference_pattern=reference_pattern,
            last_message_only=last_message_only,
            return_only_referenced_documents=return_only_referenced_documents,
            expand_reference_ranges=expand_reference_ranges,
        )
        self.demonstrations = list(demonstrations) if demonstrations else None

    def _check(self, answer: GeneratedAnswer) -> GeneratedAnswer:
        if (truncated := meta_truncated(answer.meta)) is not None:
            answer.meta["truncated"] = truncated
        passages = [document.content or "" for document in answer.documents or []]
        reason = check_answer(
            answer.data, question=answer.query, demonstrations=self.demonstrations or (), passages=passages
        )
        return answer if reason is None else invalid_answer(answer, reason)

    @component.output_types(answers=list[GeneratedAnswer])
    def run(  # type: ignore[override]
        self,
        query: str,
        replies: list[str] | list[ChatMessage],
        meta: list[dict[str, Any]] | None = None,
        documents: list[Document] | None = None,
        pattern: str | None = None,
        reference_pattern: str | None = None,
        expand_reference_ranges: bool | None = None,
    ) -> dict[str, Any]:
        """AnswerBuilder's answers (same parameters and errors), each checked against the `documents`' text."""
        answers = AnswerBuilder.run(
            self,
            query=query,
            replies=replies,
            meta=meta,
            documents=documents,
            pattern=pattern,
            reference_pattern=reference_pattern,
            expand_reference_ranges=expand_reference_ranges,
        )["answers"]
        return {"answers": [self._check(answer) for answer in answers]}
