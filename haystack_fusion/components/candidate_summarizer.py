"""CandidateSummarizer: SuRe's answer candidates and candidate-conditioned summaries (Kim et al., section 3.2)."""

from __future__ import annotations

import re
from typing import Any, Literal

from haystack import Document, component
from haystack.components.generators.chat.types import ChatGenerator
from haystack.dataclasses import ChatMessage

from haystack_fusion.answers import check_answer, validate_query
from haystack_fusion.llm import (
    ChatGeneratorWrapper,
    FanOutResult,
    Round,
    Rounds,
    check_max_concurrency,
    failures_meta,
    round_usage,
)
from haystack_fusion.prompts import (
    DEFAULT_MAX_PASSAGE_CHARS,
    PROMPTS,
    ChatPrompt,
    ChatTemplate,
    format_passages,
    strip_delimiters,
)
from haystack_fusion.prompts.sure import DONE_MARKER, candidate_prompt_variables, few_shot_examples
from haystack_fusion.sure import parse_candidates

SummaryMode = Literal["conditional", "generic", "candidates"]
SUMMARY_MODES: tuple[str, ...] = ("conditional", "generic", "candidates")

_PREFIX = re.compile(r"^\s*(?:\([a-z]\)\s*)?(?:(?:passage|response|summary)\s*:\s*)?", re.IGNORECASE)
# a field line: the newline right before it, then spaces or tabs only (each newline tried once: linear)
_NEXT_FIELD = re.compile(r"\n[^\S\n]*(?:passage|question|prediction|choices|answer)\b[^\n:]{0,12}:", re.IGNORECASE)


def clean_summary(reply: str | None) -> str:
    """A summary as SuRe uses it: the reply up to "[DONE]" (Listings 7 and 11) or another prompt field, without a
    choice label, "Passage:" prefix or passage delimiters, stripped."""
    text = _PREFIX.sub("", strip_delimiters((reply or "").split(DONE_MARKER, 1)[0]))
    return _NEXT_FIELD.split(text, 1)[0].strip()


@component
class CandidateSummarizer(ChatGeneratorWrapper):
    """
    Proposes K answer candidates, then summarizes the passages once per candidate (SuRe, Kim et al., section 3.2).

    Round 1: one call with Listing 6 (p_can, Eq. 2) for K candidates. Round 2: one call per candidate with Listing 7
    (p_sum, Eq. 3). `generic` writes one summary (Listing 11, section 4.3); `candidates` stops after round 1
    (Appendix A.7). Given `candidates` skip round 1.

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
        candidates_prompt: ChatTemplate | None = None,
        summary_prompt: ChatTemplate | None = None,
        system_prompt: str | None = None,
    ) -> None:
        """
        :param num_candidates: K, the answer candidates asked for (>= 1; the paper uses K = 2, section 4.1).
        :param mode: "conditional" (SuRe), "generic" (one summary, Listing 11) or "candidates" (MCQ baseline).
        :param max_concurrency: Most summary calls under way at once (>= 1); None: all K.
        :param max_passage_chars: Per-passage context budget in characters (None: no limit).
        :param few_shot: Listing 13 candidates (Appendix B.5) and a one-shot Listing 7, for base models.
        :param raise_on_failure: A failed call raises; by default it is reported in `meta["failures"]`.
        :param candidates_prompt: Round 1's `ChatPromptBuilder` template; None: Listing 6 (Appendix A.1), Listing 13
            with `few_shot` (Appendix B.5). Variables: `passages` and `query` (required), `num_passages`, `k_words`
            ("two"), `answer_form` ("(a) xx, (b) yy") and `examples`. The reply lists "(a) ... (b) ...".
        :param summary_prompt: Round 2's template; None: Listing 7 (Appendix A.2), in generic mode Listing 11
            (Appendix A.6). Variables, all required: `passages`, `query`, and in conditional mode `candidates` (all
            K) and `target` (the supported candidate's index). The reply is the summary (`clean_summary`).
        :param system_prompt: A system message sent before every prompt; None: none.
        :raises ValueError: If a value is out of range, a prompt is given for a round `mode` does not run, or a
            prompt's variables do not match.
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
        if mode == "generic" and candidates_prompt is not None:
            raise ValueError("`candidates_prompt` is not used in generic mode (one generic summary, no candidates)")
        if mode == "candidates" and summary_prompt is not None:
            raise ValueError("`summary_prompt` is not used in candidates mode (no summaries)")
        self.candidates_prompt = candidates_prompt
        self.summary_prompt = summary_prompt
        self.system_prompt = system_prompt
        self._candidate_prompt = ChatPrompt(
            PROMPTS["sure_few_shot_candidates" if few_shot else "sure_candidates"],
            candidates_prompt,
            system_prompt=system_prompt,
            parameter="candidates_prompt",
            variables=("answer_form", "examples", "k_words", "num_passages", "passages", "query"),
            required=("passages", "query"),
        )
        generic = mode == "generic"
        self._summary_prompt = ChatPrompt(
            PROMPTS["sure_generic_summary" if generic else "sure_few_shot_summary" if few_shot else "sure_summary"],
            summary_prompt,
            system_prompt=system_prompt,
            parameter="summary_prompt",
            variables=("passages", "query") if generic else ("candidates", "passages", "query", "target"),
        )

    def _rounds(
        self,
        query: str,
        documents: list[Document] | None,
        given: list[str] | None,
        candidate_documents: list[list[Document]] | None,
    ) -> Rounds:
        """Round 1: the candidates or the generic summary; round 2: a summary per candidate."""
        if given is not None and self.mode != "conditional":
            raise ValueError(f"Given `candidates` need the conditional mode, not {self.mode!r}")
        query = validate_query(query)
        documents = list(documents or [])
        passages = format_passages(documents, self.max_passage_chars, layout="titled")
        prompts = []
        if given is None and documents and self.mode == "generic":
            prompts = [self._summary_prompt.render(passages=passages, query=query)]
        elif given is None and documents:
            variables: dict[str, Any] = candidate_prompt_variables(self.num_candidates)
            variables["examples"] = few_shot_examples(self.num_candidates)
            variables.update(passages=passages, query=query, num_passages=len(documents))
            prompts = [self._candidate_prompt.render(**variables)]
        first = yield Round(prompts)
        reply = first.replies[0].text if first and first.replies[0] is not None else None
        found, rejected, prompts = self._round_two(query, passages, reply, given, candidate_documents)
        second = yield Round(prompts)
        return self._outputs(reply, first, second, found, rejected)

    def _round_two(
        self,
        query: str,
        passages: str,
        reply: str | None,
        given: list[str] | None,
        candidate_documents: list[list[Document]] | None,
    ) -> tuple[list[str], list[dict[str, str]], list[list[ChatMessage]]]:
        """The candidates, the rejected ones and one Listing 7 prompt per candidate (conditional mode only)."""
        rejected: list[dict[str, str]] = []
        if given is not None:
            candidates = [candidate.strip() for candidate in given]
        elif self.mode == "generic":
            candidates = []
        else:
            candidates = []
            for candidate in parse_candidates(reply, self.num_candidates):
                reason = check_answer(
                    candidate, question=query, demonstrations=self._candidate_prompt.demonstrations, passages=[passages]
                )
                if reason is None:
                    candidates.append(candidate)
                else:
                    rejected.append({"candidate": candidate, "reason": reason})
        if self.mode != "conditional":
            return candidates, rejected, []
        if candidate_documents is not None and len(candidate_documents) != len(candidates):
            raise ValueError(
                f"CandidateSummarizer needs one passage list per candidate, got {len(candidates)} candidates and "
                f"{len(candidate_documents)} passage lists"
            )
        prompts = [
            self._summary_prompt.render(
                passages=passages
                if candidate_documents is None
                else format_passages(candidate_documents[index], self.max_passage_chars, layout="titled"),
                query=query,
                candidates=candidates,
                target=index,
            )
            for index in range(len(candidates))
        ]
        return candidates, rejected, prompts

    def _outputs(
        self,
        reply: str | None,
        first: FanOutResult | None,
        second: FanOutResult | None,
        candidates: list[str],
        rejected: list[dict[str, str]],
    ) -> dict[str, Any]:
        summaries = [clean_summary(reply)] if self.mode == "generic" and first else []
        if second:
            summaries = [clean_summary(r.text if r is not None else None) for r in second.replies]
        meta = {
            "source": "Kim et al., section 3.2, Eq. 2-3",
            "mode": self.mode,
            "candidates_reply": reply if self.mode != "generic" else None,
            "failures": failures_meta(first, second),
            "usage": round_usage(first, second),
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
        :param documents: The N passages, best-ranked first; none makes no LLM call (unless `candidates` are given).
        :param candidates: Candidates from elsewhere: round 1 is skipped (conditional mode only).
        :param candidate_documents: With `candidates`, the passages each one's summary reads (default: `documents`).
        :returns: `candidates` (at most K, the model's order), `summaries` (one per candidate, "" for a failed call;
            or the generic one) and `meta` (`source`, `mode`, `candidates_reply`, `failures`, `usage`,
            `invalid_candidates` when some were rejected).
        :raises ValueError: If `query` is empty, `candidates` are given outside conditional mode, or
            `candidate_documents` has another length than `candidates`.
        :raises LLMCallsFailedError: If every call of a round failed.
        """
        return self._drive(self._rounds(query, documents, candidates, candidate_documents))

    @component.output_types(candidates=list[str], summaries=list[str], meta=dict[str, Any])
    async def run_async(
        self,
        query: str,
        documents: list[Document],
        candidates: list[str] | None = None,
        candidate_documents: list[list[Document]] | None = None,
    ) -> dict[str, Any]:
        """Async form of `run`."""
        return await self._drive_async(self._rounds(query, documents, candidates, candidate_documents))
