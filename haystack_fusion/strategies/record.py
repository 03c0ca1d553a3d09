"""The typed record of one question through one strategy (`StrategyRun`): answer, evidence per strategy family,
usage per model and failed calls; `to_dict` gives the JSON of `ask --json`, the served `/run` and evaluation records."""

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
    """What a run's LLM calls used; the counters from `rounds` on are None when no call reported them
    (`llm.reply_usage`; speculative post-fusion's: `components.speculation`)."""

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
        """A `Usage` from a counters dict (a component's `meta["usage"]`); unknown keys ignored."""
        names = {f.name for f in fields(cls)}
        counted: dict[str, Any] = {key: int(v) for key, v in (counters or {}).items() if key in names and v is not None}
        return cls(**counted)

    def __add__(self, other: Usage) -> Usage:
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
    """One stage of a fallback strategy that ran (Liu et al., section 3.3): `stage` ("concatenation", "post_fusion"
    or "sure"), whether it `answered`, else the `reason` it passed the question on, and a `confidence` in [0, 1]."""

    stage: str
    answered: bool
    reason: str | None = None
    confidence: float | None = None

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {"stage": self.stage}
        record.update({} if self.confidence is None else {"confidence": self.confidence})
        record["answered"] = self.answered
        return record if self.answered else {**record, "reason": self.reason}


@dataclass(frozen=True)
class SureScore:
    """One SuRe answer's scores (Kim et al., section 3.3); None where the verifier did not score it."""

    candidate_index: int | None
    validity: float | None
    ranking: float | None
    score: float | None

    @classmethod
    def of(cls, meta: Mapping[str, Any]) -> SureScore:
        return cls(meta.get("candidate_index"), meta.get("validity"), meta.get("ranking"), meta.get("score"))


@dataclass(frozen=True)
class InvalidAnswer:
    """An answer the answer checks rejected (`answers.invalid_meta`): why, and what was rejected."""

    reason: str | None
    rejected: str | None
    source: str = "invalid"


@dataclass(frozen=True)
class Vote:
    """Post-fusion's vote (Liu et al., section 3.2): normalized answer -> count, most first; the winner's share."""

    votes: dict[str, int] | None
    vote_share: float | None = None
    invalid_answers: list[Any] | None = None


@dataclass(frozen=True)
class SureEvidence:
    """SuRe's rounds (Kim et al., section 3): the summaries (None: no summarizer ran), how many are only their
    candidate's label, how many candidates were rejected, the verifier's scores best first (None: did not run)."""

    summaries: list[str] | None = None
    label_summaries: int = 0
    invalid_candidates: int = 0
    scores: list[SureScore] | None = None


@dataclass(frozen=True)
class Notes:
    """Chain-of-Note's reading notes (Yu et al., section 2.3), one per passage, and where the answer came from."""

    notes: list[dict[str, Any]]
    answer_source: str | None = None


@dataclass
class Evidence:
    """What a strategy saw: the fields of the strategy families that ran (the others None or empty); `candidates`
    are the post-fusion pool (%NM) or SuRe's (Kim et al., section 3.1), `confidence` in [0, 1]."""

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
        return self.vote.votes if self.vote is not None else None

    @property
    def fallback(self) -> bool | None:
        """Whether a fallback strategy's concatenation stage passed the question on; None for other strategies."""
        return None if not self.stages else not self.stages[0].answered

    def to_dict(self) -> dict[str, Any]:
        """The evidence as JSON values: `components_run`, `votes`, `candidates` and `confidence` always; the
        others when their strategy family ran or when set."""
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
        if (invalid := self.invalid) is not None:
            record.update(answer_source=invalid.source, invalid_reason=invalid.reason, rejected_answer=invalid.rejected)
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
    """One question through one strategy pipeline: `answer` is the first of `answers` ("unknown" for none),
    `documents` the retrieved passages in rank order, `usage_by_model` split by `llm.model_name`."""

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
        return self.evidence.failures

    def answer_text(self) -> str:
        """The answer, or what the answer checks rejected and why: `(no valid answer: passage markup: '<p...')`."""
        if self.evidence.invalid is not None:
            return f"(no valid answer: {self.evidence.invalid.reason}: {self.evidence.invalid.rejected!r})"
        return self.answer.data or ""

    def to_dict(self) -> dict[str, Any]:
        """The run as JSON values (`haystack-fusion ask --json`)."""
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
