"""CheckedAnswerBuilder: Haystack's AnswerBuilder, with the package's answer validator on every answer it reads."""

from __future__ import annotations

from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict
from haystack.components.builders import AnswerBuilder
from haystack.dataclasses import ChatMessage, GeneratedAnswer

from haystack_fusion.llm import meta_truncated
from haystack_fusion.validation import check_answer, invalid_answer


@component
class CheckedAnswerBuilder(AnswerBuilder):
    """
    Reads answers from replies as Haystack's `AnswerBuilder` does, then rejects what is not an answer.

    Each answer goes through `haystack_fusion.validation.check_answer`: passage markup (`<passage key="...">`, a bare
    key, `[2]`), a copy of one of the prompt's demonstration answers that the passages do not contain, an
    enumeration with no content (`(i) (ii) (iii)`) or a repeat of the question (`validation.repeats_question`)
    becomes an empty answer whose `meta` says
    `answer_source="invalid"`, with `invalid_reason` and `rejected_answer` (the evaluation counts it apart from
    "unknown"). Valid answers pass through unchanged, so its output is AnswerBuilder's whenever nothing is
    rejected. The passages an answer is checked against are the `documents` given to `run` (all of them: with no
    `reference_pattern`, AnswerBuilder attaches every document to every answer).

    ### Usage example
    ```python
    from haystack import Document
    from haystack.dataclasses import ChatMessage
    from haystack_fusion.components.checked_answer_builder import CheckedAnswerBuilder

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
        Create a CheckedAnswerBuilder.

        :param pattern: As AnswerBuilder's: a regular expression whose (first) group is the answer.
        :param reference_pattern: As AnswerBuilder's.
        :param last_message_only: As AnswerBuilder's.
        :param return_only_referenced_documents: As AnswerBuilder's.
        :param expand_reference_ranges: As AnswerBuilder's.
        :param demonstrations: The answers of the prompt's few-shot demonstrations (`PromptTemplate.demonstrations`);
            an answer equal to one that no passage contains is rejected. None or empty skips that rule (the other
            two always apply).
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

    def to_dict(self) -> dict[str, Any]:
        """Serialize this component to a dictionary."""
        return default_to_dict(
            self,
            pattern=self.pattern,
            reference_pattern=self.reference_pattern,
            last_message_only=self.last_message_only,
            return_only_referenced_documents=self.return_only_referenced_documents,
            expand_reference_ranges=self.expand_reference_ranges,
            demonstrations=self.demonstrations,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckedAnswerBuilder:
        """Deserialize this component from a dictionary."""
        return default_from_dict(cls, data)

    def check(self, answer: GeneratedAnswer) -> GeneratedAnswer:
        """
        Validate one answer against its question, the demonstrations and its documents.

        :param answer: An answer as AnswerBuilder made it.
        :returns: The answer itself when valid; else the empty replacement (`validation.invalid_answer`). Either
            way, when the reply said how it finished, `meta["truncated"]` says whether the token cap cut it
            (`llm.meta_truncated`: `finish_reason` "length"): an answer read from a cut reply may be
            cut too.
        """
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
        """
        Build the answers as AnswerBuilder does, then validate each (see the class docstring).

        :param query: The question.
        :param replies: The generator's replies (strings or ChatMessages).
        :param meta: As AnswerBuilder's.
        :param documents: The passages the prompt showed; the answers are checked against their text.
        :param pattern: As AnswerBuilder's.
        :param reference_pattern: As AnswerBuilder's.
        :param expand_reference_ranges: As AnswerBuilder's.
        :returns: `answers`: one `GeneratedAnswer` per reply, as AnswerBuilder's, the rejected ones emptied.
        :raises ValueError: As AnswerBuilder's (replies and meta of different lengths, a pattern with two groups).
        """
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
        return {"answers": [self.check(answer) for answer in answers]}
