"""NoteTaker: Chain-of-Note reading notes per retrieved passage, then the answer (Yu et al., section 2.3)."""

from __future__ import annotations

from typing import Any, Literal

from haystack import Document, component
from haystack.components.generators.chat.types import ChatGenerator
from haystack.dataclasses import ChatMessage, GeneratedAnswer, StreamingCallbackT, select_streaming_callback

from haystack_fusion.answers import UNKNOWN, UnknownDetector, check_answer, invalid_meta, validate_query
from haystack_fusion.llm import (
    ChatGeneratorWrapper,
    FanOutResult,
    Round,
    Rounds,
    check_max_concurrency,
    failures_meta,
    round_usage,
)
from haystack_fusion.notes import CONTEXT, DIRECT, classify_note, parse_document_note, parse_single_call
from haystack_fusion.prompts import (
    DEFAULT_MAX_PASSAGE_CHARS,
    PROMPTS,
    ChatPrompt,
    ChatTemplate,
    format_passages,
    strip_delimiters,
)
from haystack_fusion.prompts.chain_of_note import (
    RELEVANCE_WORDS,
    STEP_5_PARAMETRIC,
    STEP_5_UNKNOWN,
    single_call_variables,
)

NoteMode = Literal["single_call", "per_document"]
NOTE_MODES: tuple[str, ...] = ("single_call", "per_document")


@component
class NoteTaker(ChatGeneratorWrapper):
    """
    Writes a reading note per retrieved passage, judges its relevance, then answers (Chain-of-Note, Yu et al.).

    Each note carries the passage's id and a note type of section 2.3.1: `direct`, `context` or `irrelevant`. With no
    relevant passage the model answers from its own knowledge if `allow_parametric_knowledge` (Appendix A.5 step 5),
    else the answer is "unknown" (Figure 2 (c)).

    `mode="single_call"` (the paper's): one call with Appendix A.5's instruction and Table 6's first case.
    `mode="per_document"`: a labelled note call per passage, then one synthesis call (steps 4-5).

    ### Usage example
    ```python
    from haystack import Document
    from haystack.components.generators.chat import MockChatGenerator
    from haystack_fusion import NoteTaker

    reply = "Passage #1 says Paris is the capital of France. Based on the information given in above passages, the "
    llm = MockChatGenerator(responses=[reply + "answer is Paris"])
    result = NoteTaker(chat_generator=llm).run(query="Capital of France?", documents=[Document(content="Paris ...")])
    print(result["answers"][0].data, result["notes"][0]["relevance"])  # Paris direct
    ```
    """

    def __init__(
        self,
        *,
        chat_generator: ChatGenerator,
        mode: NoteMode = "single_call",
        allow_parametric_knowledge: bool = True,
        max_concurrency: int | None = None,
        max_passage_chars: int | None = DEFAULT_MAX_PASSAGE_CHARS,
        generation_kwargs: dict[str, Any] | None = None,
        unknown_patterns: list[str] | None = None,
        raise_on_failure: bool = False,
        streaming_callback: StreamingCallbackT | None = None,
        note_prompt: ChatTemplate | None = None,
        answer_prompt: ChatTemplate | None = None,
        system_prompt: str | None = None,
    ) -> None:
        """
        :param mode: "single_call" (one prompt, the paper's) or "per_document" (a note per passage, then synthesis).
        :param allow_parametric_knowledge: With no relevant passage, answer from the model's knowledge (step 5).
        :param max_concurrency: Most note calls under way at once in per-document mode (>= 1); None: all k.
        :param max_passage_chars: Per-passage context budget in characters (None: no limit).
        :param unknown_patterns: Regular expressions that mark an abstention; None uses the shared defaults.
        :param raise_on_failure: A failed call raises; by default a failed note is irrelevant and reported in
            `meta["failures"]`.
        :param streaming_callback: Gets the chunks of the call that writes the answer (not the note calls); sync for
            `run`, sync or async for `run_async`.
        :param note_prompt: The per-document note `ChatPromptBuilder` template; None: ours after section 2.3.1.
            Variables, both required: `query`, `passages` (the one passage). The reply ends with a line
            "Relevance: (a) answers directly", "(b) useful context" or "(c) irrelevant".
        :param answer_prompt: The template that writes the answer. Single call (None: Appendix A.5): `query` and
            `passages` required, `k_words`, `step_5`; the reply names passages ("Passage #1") and says "the answer is
            X". Per document (None: steps 4-5): `query` and `notes` (`label`, `note`) required, `step_5`; the reply's
            first line is the answer. The default's answer pattern, stop and demonstrations stay in force.
        :param system_prompt: A system message sent before every prompt; None: none.
        :raises ValueError: If a value is out of range, `note_prompt` is given in single-call mode, or a prompt's
            variables do not match.
        """
        if mode not in NOTE_MODES:
            raise ValueError(f"`mode` must be one of {', '.join(NOTE_MODES)}, got {mode!r}")
        if max_passage_chars is not None and max_passage_chars <= 0:
            raise ValueError(f"`max_passage_chars` must be positive or None, got {max_passage_chars}")
        self._chat_generator = chat_generator
        self.mode = mode
        self.allow_parametric_knowledge = allow_parametric_knowledge
        self.max_concurrency = check_max_concurrency(max_concurrency)
        self.max_passage_chars = max_passage_chars
        self.generation_kwargs = generation_kwargs
        self.unknown_patterns = unknown_patterns
        self.raise_on_failure = raise_on_failure
        self.streaming_callback = streaming_callback
        self._detector = UnknownDetector.from_patterns(unknown_patterns)
        if mode == "single_call" and note_prompt is not None:
            raise ValueError("`note_prompt` is used in per-document mode only")
        self.note_prompt = note_prompt
        self.answer_prompt = answer_prompt
        self.system_prompt = system_prompt
        self._note_prompt = ChatPrompt(
            PROMPTS["con_document_note"], note_prompt, system_prompt=system_prompt, parameter="note_prompt"
        )
        single = mode == "single_call"
        self._answer_prompt = ChatPrompt(
            PROMPTS["con_single_call" if single else "con_synthesis"],
            answer_prompt,
            system_prompt=system_prompt,
            parameter="answer_prompt",
            required=("passages", "query") if single else ("notes", "query"),
        )

    def _notes(self, documents: list[Document], first: FanOutResult | None) -> tuple[list[dict[str, Any]], str | None]:
        """The notes (input order) and, in single-call mode, the answer text."""
        replies = [
            None if r is None or r.text is None else strip_delimiters(r.text) for r in (first.replies if first else [])
        ]
        if self.mode == "single_call":
            text = replies[0] if replies else None
            parsed = parse_single_call(text, len(documents))
            notes = [
                {"document_id": d.id, "note": note, "relevance": classify_note(note, parsed.answer, self._detector)}
                for d, note in zip(documents, parsed.notes, strict=True)
            ]
            return notes, (parsed.answer if text is not None else None)
        notes = []
        for document, reply in zip(documents, replies, strict=True):
            note, label = parse_document_note(reply)
            relevance = label or classify_note(note, "", self._detector)
            notes.append({"document_id": document.id, "note": note, "relevance": relevance})
        return notes, None

    def _synthesis(self, query: str, notes: list[dict[str, Any]]) -> list[list[ChatMessage]]:
        """Per-document round 2's prompt (steps 4-5), when it can answer."""
        if self.mode != "per_document" or (not _relevant(notes) and not self.allow_parametric_knowledge):
            return []
        shown = [{"label": RELEVANCE_WORDS[n["relevance"]], "note": " ".join(n["note"].split())} for n in notes]
        step_5 = STEP_5_PARAMETRIC if self.allow_parametric_knowledge else STEP_5_UNKNOWN
        return [self._answer_prompt.render(query=query, notes=shown, step_5=step_5)]

    def _rounds(self, query: str, documents: list[Document] | None, callback: StreamingCallbackT | None) -> Rounds:
        """The single call, or a note call per passage then the synthesis."""
        query, documents = validate_query(query), list(documents or [])
        single, prompts = self.mode == "single_call", []
        if not single:
            passages = [format_passages([d], self.max_passage_chars, "titled") for d in documents]
            prompts = [self._note_prompt.render(query=query, passages=p) for p in passages]
        elif documents or self.allow_parametric_knowledge:
            knowledge = {"allow_parametric_knowledge": self.allow_parametric_knowledge}
            variables = single_call_variables(query, documents, max_passage_chars=self.max_passage_chars, **knowledge)
            prompts = [self._answer_prompt.render(**variables)]
        first = yield Round(prompts, self.generation_kwargs, streaming_callback=callback if single else None)
        notes, answer_text = self._notes(documents, first)
        synthesis = self._synthesis(query, notes)  # it stops at the answer line
        second = yield Round(synthesis, self.generation_kwargs, self._answer_prompt.stop, callback)
        return self._outputs(query, documents, notes, answer_text, first, second)

    def _outputs(
        self,
        query: str,
        documents: list[Document],
        notes: list[dict[str, Any]],
        answer_text: str | None,
        first: FanOutResult | None,
        second: FanOutResult | None,
    ) -> dict[str, Any]:
        """The answer from the relevant notes, the model's knowledge, or "unknown" (section 2.3.1)."""
        if self.mode == "per_document":
            reply = second.replies[0] if second and second.replies else None
            answer_text = PROMPTS["con_synthesis"].extract_answer(reply.text) if reply is not None else None
        relevant = _relevant(notes)
        if relevant:
            source = "passages"
        elif self.allow_parametric_knowledge and answer_text:
            source = "parametric"
        else:
            source, answer_text = "none", None
        answer = (answer_text or "").strip()
        if not answer or self._detector.is_unknown(answer):
            answer, source = UNKNOWN, "none"
        meta = {
            "strategy": f"chain_of_note ({self.mode})",
            "source": "Yu et al., section 2.3, Appendix A.5",
            "notes": notes,
            "answer_source": source,
            "failures": failures_meta(first, second),
            "usage": round_usage(first, second),
        }
        if source != "none":
            prompt = PROMPTS["con_single_call" if self.mode == "single_call" else "con_synthesis"]
            passages = [document.content or "" for document in documents]
            reason = check_answer(answer, question=query, demonstrations=prompt.demonstrations, passages=passages)
            if reason is not None:
                meta.update(invalid_meta(answer, reason))
                answer = ""
        ids = {note["document_id"] for note in relevant}
        supporting = [document for document in documents if document.id in ids]
        return {"answers": [GeneratedAnswer(data=answer, query=query, documents=supporting, meta=meta)], "notes": notes}

    @component.output_types(answers=list[GeneratedAnswer], notes=list[dict[str, Any]])
    def run(
        self, query: str, documents: list[Document], streaming_callback: StreamingCallbackT | None = None
    ) -> dict[str, Any]:
        """
        :param documents: The k passages, best-ranked first (may be empty).
        :param streaming_callback: Overrides the one given at init for this run.
        :returns: `answers`: one GeneratedAnswer (or "unknown") with the relevant passages; `meta`: `notes`,
            `answer_source` ("passages", "parametric", "none" or "invalid"), `failures`, `usage`. `notes`: k dicts,
            input order: `document_id`, `relevance` ("direct", "context", "irrelevant"; section 2.3.1), `note`.
        :raises ValueError: If `query` is empty, or the streaming callback is async.
        :raises LLMCallsFailedError: If every call of a round failed.
        """
        callback = select_streaming_callback(self.streaming_callback, streaming_callback, requires_async=False)
        return self._drive(self._rounds(query, documents, callback))

    @component.output_types(answers=list[GeneratedAnswer], notes=list[dict[str, Any]])
    async def run_async(
        self, query: str, documents: list[Document], streaming_callback: StreamingCallbackT | None = None
    ) -> dict[str, Any]:
        """Async form of `run`; the streaming callback may be sync or async."""
        callback = select_streaming_callback(self.streaming_callback, streaming_callback, requires_async=True)
        return await self._drive_async(self._rounds(query, documents, callback))


def _relevant(notes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [note for note in notes if note["relevance"] in (DIRECT, CONTEXT)]
