"""
The typed record of one question through one strategy (`StrategyRun`): the answer, the evidence per strategy family
(post-fusion's vote, SuRe's candidates and scores, Chain-of-Note's notes, a fallback strategy's stages), usage per
model and the failed calls. The command line, serving, evaluation and the agent tool read its attributes;
`to_dict` gives the JSON values (`haystack-fusion ask --json`, the served `/run`, evaluation records).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from haystack import Document
from haystack.dataclasses import GeneratedAnswer

from haystack_fusion.failures import CallFailure
from haystack_fusion.llm import sum_usage


@dataclass
class Usage:
    """
    What a run's LLM calls used: tokens, calls made and failed, and the counters a backend reports only sometimes
    (None when no call reported them): `rounds` of dependent calls, prefix-cache `cached_tokens`, `cached_calls`
    answered from the embedded model's reply cache, `truncated` replies the token cap cut; speculative post-fusion's
    `speculative_calls` sent, `cancelled_calls` and their `estimated_prompt_tokens` (`components.speculation`).
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    failed_calls: int = 0
    rounds: int | None = None
    cached_tokens: int | None = None
    cached_calls: int | None = None
    truncated: int | None = None
    speculative_calls: int | None = None
    cancelled_calls: int | None = None
    estimated_prompt_tokens: int | None = None

    @classmethod
    def of(cls, counters: Mapping[str, Any] | None) -> Usage:
        """A `Usage` from a counters dict (`llm.sum_usage`, a component's `meta["usage"]`); unknown keys ignored."""
        names = {f.name for f in fields(cls)}
        counted: dict[str, Any] = {key: int(v) for key, v in (counters or {}).items() if key in names and v is not None}
        return cls(**counted)

    def __add__(self, other: Usage) -> Usage:
        """The two usages counter by counter (`llm.sum_usage`)."""
        return sum_usages([self, other])

    @property
    def from_cache(self) -> bool:
        """Whether every call was answered from the embedded model's reply cache."""
        return bool(self.calls) and (self.cached_calls or 0) >= self.calls

    def to_dict(self) -> dict[str, int]:
        """The counters as JSON values; the optional ones only when reported."""
        return {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not None}


@dataclass(frozen=True)
class StageResult:
    """
    One stage of a fallback strategy (concat_pf, cascade) that ran (Liu et al., section 3.3).

    :param stage: "concatenation", "post_fusion" or "sure".
    :param answered: Whether its answer is the run's; False: it passed the question on.
    :param reason: Why it passed the question on (e.g. "unknown answer", "tie at the top"); None when it answered.
    :param confidence: The concatenation stage's answer confidence in [0, 1], when there is one.
    """

    stage: str
    answered: bool
    reason: str | None = None
    confidence: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """`stage`, `confidence` (when known), `answered`, and `reason` for a stage that passed the question on."""
        record: dict[str, Any] = {"stage": self.stage}
        record.update({} if self.confidence is None else {"confidence": self.confidence})
        record["answered"] = self.answered
        return record if self.answered else {**record, "reason": self.reason}


@dataclass(frozen=True)
class SureScore:
    """One SuRe answer's scores (Kim et al., section 3.2): its candidate's index, validity, pair-wise ranking and
    their combined score (eq. 5); None where the verifier did not score it."""

    candidate_index: int | None
    validity: float | None
    ranking: float | None
    score: float | None

    @classmethod
    def of(cls, meta: Mapping[str, Any]) -> SureScore:
        """The scores in a SuRe answer's `meta`."""
        return cls(meta.get("candidate_index"), meta.get("validity"), meta.get("ranking"), meta.get("score"))


@dataclass(frozen=True)
class InvalidAnswer:
    """An answer the answer checks rejected (`answers.invalid_meta`): why, and what was rejected."""

    reason: str | None
    rejected: str | None
    source: str = "invalid"


@dataclass(frozen=True)
class Vote:
    """
    Post-fusion's vote (Liu et al., section 3.2).

    :param votes: Normalized answer -> count, most votes first; None when the voter's answer did not carry them.
    :param vote_share: The winner's share of the votes, in [0, 1].
    :param invalid_answers: The replies the answer checks rejected.
    """

    votes: dict[str, int] | None
    vote_share: float | None = None
    invalid_answers: list[Any] | None = None


@dataclass(frozen=True)
class SureEvidence:
    """
    SuRe's rounds (Kim et al., section 3): what the summarizer wrote and how the verifier scored it.

    :param summaries: The candidate-conditioned summaries, one per candidate; None when no summarizer ran.
    :param label_summaries: How many summaries are only their candidate's label (`sure.summary_is_label`).
    :param invalid_candidates: How many candidates the answer checks rejected (0: none).
    :param scores: The verifier's scores, one per answer, best first; None when no verifier ran.
    """

    summaries: list[str] | None = None
    label_summaries: int = 0
    invalid_candidates: int = 0
    scores: list[SureScore] | None = None


@dataclass(frozen=True)
class Notes:
    """Chain-of-Note's reading notes (Yu et al., section 3): one per passage (`note`, `relevance`), and where the
    answer came from ("passages", "knowledge", "unknown", "invalid")."""

    notes: list[dict[str, Any]]
    answer_source: str | None = None


@dataclass
class Evidence:
    """
    What a strategy saw: the fields of the strategy families that ran (the others None or empty).

    :param components_run: The pipeline components that produced output, sorted.
    :param candidates: The post-fusion pool (%NM), or SuRe's candidates (Kim et al., section 3.1).
    :param vote: Post-fusion's vote.
    :param sure: SuRe's summaries and scores.
    :param notes: Chain-of-Note's reading notes.
    :param stages: A fallback strategy's stages that ran, in order (Liu et al., section 3.3); empty for others.
    :param confidence: The answer's confidence in [0, 1], None when unavailable.
    :param finish_reason: A one-reply answer's finish reason ("length": the token cap cut it).
    :param invalid: The rejected answer, when the answer checks rejected the answer.
    :param failures: The failed LLM calls, in call order.
    :param asked: A served follow-up's question as asked (before its rewrite into `standalone_question`).
    :param standalone_question: A served follow-up's standalone question, as run.
    """

    components_run: list[str] = field(default_factory=list)
    candidates: list[str] | None = None
    vote: Vote | None = None
    sure: SureEvidence | None = None
    notes: Notes | None = None
    stages: list[StageResult] = field(default_factory=list)
    confidence: float | None = None
    finish_reason: str | None = None
    invalid: InvalidAnswer | None = None
    failures: list[CallFailure] = field(default_factory=list)
    asked: str | None = None
    standalone_question: str | None = None

    @property
    def votes(self) -> dict[str, int] | None:
        """Post-fusion's votes, None when no vote ran."""
        return self.vote.votes if self.vote is not None else None

    @property
    def fallback(self) -> bool | None:
        """Whether a fallback strategy's concatenation stage passed the question on; None for other strategies."""
        return None if not self.stages else not self.stages[0].answered

    def to_dict(self) -> dict[str, Any]:
        """
        The evidence as JSON values: `components_run`, `votes`, `candidates` always; `summaries`,
        `label_summaries`, `invalid_candidates`, `vote_share`, `notes`, `answer_source`, `scores`, `fallback` and
        `stages` when their strategy family ran; `confidence` always; `finish_reason`, `invalid_reason` /
        `rejected_answer`, `invalid_answers`, `failures` (`CallFailure.to_dict`), `asked` and `standalone_question`
        when set.
        """
        record: dict[str, Any] = {"components_run": self.components_run, "votes": self.votes}
        record["candidates"] = self.candidates
        if self.sure is not None and self.sure.summaries is not None:
            record.update(summaries=self.sure.summaries, label_summaries=self.sure.label_summaries)
            record.update({"invalid_candidates": self.sure.invalid_candidates} if self.sure.invalid_candidates else {})
        if self.vote is not None:
            record["vote_share"] = self.vote.vote_share
        if self.notes is not None:
            record.update(notes=self.notes.notes, answer_source=self.notes.answer_source)
        if self.sure is not None and self.sure.scores is not None:
            record["scores"] = [vars(score).copy() for score in self.sure.scores]
        if self.stages:
            record.update(fallback=self.fallback, stages=[stage.to_dict() for stage in self.stages])
        record["confidence"] = self.confidence
        record.update({} if self.finish_reason is None else {"finish_reason": self.finish_reason})
        if self.invalid is not None:
            record.update(
                answer_source=self.invalid.source,
                invalid_reason=self.invalid.reason,
                rejected_answer=self.invalid.rejected,
            )
        if self.vote is not None and self.vote.invalid_answers:
            record["invalid_answers"] = self.vote.invalid_answers
        if self.failures:
            record["failures"] = [failure.to_dict() for failure in self.failures]
        if self.asked is not None:
            record.update(asked=self.asked, standalone_question=self.standalone_question)
        return record


def sum_usages(usages: Iterable[Usage]) -> Usage:
    """The usages added up counter by counter (`llm.sum_usage`); `Usage()` for none."""
    return Usage.of(sum_usage(usage.to_dict() for usage in usages))


@dataclass
class StrategyRun:
    """
    The outcome of one question through one strategy pipeline (`run_strategy`, `strategy_run`).

    :param answer: The strategy's answer (the first of `answers`; "unknown" when there is none).
    :param answers: The answer list of the strategy's answer component.
    :param documents: The retrieved passages, in rank order.
    :param evidence: What the strategy saw (`Evidence`).
    :param usage: Usage of every LLM call of the run.
    :param seconds: Wall-clock time of the run, in seconds.
    :param strategy: The registered strategy that ran ("" when not known).
    :param usage_by_model: `usage` split by the model that served the calls (`llm.model_name`), one entry per model
        (e.g. the small model's first round and the strong model's fallback rounds).
    """

    answer: GeneratedAnswer
    answers: list[GeneratedAnswer]
    documents: list[Document]
    evidence: Evidence
    usage: Usage
    seconds: float
    strategy: str
    usage_by_model: dict[str, Usage] = field(default_factory=dict)

    @property
    def failures(self) -> list[CallFailure]:
        """The run's failed LLM calls (`evidence.failures`)."""
        return self.evidence.failures

    def answer_text(self) -> str:
        """The answer, or what the answer checks rejected and why: `(no valid answer: passage markup: '<p...')`."""
        if self.evidence.invalid is not None:
            return f"(no valid answer: {self.evidence.invalid.reason}: {self.evidence.invalid.rejected!r})"
        return self.answer.data or ""

    def to_dict(self) -> dict[str, Any]:
        """
        The run as JSON values (`haystack-fusion ask --json`).

        :returns: `question`, `answer` (text), `strategy`, `evidence` (`Evidence.to_dict`), `sources` (the retrieved
            passages: `id`, `score`, `meta`, `content`), `usage`, `usage_by_model` and `seconds`.
        """
        return {
            "question": self.answer.query,
            "answer": self.answer.data,
            "strategy": self.strategy,
            "evidence": self.evidence.to_dict(),
            "sources": [{"id": d.id, "score": d.score, "meta": d.meta, "content": d.content} for d in self.documents],
            "usage": self.usage.to_dict(),
            "usage_by_model": {model: usage.to_dict() for model, usage in self.usage_by_model.items()},
            "seconds": self.seconds,
        }
