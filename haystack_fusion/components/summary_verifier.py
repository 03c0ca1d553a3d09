"""SummaryVerifier: SuRe's instance-wise validity, pair-wise ranking and selection (Kim et al., section 3.3)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, Literal

from haystack import Document, component
from haystack.components.generators.chat.types import ChatGenerator
from haystack.dataclasses import ChatMessage, GeneratedAnswer

from haystack_fusion.answers import UNKNOWN, validate_query
from haystack_fusion.llm import (
    ChatGeneratorWrapper,
    FanOutResult,
    Round,
    Rounds,
    check_max_concurrency,
    failures_meta,
    logprob_kwargs,
    round_usage,
)
from haystack_fusion.prompts import PROMPTS, ChatPrompt, ChatTemplate
from haystack_fusion.prompts.sure import one_line
from haystack_fusion.sure import (
    PREFERENCE_CHOICES,
    SCORING_TOP_LOGPROBS,
    VALIDITY_CHOICES,
    choice_probability,
    pairwise_ranking,
    parse_preference,
    parse_validity,
    ranking_pairs,
    select,
)

Pair = tuple[int, int]
Scoring = Literal["text", "probability"]


@component
class SummaryVerifier(ChatGeneratorWrapper):
    """
    Picks the answer candidate whose candidate-conditioned summary is valid and ranks best (SuRe, Kim et al., 3.3).

    One round: K validity questions (Listing 8, Eq. 4) and K(K-1) pair-wise rankings (Listing 9, Eq. 5), each pair in
    both orders; answers ordered by v + r (Eq. 6), ties to the earlier candidate (section 4.1). A `document_ranker`
    reorders the winner's passages by its summary (Table 4). An empty summary is invalid and loses every pair; a
    failed call counts as False or 0.5.

    ### Usage example
    ```python
    from haystack.components.generators.chat import MockChatGenerator
    from haystack_fusion import SummaryVerifier

    # validity of s_1, s_2; then ranking (s_1, s_2) and (s_2, s_1)
    llm = MockChatGenerator(responses=["True", "False", "Passage 1", "Passage 2"])
    verifier = SummaryVerifier(chat_generator=llm, max_concurrency=1)  # the mock replies in order
    result = verifier.run(query="Capital of France?", candidates=["Paris", "Lyon"], summaries=["...", "..."])
    print(result["answers"][0].data, result["answers"][0].meta["score"])  # Paris 2.0
    ```
    """

    def __init__(
        self,
        *,
        chat_generator: ChatGenerator,
        use_validity: bool = True,
        max_concurrency: int | None = None,
        document_ranker: Any | None = None,
        raise_on_failure: bool = False,
        scoring: Scoring = "text",
        validity_prompt: ChatTemplate | None = None,
        ranking_prompt: ChatTemplate | None = None,
        system_prompt: str | None = None,
    ) -> None:
        """
        :param use_validity: If False, ranking alone orders the candidates (Table 3, "+ Pair-wise ranking").
        :param max_concurrency: Most calls under way at once (>= 1); None: all K + K(K-1).
        :param raise_on_failure: A failed call raises; by default it is reported in `meta["failures"]`.
        :param scoring: "text" (the paper's, v in {0, 1}) or "probability" (from token log-probabilities).
        :param validity_prompt: A `ChatPromptBuilder` template; None: Listing 8 (Appendix A.3). Variables, all
            required: `query`, `prediction` and `summary`. The reply says True or False.
        :param ranking_prompt: A template; None: Listing 9 (Appendix A.4). Variables, all required: `query`,
            `summary_1`, `summary_2`. The reply names "Passage 1" or "Passage 2".
        :param system_prompt: A system message sent before every prompt; None: none.
        :raises ValueError: If a value is out of range, `validity_prompt` is given with `use_validity=False`, or a
            prompt's variables do not match.
        """
        if scoring not in ("text", "probability"):
            raise ValueError(f"`scoring` must be 'text' or 'probability', got {scoring!r}")
        self.scoring = scoring
        self._chat_generator = chat_generator
        self.use_validity = use_validity
        self.max_concurrency = check_max_concurrency(max_concurrency)
        self._document_ranker: Any = document_ranker
        self.raise_on_failure = raise_on_failure
        if not use_validity and validity_prompt is not None:
            raise ValueError("`validity_prompt` is not used without validity (`use_validity=False`)")
        self.validity_prompt = validity_prompt
        self.ranking_prompt = ranking_prompt
        self.system_prompt = system_prompt
        self._validity_prompt = ChatPrompt(
            PROMPTS["sure_validity"], validity_prompt, system_prompt=system_prompt, parameter="validity_prompt"
        )
        self._ranking_prompt = ChatPrompt(
            PROMPTS["sure_ranking"], ranking_prompt, system_prompt=system_prompt, parameter="ranking_prompt"
        )

    _COMPONENTS = ("chat_generator", "document_ranker")  # warmed up, closed and serialized with this component

    def _plan(
        self, query: str, candidates: list[str] | None, summaries: list[str] | None
    ) -> tuple[str, list[str], list[str], list[tuple[str, Any]], list[list[ChatMessage]]]:
        """Validate; the validity calls (non-empty summaries) then the ranking calls, each with what it asks."""
        query = validate_query(query)
        candidates, summaries = list(candidates or []), list(summaries or [])
        if len(candidates) != len(summaries):
            raise ValueError(
                f"SummaryVerifier needs one summary per candidate, got {len(candidates)} candidates and "
                f"{len(summaries)} summaries"
            )
        shown = [one_line(summary) for summary in summaries]
        asks: list[tuple[str, Any]] = []
        prompts: list[list[ChatMessage]] = []
        for index, (candidate, summary) in enumerate(zip(candidates, shown, strict=True)):
            if self.use_validity and summary:
                asks.append(("validity", index))
                prompts.append(self._validity_prompt.render(query=query, prediction=candidate, summary=summary))
        for first, second in ranking_pairs(len(candidates)):
            if shown[first] and shown[second]:
                asks.append(("ranking", (first, second)))
                prompts.append(
                    self._ranking_prompt.render(query=query, summary_1=shown[first], summary_2=shown[second])
                )
        return query, candidates, summaries, asks, prompts

    def _score(
        self,
        query: str,
        candidates: list[str],
        summaries: list[str],
        asks: list[tuple[str, Any]],
        calls: FanOutResult | None,
    ) -> list[GeneratedAnswer]:
        """Eq. 4-6 from the replies: the answers best first, without documents."""
        k = len(candidates)
        if k == 0:
            nothing = {"strategy": "sure", "source": "Kim et al., Eq. 6", "usage": round_usage()}
            return [GeneratedAnswer(data=UNKNOWN, query=query, documents=[], meta=nothing)]
        replies = calls.replies if calls else []
        validity = [0.0] * k
        preferences: dict[Pair, int | float | None] = {}
        for first, second in ranking_pairs(k):  # a call skipped for an empty summary: the non-empty one wins
            if not (summaries[first].strip() and summaries[second].strip()):
                preferences[(first, second)] = (
                    1 if summaries[first].strip() else 2 if summaries[second].strip() else None
                )
        scored_by = {"probability": 0, "text": 0}
        for (kind, what), reply in zip(asks, replies, strict=True):
            text = reply.text if reply is not None else None
            probability = None
            if self.scoring == "probability" and reply is not None:
                probability = choice_probability(
                    reply.meta, VALIDITY_CHOICES if kind == "validity" else PREFERENCE_CHOICES
                )
            scored_by["text" if probability is None else "probability"] += 1
            if kind == "validity":
                validity[what] = float(parse_validity(text)) if probability is None else probability
            else:
                preferences[what] = parse_preference(text) if probability is None else probability
        ranking = pairwise_ranking(preferences, k)
        counted = [v if self.use_validity else 0.0 for v in validity]
        scores = [v + r for v, r in zip(counted, ranking, strict=True)]
        order = select(counted, ranking)
        usage = round_usage(calls)
        answers: list[GeneratedAnswer] = []
        for position, index in enumerate(order):
            meta: dict[str, Any] = {
                "candidate_index": index,
                "validity": validity[index] if self.use_validity else None,
                "ranking": ranking[index],
                "score": scores[index],
                "rationale": summaries[index],
            }
            if position == 0:
                meta.update(
                    strategy="sure",
                    source="Kim et al., section 3.3, Eq. 4-6",
                    preferences={f"{a},{b}": value for (a, b), value in sorted(preferences.items())},
                    scoring=self.scoring,
                    scored_by=scored_by,
                    failures=failures_meta(calls),
                    usage=usage,
                )
            answers.append(GeneratedAnswer(data=candidates[index], query=query, documents=[], meta=meta))
        return answers

    def _rounds(self, query: str, candidates: list[str] | None, summaries: list[str] | None) -> Rounds:
        """One round of the validity and ranking calls; then the answers, scored."""
        query, candidates, summaries, asks, prompts = self._plan(query, candidates, summaries)
        kwargs = logprob_kwargs(self._chat_generator, SCORING_TOP_LOGPROBS) if self.scoring == "probability" else None
        calls = yield Round(prompts, kwargs)
        return self._score(query, candidates, summaries, asks, calls)

    def _ranker_inputs(self, answers: list[GeneratedAnswer], documents: list[Document]) -> dict[str, Any] | None:
        """The document ranker's inputs (the winning summary as query), or None."""
        rationale = answers[0].meta.get("rationale") if answers else None
        if self._document_ranker is None or not documents or not rationale:
            return None
        return {"query": rationale, "documents": documents}

    @staticmethod
    def _attach(
        answers: list[GeneratedAnswer], documents: list[Document], ranked: list[Document] | None
    ) -> dict[str, Any]:
        return {
            "answers": [
                replace(answer, documents=list(ranked if position == 0 and ranked is not None else documents))
                for position, answer in enumerate(answers)
            ]
        }

    @component.output_types(answers=list[GeneratedAnswer])
    def run(
        self, query: str, candidates: list[str], summaries: list[str], documents: list[Document] | None = None
    ) -> dict[str, Any]:
        """
        :param summaries: K summaries, `summaries[k]` supporting `candidates[k]` ("" for a failed summary).
        :param documents: The passages attached to every answer (the winner's reordered by `document_ranker`).
        :returns: `answers`: K GeneratedAnswers, best first (Eq. 6), `meta`: `candidate_index`, `validity`, `ranking`,
            `score`, `rationale`; the first also `preferences`, `scoring`, `scored_by`, `failures`, `usage`. No
            candidates: "unknown".
        :raises ValueError: If `query` is empty, or `candidates` and `summaries` differ in length.
        :raises LLMCallsFailedError: If every call failed.
        """
        answers = self._drive(self._rounds(query, candidates, summaries))
        documents = list(documents or [])
        inputs = self._ranker_inputs(answers, documents)
        ranked = self._document_ranker.run(**inputs)["documents"] if inputs else None
        return self._attach(answers, documents, ranked)

    @component.output_types(answers=list[GeneratedAnswer])
    async def run_async(
        self, query: str, candidates: list[str], summaries: list[str], documents: list[Document] | None = None
    ) -> dict[str, Any]:
        """Async form of `run`."""
        answers = await self._drive_async(self._rounds(query, candidates, summaries))
        documents = list(documents or [])
        inputs, ranker = self._ranker_inputs(answers, documents), self._document_ranker
        if inputs and hasattr(ranker, "run_async"):
            ranked = (await ranker.run_async(**inputs))["documents"]
        else:  # a ranker without `run_async` runs in a worker thread
            ranked = (await asyncio.to_thread(ranker.run, **inputs))["documents"] if inputs else None
        return self._attach(answers, documents, ranked)
