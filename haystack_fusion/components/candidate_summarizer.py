"""CandidateSummarizer: SuRe's answer candidates and candidate-conditioned summaries (Kim et al., section 3.2)."""

from __future__ import annotations

import re
from typing import Any, Literal

from haystack import Document, component, default_to_dict, logging
from haystack.components.generators.chat.types import ChatGenerator
from haystack.core.serialization import component_to_dict
from haystack.dataclasses import ChatMessage

from haystack_fusion.components.base import ChatGeneratorWrapper
from haystack_fusion.llm import (
    FanOutResult,
    check_max_concurrency,
    run_chat_calls,
    run_chat_calls_async,
    sum_usage,
)
from haystack_fusion.prompts import DEFAULT_MAX_PASSAGE_CHARS, PROMPTS, format_passages, render
from haystack_fusion.prompts.passages import strip_delimiters
from haystack_fusion.prompts.sure import DONE_MARKER, candidate_prompt_variables, few_shot_examples
from haystack_fusion.sure import parse_candidates
from haystack_fusion.validation import check_answer, validate_query

logger = logging.getLogger(__name__)

SummaryMode = Literal["conditional", "generic", "candidates"]
SUMMARY_MODES: tuple[str, ...] = ("conditional", "generic", "candidates")

_PREFIX = re.compile(r"^\s*(?:\([a-z]\)\s*)?(?:(?:passage|response|summary)\s*:\s*)?", re.IGNORECASE)
# A field line: the newline right before it, then spaces or tabs (not more newlines, so that each newline of a long
# blank run is tried once: linear). Where blank lines precede the field, the split falls at the last of them rather
# than the first, and `clean_summary` strips what lies between.
_NEXT_FIELD = re.compile(r"\n[^\S\n]*(?:passage|question|prediction|choices|answer)\b[^\n:]{0,12}:", re.IGNORECASE)


def clean_summary(reply: str | None) -> str:
    """
    A summary as SuRe uses it: the reply up to "[DONE]" (Listings 7 and 11) or a line starting another prompt field,
    without a choice label, "Passage:" / "Response:" prefix or passage delimiters, stripped. None gives "".
    """
    text = _PREFIX.sub("", strip_delimiters((reply or "").split(DONE_MARKER, 1)[0]))
    return _NEXT_FIELD.split(text, 1)[0].strip()


@component
class CandidateSummarizer(ChatGeneratorWrapper):
    """
    Proposes K answer candidates, then summarizes the passages once per candidate (SuRe, Kim et al., section 3.2).

    Round 1 is one call with Listing 6 (p_can, Eq. 2) asking for K candidates as "(a) xx, (b) yy", parsed leniently
    (`sure.parse_candidates`). Round 2 is one call per candidate with Listing 7 (p_sum, Eq. 3), up to
    `max_concurrency` at once; the summary is the reply up to "[DONE]". `generic` writes one summary without
    candidates (Listing 11, section 4.3); `candidates` stops after round 1 (MCQ baseline, Appendix A.7).

    Candidates that `validation.check_answer` rejects are dropped and listed in `meta["invalid_candidates"]`, so fewer
    than K may remain. Given `candidates` (e.g. the `cascade` strategy's split vote) skip round 1, and each summary
    then reads `candidate_documents[k]` when given (else all `documents`).

    ### Usage example
    ```python
    from haystack import Document
    from haystack.components.generators.chat import MockChatGenerator
    from haystack_fusion import CandidateSummarizer

    llm = MockChatGenerator(responses=["(a) Paris, (b) Lyon", "Paris is the capital. [DONE]", "Lyon is big. [DONE]"])
    summarizer = CandidateSummarizer(chat_generator=llm, max_concurrency=1)  # the mock replies in order
    result = summarizer.run(query="What is the capital of France?", documents=[Document(content="Paris ...")])
    print(result["candidates"], result["summaries"])  # ['Paris', 'Lyon'] ['Paris is the capital.', 'Lyon is big.']
    ```
    """

    def __init__(
        self,
        *,
        chat_generator: ChatGenerator,
        num_candidates: int = 2,
        mode: SummaryMode = "conditional",
        max_concurrency: int | None = None,
        max_passage_chars: int | None = DEFAULT_MAX_PASSAGE_CHARS,
        few_shot: bool = False,
        raise_on_failure: bool = False,
    ) -> None:
        """
        Create a CandidateSummarizer.

        :param chat_generator: The ChatGenerator that proposes the candidates and writes the summaries.
        :param num_candidates: K, the answer candidates asked for (>= 1; the paper uses K = 2, section 4.1).
        :param mode: "conditional" (SuRe), "generic" (one summary, Listing 11) or "candidates" (MCQ baseline).
        :param max_concurrency: Largest number of summary calls under way at once (>= 1); None (default): all K.
        :param max_passage_chars: Per-passage context budget in characters (None: no limit).
        :param few_shot: If True (base models), candidates come from Listing 13 (Appendix B.5) and summaries from
            Listing 7 with one demonstration (`prompts.sure.FEW_SHOT_SUMMARY`).
        :param raise_on_failure: If True, a failed call raises; by default it is logged, reported in
            `meta["failures"]`, and gives no candidates (round 1) or an empty summary (round 2).
        :raises ValueError: If `num_candidates` is below 1, `max_concurrency` is neither None nor an integer >= 1,
            `mode` is unknown, or `max_passage_chars` is not positive.
        """
        if num_candidates < 1:
            raise ValueError(f"`num_candidates` must be at least 1, got {num_candidates}")
        if mode not in SUMMARY_MODES:
            raise ValueError(f"`mode` must be one of {', '.join(SUMMARY_MODES)}, got {mode!r}")
        if max_passage_chars is not None and max_passage_chars <= 0:
            raise ValueError(f"`max_passage_chars` must be positive or None, got {max_passage_chars}")
        self._chat_generator = chat_generator
        self.num_candidates = num_candidates
        self.mode = mode
        self.max_concurrency = check_max_concurrency(max_concurrency)
        self.max_passage_chars = max_passage_chars
        self.few_shot = few_shot
        self.raise_on_failure = raise_on_failure

    def to_dict(self) -> dict[str, Any]:
        """Serialize this component, with its chat generator, to a dictionary."""
        return default_to_dict(
            self,
            chat_generator=component_to_dict(obj=self._chat_generator, name="chat_generator"),
            num_candidates=self.num_candidates,
            mode=self.mode,
            max_concurrency=self.max_concurrency,
            max_passage_chars=self.max_passage_chars,
            few_shot=self.few_shot,
            raise_on_failure=self.raise_on_failure,
        )

    # Each step below is shared by `run` and `run_async`; only the fan-out call differs.

    def _first_round(self, query: str, documents: list[Document] | None) -> tuple[str, str, list[list[ChatMessage]]]:
        """The round-1 prompt (Listing 6, or Listing 11 in generic mode), none without passages."""
        documents = list(documents or [])
        passages = format_passages(documents, self.max_passage_chars, layout="titled")
        if not documents:
            return query, passages, []
        if self.mode == "generic":
            return query, passages, [render(PROMPTS["sure_generic_summary"], passages=passages, query=query)]
        variables: dict[str, Any] = candidate_prompt_variables(self.num_candidates)
        if self.few_shot:
            variables["examples"] = few_shot_examples(self.num_candidates)
        template = PROMPTS["sure_few_shot_candidates" if self.few_shot else "sure_candidates"]
        prompt = render(template, passages=passages, query=query, num_passages=len(documents), **variables)
        return query, passages, [prompt]

    def _second_round(
        self, query: str, passages: str, candidates: list[str], candidate_documents: list[list[Document]] | None = None
    ) -> list[list[ChatMessage]]:
        """
        One Listing 7 prompt per candidate, in candidate order (conditional mode only); with `candidate_documents`,
        candidate k's prompt shows its own passages.
        """
        if self.mode != "conditional":
            return []
        if candidate_documents is not None and len(candidate_documents) != len(candidates):
            raise ValueError(
                f"CandidateSummarizer needs one passage list per candidate, got {len(candidates)} candidates and "
                f"{len(candidate_documents)} passage lists"
            )
        shown = [
            passages
            if candidate_documents is None
            else format_passages(candidate_documents[index], self.max_passage_chars, layout="titled")
            for index in range(len(candidates))
        ]
        template = PROMPTS["sure_few_shot_summary" if self.few_shot else "sure_summary"]
        return [
            render(template, passages=shown[index], query=query, candidates=candidates, target=index)
            for index in range(len(candidates))
        ]

    def _start(
        self, query: str, documents: list[Document] | None, candidates: list[str] | None
    ) -> tuple[str, str, list[str] | None, list[list[ChatMessage]]]:
        """
        Validate; the query, the passages shown, the given candidates (None: round 1 proposes them) and the round-1
        prompts (none when candidates are given).
        """
        query = validate_query(query)
        if candidates is None:
            query, passages, prompts = self._first_round(query, documents)
            return query, passages, None, prompts
        if self.mode != "conditional":
            raise ValueError(f"Given `candidates` need the conditional mode, not {self.mode!r}")
        passages = format_passages(list(documents or []), self.max_passage_chars, layout="titled")
        return query, passages, [candidate.strip() for candidate in candidates], []

    def _fan_out(self) -> dict[str, Any]:
        return {"max_concurrency": self.max_concurrency, "raise_on_failure": self.raise_on_failure}

    @staticmethod
    def _first_reply(first: FanOutResult | None) -> str | None:
        reply = first.replies[0] if first else None
        return reply.text if reply is not None else None

    def _candidates(
        self, first: FanOutResult | None, passages: str, query: str
    ) -> tuple[list[str], list[dict[str, str]]]:
        """
        The candidates of round 1 (none in generic mode, or when round 1 did not run or failed) and the ones the
        validator rejected (`candidate`, `reason`), dropped from the first list.
        """
        if self.mode == "generic":
            return [], []
        candidates = parse_candidates(self._first_reply(first), self.num_candidates)
        prompt = PROMPTS["sure_few_shot_candidates" if self.few_shot else "sure_candidates"]
        reasons = [
            check_answer(c, question=query, demonstrations=prompt.demonstrations, passages=[passages])
            for c in candidates
        ]
        kept = [candidate for candidate, reason in zip(candidates, reasons, strict=True) if reason is None]
        rejected = [
            {"candidate": candidate, "reason": reason}
            for candidate, reason in zip(candidates, reasons, strict=True)
            if reason is not None
        ]
        return kept, rejected

    def _outputs(
        self,
        first: FanOutResult | None,
        second: FanOutResult | None,
        candidates: list[str],
        rejected: list[dict[str, str]],
    ) -> dict[str, Any]:
        """Assemble candidates, summaries and meta from the rounds that ran (None: the round did not run)."""
        text = self._first_reply(first)
        summaries: list[str] = []
        if self.mode == "generic":
            summaries = [clean_summary(text)] if first else []
        if second:
            summaries = [clean_summary(r.text if r is not None else None) for r in second.replies]
        failures = [
            {"round": name, **failure}
            for name, calls in (("candidates", first), ("summaries", second))
            if calls
            for failure in calls.failures
        ]
        usage = sum_usage([first.usage if first else None, second.usage if second else None])
        usage["rounds"] = int(first is not None) + int(second is not None)
        meta = {
            "source": "Kim et al., section 3.2, Eq. 2-3",
            "mode": self.mode,
            "candidates_reply": text if self.mode != "generic" else None,
            "failures": failures,
            "usage": usage,
        }
        if rejected:
            meta["invalid_candidates"] = rejected
        return {"candidates": candidates, "summaries": summaries, "meta": meta}

    @component.output_types(candidates=list[str], summaries=list[str], meta=dict[str, Any])
    def run(
        self,
        query: str,
        documents: list[Document],
        candidates: list[str] | None = None,
        candidate_documents: list[list[Document]] | None = None,
    ) -> dict[str, Any]:
        """
        Propose candidates and summarize the passages for each.

        :param query: The question.
        :param documents: The N retrieved passages, best-ranked first. None or an empty list makes no LLM call and
            gives no candidates and no summaries (unless `candidates` are given).
        :param candidates: Candidates from elsewhere: round 1 is skipped and these are summarized (conditional
            mode only).
        :param candidate_documents: With `candidates`, one passage list per candidate: the passages its summary
            reads (default: all `documents`).
        :returns: A dictionary with:
            - `candidates`: at most K distinct answer candidates in the order the model gave them (fewer when the
              model gave fewer; empty in generic mode or when the round-1 call failed).
            - `summaries`: conditional mode: one summary per candidate, same order and length ("" for a failed
              call); generic mode: the one generic summary; candidates mode: empty.
            - `meta`: `source`, `mode`, `candidates_reply` (the raw round-1 reply), `failures` (`round`, `index`,
              `error`), `usage` (`llm.FanOutResult`'s) and `invalid_candidates` (`candidate`, `reason`) when the
              answer checks dropped some.
        :raises ValueError: If `query` is empty or only whitespace, `candidates` are given outside the conditional
            mode, or `candidate_documents` has another length than `candidates`.
        """
        query, passages, given, prompts = self._start(query, documents, candidates)
        first = run_chat_calls(self._chat_generator, prompts, **self._fan_out()) if prompts else None
        candidates, rejected = self._candidates(first, passages, query) if given is None else (given, [])
        summary_prompts = self._second_round(query, passages, candidates, candidate_documents)
        second = run_chat_calls(self._chat_generator, summary_prompts, **self._fan_out()) if summary_prompts else None
        return self._outputs(first, second, candidates, rejected)

    @component.output_types(candidates=list[str], summaries=list[str], meta=dict[str, Any])
    async def run_async(
        self,
        query: str,
        documents: list[Document],
        candidates: list[str] | None = None,
        candidate_documents: list[list[Document]] | None = None,
    ) -> dict[str, Any]:
        """Async form of `run`, with the same inputs, outputs and errors; calls the generator's `run_async`."""
        query, passages, given, prompts = self._start(query, documents, candidates)
        first = await run_chat_calls_async(self._chat_generator, prompts, **self._fan_out()) if prompts else None
        candidates, rejected = self._candidates(first, passages, query) if given is None else (given, [])
        summary_prompts = self._second_round(query, passages, candidates, candidate_documents)
        second = (
            await run_chat_calls_async(self._chat_generator, summary_prompts, **self._fan_out())
            if summary_prompts
            else None
        )
        return self._outputs(first, second, candidates, rejected)
