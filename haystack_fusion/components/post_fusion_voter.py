"""PostFusionVoter: one LLM call per passage, answers voted by majority (Liu et al., Eq. 2, sections 3.3, 4.4)."""

from __future__ import annotations

from typing import Any

from haystack import Document, component
from haystack.components.generators.chat.types import ChatGenerator
from haystack.dataclasses import GeneratedAnswer

from haystack_fusion.answers import (
    UnknownDetector,
    answer_confidence,
    check_answer,
    majority_vote,
    normalize_answer,
    validate_query,
)
from haystack_fusion.components.speculation import Speculation
from haystack_fusion.llm import (
    DEFAULT_SAMPLING_KWARGS,
    ChatGeneratorWrapper,
    FanOutResult,
    Round,
    Rounds,
    check_max_concurrency,
    failures_meta,
    round_usage,
)
from haystack_fusion.prompts import DEFAULT_MAX_PASSAGE_CHARS, PROMPTS, ChatPrompt, ChatTemplate, format_passages

_OUTPUT_TYPES: dict[str, Any] = {
    "answers": list[GeneratedAnswer],
    "candidates": list[str],
    "documents": list[Document],
    "unknown": list[GeneratedAnswer],
}


@component
class PostFusionVoter(ChatGeneratorWrapper):
    """
    Answers from each passage separately and returns the majority answer (Post-Fusion, Liu et al., Eq. 2).

    Each of the k passages goes to the LLM alone with the Figure 7 prompt; with `samples_per_passage` p > 1 each is
    sampled p times and all p x k answers vote (self-consistency, section 4.4). "unknown" answers, failed calls and
    rejected answers (`answers.check_answer`) do not vote; ties go to the better-ranked passage; when every call
    failed it raises. It also outputs the candidate pool and the passages that voted for PF+Concat's distiller round
    (section 3.3), or `unknown` instead.

    ### Usage example
    ```python
    from haystack import Document
    from haystack.components.generators.chat import MockChatGenerator
    from haystack_fusion import PostFusionVoter

    voter = PostFusionVoter(chat_generator=MockChatGenerator(responses=["Paris", "unknown", "paris"]))
    result = voter.run(query="What is the capital of France?", documents=[Document(content=t) for t in "abc"])
    print(result["answers"][0].data, result["answers"][0].meta["votes"])  # Paris {'paris': 2}
    ```
    """

    def __init__(
        self,
        *,
        chat_generator: ChatGenerator,
        max_concurrency: int | None = None,
        samples_per_passage: int = 1,
        sampling_generation_kwargs: dict[str, Any] | None = None,
        max_passage_chars: int | None = DEFAULT_MAX_PASSAGE_CHARS,
        unknown_patterns: list[str] | None = None,
        raise_on_failure: bool = False,
        datamark: bool = False,
        prompt: ChatTemplate | None = None,
        system_prompt: str | None = None,
    ) -> None:
        """
        :param max_concurrency: Most LLM calls under way at once (>= 1); None: all p x k at once.
        :param samples_per_passage: p, the answers sampled per passage (>= 1).
        :param sampling_generation_kwargs: The calls' `generation_kwargs` when p > 1; None: `{"temperature": 0.7}`
            (section 4.4).
        :param max_passage_chars: Per-passage context budget in characters (None: no limit).
        :param unknown_patterns: Regular expressions that mark an abstention; None uses the shared defaults.
        :param raise_on_failure: The first failed call raises; by default it counts as an abstention in `failures`.
        :param datamark: Datamark each passage's text (`prompts.format_passages`).
        :param prompt: The per-passage prompt, a `ChatPromptBuilder` template (Jinja string or ChatMessage list);
            None: Figure 7 (Appendix A). Its variables, both to be used: `passages` (str, the one passage as a
            numbered block) and `query` (str). The reply's first line is the answer ("unknown" does not vote);
            Figure 7's stop sequence (the newline) and demonstration answers stay in force.
        :param system_prompt: A system message sent before every prompt (for chat models); None: none.
        :raises ValueError: If `max_concurrency` is neither None nor an integer >= 1, `samples_per_passage` is below
            1, `max_passage_chars` is not positive, or `prompt` does not use `passages` and `query` or uses another
            variable.
        """
        if samples_per_passage < 1:
            raise ValueError(f"`samples_per_passage` must be at least 1, got {samples_per_passage}")
        if max_passage_chars is not None and max_passage_chars <= 0:
            raise ValueError(f"`max_passage_chars` must be positive or None, got {max_passage_chars}")
        self._chat_generator = chat_generator
        self.max_concurrency = check_max_concurrency(max_concurrency)
        self.samples_per_passage = samples_per_passage
        self.sampling_generation_kwargs = sampling_generation_kwargs
        self.max_passage_chars = max_passage_chars
        self.unknown_patterns = unknown_patterns
        self.raise_on_failure = raise_on_failure
        self.datamark = datamark
        self._detector = UnknownDetector.from_patterns(unknown_patterns)
        self.prompt = prompt
        self.system_prompt = system_prompt
        self._prompt = ChatPrompt(PROMPTS["figure7"], prompt, system_prompt=system_prompt, parameter="prompt")

    def _rounds(self, query: str, documents: list[Document] | None) -> Rounds:
        """One round: p Figure 7 prompts per passage in rank order; then the vote."""
        query = validate_query(query)
        documents = list(documents or [])
        prompts = []
        for document in documents:
            passages = format_passages([document], self.max_passage_chars, datamark=self.datamark)
            prompts += [self._prompt.render(passages=passages, query=query)] * self.samples_per_passage
        sampling = None
        if self.samples_per_passage > 1:
            sampling = self.sampling_generation_kwargs
            sampling = DEFAULT_SAMPLING_KWARGS if sampling is None else sampling
        indexes = [rank for rank in range(len(documents)) for _ in range(self.samples_per_passage)]
        calls = yield Round(prompts, sampling, stop=self._prompt.stop, indexes=indexes)
        return self._vote(query, documents, calls)

    def _vote(self, query: str, documents: list[Document], calls: FanOutResult | None) -> dict[str, Any]:
        p = self.samples_per_passage
        replies = calls.replies if calls else []
        answers = [None if reply is None else self._prompt.extract_answer(reply.text) for reply in replies]
        invalid = [
            None
            if answer is None
            else check_answer(
                answer,
                question=query,
                demonstrations=self._prompt.demonstrations,
                passages=[documents[index // p].content or ""],
            )
            for index, answer in enumerate(answers)
        ]
        voting = [None if reason else answer for answer, reason in zip(answers, invalid, strict=True)]
        vote = majority_vote(voting, [index // p for index in range(len(answers))], self._detector)
        passage_answers: list[dict[str, Any]] = []
        for rank, document in enumerate(documents):
            entry: dict[str, Any] = {
                "rank": rank,
                "document_id": document.id,
                "answers": answers[rank * p : rank * p + p],
            }
            if any(invalid[rank * p : rank * p + p]):
                entry["invalid"] = invalid[rank * p : rank * p + p]
            passage_answers.append(entry)

        def supporting(key: str) -> list[Document]:
            return [
                document
                for rank, document in enumerate(documents)
                if any(a is not None and normalize_answer(a) == key for a in voting[rank * p : rank * p + p])
            ]

        winner_key = next(iter(vote.votes), None)
        counts = list(vote.votes.values())
        confidences = [
            answer_confidence(reply.meta, answer)
            for reply, answer in zip(replies, voting, strict=True)
            if reply is not None and answer is not None and normalize_answer(answer) == winner_key
        ]
        known = [c for c in confidences if c is not None]
        meta: dict[str, Any] = {
            "strategy": "post_fusion",
            "source": "Liu et al., Eq. 2",
            "votes": vote.votes,
            "vote_share": counts[0] / sum(counts) if counts else 0.0,
            "tie": len(counts) > 1 and counts[0] == counts[1],
            "confidence": sum(known) / len(known) if known else None,
            "passage_answers": passage_answers,
            "failures": failures_meta(calls),
            "usage": round_usage(calls),
            "invalid_answers": sum(reason is not None for reason in invalid),
        }
        winner_documents = supporting(winner_key) if winner_key else []
        winner = GeneratedAnswer(data=vote.answer, query=query, documents=winner_documents, meta=meta)
        if vote.is_unknown:
            return {"answers": [winner], "unknown": [winner]}
        runners_up = [
            GeneratedAnswer(data=candidate, query=query, documents=supporting(key), meta={"votes": vote.votes[key]})
            for key, candidate in list(zip(vote.votes, vote.candidates, strict=True))[1:]
        ]
        answered = [
            document
            for rank, document in enumerate(documents)
            if any(not self._detector.is_unknown(answer) for answer in voting[rank * p : rank * p + p])
        ]
        return {"answers": [winner, *runners_up], "candidates": vote.candidates, "documents": answered}

    @component.output_types(**_OUTPUT_TYPES)
    def run(self, query: str, documents: list[Document], speculation: Speculation | None = None) -> dict[str, Any]:
        """
        :param query: The question.
        :param documents: The k passages, best-ranked first; none gives "unknown" with no LLM call.
        :param speculation: This round started ahead (`PostFusionSpeculator`): its calls are taken instead of made
            again (made when its prompts are not this round's).
        :returns: A dictionary with:
            - `answers`: the voted answer first, then the other candidates by votes. The first's `meta` holds `votes`,
              `vote_share` (0 when nothing voted), `tie`, `confidence` (None without log-probabilities),
              `passage_answers` (`rank`, `document_id`, p `answers`, `invalid` reasons), `failures`
              (`failures.CallFailure.to_dict`, `index` the passage's rank), `usage` and `invalid_answers`.
            - `candidates`: distinct non-unknown answers, most votes first.
            - `documents`: the passages at least one of whose answers voted, in rank order.
            - `unknown`: the "unknown" answer alone, instead of `candidates` and `documents` when no passage answered.
        :raises ValueError: If `query` is empty or only whitespace.
        :raises LLMCallsFailedError: If every call failed (`failures.LLMCallsFailedError`, with each call's failure).
        """
        return self._drive(self._rounds(query, documents), speculation.take if speculation else None)

    @component.output_types(**_OUTPUT_TYPES)
    async def run_async(
        self, query: str, documents: list[Document], speculation: Speculation | None = None
    ) -> dict[str, Any]:
        """Async form of `run`."""
        return await self._drive_async(self._rounds(query, documents), speculation.take if speculation else None)
