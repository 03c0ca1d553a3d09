"""NoteTaker: Chain-of-Note reading notes per retrieved passage, then the answer (Yu et al., section 2.3)."""

from __future__ import annotations

from typing import Any, Literal

from haystack import Document, component, default_to_dict, logging
from haystack.components.generators.chat.types import ChatGenerator
from haystack.core.serialization import component_to_dict
from haystack.dataclasses import ChatMessage, GeneratedAnswer, StreamingCallbackT, select_streaming_callback
from haystack.utils import deserialize_callable, serialize_callable

from haystack_fusion.answers import UNKNOWN, UnknownDetector, check_answer, invalid_meta, validate_query
from haystack_fusion.llm import (
    ChatGeneratorWrapper,
    FanOutResult,
    check_answered,
    check_max_concurrency,
    failures_meta,
    run_chat_calls,
    run_chat_calls_async,
    stop_kwargs,
    sum_usage,
)
from haystack_fusion.notes import CONTEXT, DIRECT, classify_note, parse_document_note, parse_single_call
from haystack_fusion.prompts import (
    DEFAULT_MAX_PASSAGE_CHARS,
    PROMPTS,
    ChatPrompt,
    ChatTemplate,
    format_passages,
    prompt_settings,
    prompt_settings_from_dict,
    strip_delimiters,
)
from haystack_fusion.prompts.chain_of_note import (
    RELEVANCE_WORDS,
    STEP_5_PARAMETRIC,
    STEP_5_UNKNOWN,
    single_call_variables,
)

logger = logging.getLogger(__name__)

NoteMode = Literal["single_call", "per_document"]
NOTE_MODES: tuple[str, ...] = ("single_call", "per_document")


@component
class NoteTaker(ChatGeneratorWrapper):
    """
    Writes a reading note per retrieved passage, judges its relevance, then answers (Chain-of-Note, Yu et al.).

    Each note carries the passage's id and a note type of section 2.3.1: `direct`, `context` or `irrelevant`. With no
    relevant passage the model answers from its own knowledge if `allow_parametric_knowledge` (Appendix A.5 step 5),
    else the answer is "unknown" (Figure 2 (c)).

    - `mode="single_call"` (the paper's): one call with Appendix A.5's instruction and Table 6's first case; the
      reply is split by `notes.parse_single_call` and each note typed by `notes.classify_note`.
    - `mode="per_document"`: one labelled note call per passage, concurrently, then one synthesis call (steps 4-5):
      k + 1 calls in 2 rounds; the synthesis is skipped without parametric knowledge and relevant notes.

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
        :param generation_kwargs: `generation_kwargs` for every call; None keeps the generator's own.
        :param unknown_patterns: Regular expressions that mark an abstention; None uses the shared defaults.
        :param raise_on_failure: A failed call raises; by default a failed note is irrelevant and reported in
            `meta["failures"]` (a round whose every call failed raises `failures.LLMCallsFailedError`).
        :param streaming_callback: Called with each `StreamingChunk` of the call that writes the answer: the single
            call (its notes, then the answer) or the per-document synthesis call; the note calls are not streamed.
            A sync callback for `run`, sync or async for `run_async` (what `Pipeline.stream()` injects).
        :param note_prompt: The per-document note prompt (per-document mode), a template as Haystack's
            `ChatPromptBuilder(template=...)` takes it (a Jinja string, which may use `{% message %}` blocks, or a
            list of ChatMessage templates); None: ours after Yu et al., section 2.3.1 and Appendix A.5
            (`PROMPTS["con_document_note"]`). Its variables, both to be used: `query` (str) and `passages` (str, the
            one passage as a titled `prompts.format_passages` block, numbered 1). The reply is the note, then a line
            "Relevance: (a) answers directly", "(b) useful context" or "(c) irrelevant" (`notes.parse_document_note`;
            without that line the note's words decide).
        :param answer_prompt: The prompt that writes the answer, a template as `note_prompt`. In single-call mode the
            one prompt (None: Appendix A.5 with Table 6's first case, `PROMPTS["con_single_call"]`); its variables:
            `query` (str), `passages` (str, the k passages as a titled block), `k_words` (str, k in words) and
            `step_5` (str, Appendix A.5's step 5 or its "answer unknown" form, by `allow_parametric_knowledge`); it
            must use `query` and `passages`. The reply must hold notes that name their passages ("Passage #1",
            "[1]") and state the answer as "the answer is X" or "Answer: X" (`notes.parse_single_call`). In
            per-document mode the synthesis prompt (None: steps 4-5 of Appendix A.5, `PROMPTS["con_synthesis"]`);
            its variables: `query` (str), `notes` (list of dicts, one per passage in rank order: `label`, the
            relevance in words, and `note`, on one line) and `step_5`; it must use `query` and `notes`; the reply's
            first line is the answer (the default prompt ends with "the answer is"). The default's answer pattern,
            stop sequence and demonstration answers stay in force.
        :param system_prompt: A system message sent before every prompt (for chat models); None: none.
        :raises ValueError: If `mode` is unknown, `max_concurrency` is neither None nor an integer >= 1,
            `max_passage_chars` is not positive, `note_prompt` is given in single-call mode, or a prompt does not use
            a variable it must use or uses one it does not get.
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

    def to_dict(self) -> dict[str, Any]:
        """Serialize this component, with its chat generator, to a dictionary."""
        return default_to_dict(
            self,
            chat_generator=component_to_dict(obj=self._chat_generator, name="chat_generator"),
            mode=self.mode,
            allow_parametric_knowledge=self.allow_parametric_knowledge,
            max_concurrency=self.max_concurrency,
            max_passage_chars=self.max_passage_chars,
            generation_kwargs=self.generation_kwargs,
            unknown_patterns=self.unknown_patterns,
            raise_on_failure=self.raise_on_failure,
            streaming_callback=serialize_callable(self.streaming_callback) if self.streaming_callback else None,
            **prompt_settings(
                note_prompt=self.note_prompt, answer_prompt=self.answer_prompt, system_prompt=self.system_prompt
            ),
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NoteTaker:
        """Deserialize this component, with its chat generator, streaming callback and prompts, from a dictionary."""
        prompt_settings_from_dict(data["init_parameters"], ["note_prompt", "answer_prompt"])
        callback = data.get("init_parameters", {}).get("streaming_callback")
        if callback:
            data["init_parameters"]["streaming_callback"] = deserialize_callable(callback)
        # `@component` rebuilds the class, so a zero-argument super() does not reach the mixin
        return ChatGeneratorWrapper.from_dict.__func__(cls, data)  # type: ignore[attr-defined]

    def _fan_out(self, generation_kwargs: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "max_concurrency": self.max_concurrency,
            "generation_kwargs": generation_kwargs,
            "raise_on_failure": self.raise_on_failure,
            "caller": self,
        }

    def _first_round(self, query: str, documents: list[Document] | None) -> tuple[str, list[Document], list[Any]]:
        """Validate; the single prompt, or one note prompt per passage (none without passages in that mode)."""
        query = validate_query(query)
        documents = list(documents or [])
        if self.mode == "per_document":
            passages = [format_passages([d], self.max_passage_chars, "titled") for d in documents]
            return query, documents, [self._note_prompt.render(query=query, passages=p) for p in passages]
        if not documents and not self.allow_parametric_knowledge:
            return query, documents, []
        variables = single_call_variables(
            query,
            documents,
            allow_parametric_knowledge=self.allow_parametric_knowledge,
            max_passage_chars=self.max_passage_chars,
        )
        return query, documents, [self._answer_prompt.render(**variables)]

    def _notes(self, documents: list[Document], first: FanOutResult | None) -> tuple[list[dict[str, Any]], str | None]:
        """The notes (one per passage, input order) and, in single-call mode, the answer text (None: no reply)."""
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

    def _synthesis(self, query: str, notes: list[dict[str, Any]]) -> tuple[list[list[ChatMessage]], dict[str, Any]]:
        """Per-document round 2 (steps 4-5 over the notes; none when nothing is relevant and knowledge is not
        allowed): its prompt and settings (it also stops at the answer line)."""
        if self.mode != "per_document" or (not _relevant(notes) and not self.allow_parametric_knowledge):
            return [], {}
        shown = [{"label": RELEVANCE_WORDS[n["relevance"]], "note": " ".join(n["note"].split())} for n in notes]
        step_5 = STEP_5_PARAMETRIC if self.allow_parametric_knowledge else STEP_5_UNKNOWN
        prompt = self._answer_prompt.render(query=query, notes=shown, step_5=step_5)
        kwargs = stop_kwargs(self._chat_generator, PROMPTS["con_synthesis"].stop, self.generation_kwargs)
        return [prompt], self._fan_out(kwargs)

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
        usage = sum_usage(calls.usage for calls in (first, second) if calls)
        usage["rounds"] = int(first is not None) + int(second is not None)
        meta = {
            "strategy": f"chain_of_note ({self.mode})",
            "source": "Yu et al., section 2.3, Appendix A.5",
            "notes": notes,
            "answer_source": source,
            "failures": failures_meta(first, second),
            "usage": usage,
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
        :param query: The question.
        :param documents: The k passages, best-ranked first (may be empty).
        :param streaming_callback: Overrides the one given at init for this run.
        :returns: A dictionary with:
            - `answers`: one GeneratedAnswer (or "unknown") with the relevant passages; `meta`: `notes`,
              `answer_source` ("passages", "parametric", "none" or "invalid"), `failures` and `usage`.
            - `notes`: k dicts in input order: `document_id`, `relevance` ("direct", "context" or "irrelevant";
              section 2.3.1) and `note`.
        :raises ValueError: If `query` is empty or only whitespace, or the streaming callback is async (`run_async`
            takes those).
        :raises LLMCallsFailedError: If every call of a round failed (`failures.LLMCallsFailedError`).
        """
        callback = select_streaming_callback(self.streaming_callback, streaming_callback, requires_async=False)
        query, documents, prompts = self._first_round(query, documents)
        settings = self._fan_out(self.generation_kwargs)
        streams = callback if self.mode == "single_call" else None  # the single call writes the answer
        first = (
            run_chat_calls(self._chat_generator, prompts, **settings, streaming_callback=streams) if prompts else None
        )
        check_answered(self, first)
        notes, answer_text = self._notes(documents, first)
        synthesis, settings = self._synthesis(query, notes)
        second = (
            run_chat_calls(self._chat_generator, synthesis, **settings, streaming_callback=callback)
            if synthesis
            else None
        )
        check_answered(self, first, second)
        return self._outputs(query, documents, notes, answer_text, first, second)

    @component.output_types(answers=list[GeneratedAnswer], notes=list[dict[str, Any]])
    async def run_async(
        self, query: str, documents: list[Document], streaming_callback: StreamingCallbackT | None = None
    ) -> dict[str, Any]:
        """Async form of `run`, with the same inputs, outputs and errors; calls the generator's `run_async`. The
        streaming callback may be sync or async (`Pipeline.stream()` injects an async one)."""
        callback = streaming_callback or self.streaming_callback
        query, documents, prompts = self._first_round(query, documents)
        settings = self._fan_out(self.generation_kwargs)
        streams = callback if self.mode == "single_call" else None
        first = (
            await run_chat_calls_async(self._chat_generator, prompts, **settings, streaming_callback=streams)
            if prompts
            else None
        )
        check_answered(self, first)
        notes, answer_text = self._notes(documents, first)
        synthesis, settings = self._synthesis(query, notes)
        second = (
            await run_chat_calls_async(self._chat_generator, synthesis, **settings, streaming_callback=callback)
            if synthesis
            else None
        )
        check_answered(self, first, second)
        return self._outputs(query, documents, notes, answer_text, first, second)


def _relevant(notes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [note for note in notes if note["relevance"] in (DIRECT, CONTEXT)]
