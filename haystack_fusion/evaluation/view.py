"""
The records of a report grouped once: one `Run` per (run label, strategy, k, setting), each question with its outcome
flags, usage per model, cost and escalation, read by every section of the report.

A price is US dollars per million prompt (input) and completion (output) tokens. A question's usage per model is
`evidence["usage_by_model"]` (model name -> `prompt_tokens`, `completion_tokens`, `calls`, ...), else its whole usage
under `UNNAMED_MODEL`. A question is escalated when the first round (concatenation) passed it on to the later rounds
(`evidence["fallback"]`, set by `concat_pf` and `cascade`); FrugalGPT (Chen et al., 2023) reads a cascade by its cost
and the share that reached the strong model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from haystack_fusion.evaluation.metrics import QuestionScore, with_answer_outcome
from haystack_fusion.evaluation.records import QuestionRecord

Price = tuple[float, float]
"""US dollars per million (prompt, completion) tokens."""

UNNAMED_MODEL = "model"
"""The model name of records without `usage_by_model` when their run does not name its model."""

TOKENS_PER_PRICE = 1_000_000

RunKey = tuple[str, str, int, str]
"""(run label, strategy, k, setting); the label is "" for records of one run."""


def parse_price(text: str) -> tuple[str, Price]:
    """
    Read `MODEL=IN,OUT` (US dollars per million input and output tokens), e.g. `gpt-4o-mini=0.15,0.60`.

    :returns: (model, (input price, output price)).
    :raises ValueError: If the text is not of that form or a price is negative or not a number.
    """
    model, _, figures = text.rpartition("=")
    parts = figures.split(",")
    try:
        if not model.strip() or len(parts) != 2:
            raise ValueError
        prompt, completion = float(parts[0]), float(parts[1])
    except ValueError:
        raise ValueError(
            f"price {text!r}: expected MODEL=IN,OUT in US dollars per million input and output tokens, "
            "e.g. gpt-4o-mini=0.15,0.60"
        ) from None
    if not all(math.isfinite(value) and value >= 0 for value in (prompt, completion)):
        raise ValueError(f"price {text!r}: prices must be finite numbers >= 0")
    return model.strip(), (prompt, completion)


def parse_prices(texts: Iterable[str]) -> dict[str, Price]:
    """`parse_price` of each text, a later price of a model replacing an earlier one. :raises ValueError: As it."""
    return dict(parse_price(text) for text in texts)


def with_model(records: Iterable[QuestionRecord], model: str) -> list[QuestionRecord]:
    """The records (same order), those without `usage_by_model` given one that counts all their usage against
    `model`."""
    return [
        record
        if record.evidence.get("usage_by_model")
        else dataclasses.replace(
            record, evidence={**record.evidence, "usage_by_model": {model: score_usage(record.score)}}
        )
        for record in records
    ]


def score_usage(score: QuestionScore) -> dict[str, int]:
    """A score's whole usage: `prompt_tokens`, `completion_tokens`, `calls`."""
    return {"prompt_tokens": score.prompt_tokens, "completion_tokens": score.completion_tokens, "calls": score.calls}


def model_usage(record: QuestionRecord) -> dict[str, Mapping[str, Any]]:
    """A question's usage per model: `evidence["usage_by_model"]`, else its whole usage under `UNNAMED_MODEL`."""
    by_model = record.evidence.get("usage_by_model")
    if isinstance(by_model, Mapping) and by_model:
        return {str(name): usage for name, usage in by_model.items()}
    return {UNNAMED_MODEL: score_usage(record.score)}


def usage_cost(usage: Mapping[str, Any], price: Price | None) -> float | None:
    """The cost in US dollars of one model's usage at `price`; None without a price (0.0 for no tokens)."""
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    if price is None:
        return 0.0 if prompt + completion == 0 else None
    return (prompt * price[0] + completion * price[1]) / TOKENS_PER_PRICE


def question_cost(record: QuestionRecord, prices: Mapping[str, Price]) -> float | None:
    """A question's cost in US dollars over every model it used; None when a model that spent tokens has no price."""
    costs = [usage_cost(usage, prices.get(model)) for model, usage in model_usage(record).items()]
    return None if None in costs else sum(c for c in costs if c is not None)


def escalated(record: QuestionRecord) -> bool | None:
    """Whether the first round passed the question on to the later rounds; None for a strategy without rounds."""
    fallback = record.evidence.get("fallback")
    return None if fallback is None else bool(fallback)


@dataclass(frozen=True)
class Run:
    """One run's questions: the records (outcome flags set) and, per question in the same order, its usage per model,
    cost in US dollars (None without a price) and escalation (None for a strategy without rounds)."""

    label: str
    strategy: str
    top_k: int
    setting: str
    records: list[QuestionRecord]
    usage: list[dict[str, Mapping[str, Any]]]
    costs: list[float | None]
    escalated: list[bool | None]

    @property
    def key(self) -> RunKey:
        return (self.label, self.strategy, self.top_k, self.setting)

    @property
    def scores(self) -> list[QuestionScore]:
        return [record.score for record in self.records]

    def head(self) -> dict[str, Any]:
        """The keys that name the run in a summary: `run` (when labelled), `strategy`, `top_k`, `setting`."""
        return {**({"run": self.label} if self.label else {}), "strategy": self.strategy, "top_k": self.top_k,
                "setting": self.setting}  # fmt: skip


@dataclass(frozen=True)
class ReportView:
    """Every record of a report once: `records` in their order with outcome flags set, `runs` in the order the records
    first name them (within each run label), and the `prices` their costs are at."""

    records: list[QuestionRecord]
    runs: dict[RunKey, Run]
    prices: dict[str, Price]

    @classmethod
    def of(
        cls,
        records: Sequence[QuestionRecord],
        labels: Sequence[str] | None = None,
        prices: Mapping[str, Price] | None = None,
    ) -> ReportView:
        """
        Group the records by run (`labels`: a run label per record, same order; None: all "") and derive each
        question's facts (`metrics.with_answer_outcome`, `model_usage`, `question_cost`, `escalated`).

        :raises ValueError: If `labels` does not have one label per record.
        """
        labels = [""] * len(records) if labels is None else list(labels)
        if len(labels) != len(records):
            raise ValueError(f"one run label per record: got {len(labels)} labels and {len(records)} records")
        prices = dict(prices or {})
        flagged = [
            dataclasses.replace(r, score=with_answer_outcome(r.score, r.prediction, r.evidence)) for r in records
        ]
        grouped: dict[RunKey, list[QuestionRecord]] = {}
        for label in dict.fromkeys(labels):
            for record, mine in zip(flagged, labels, strict=True):
                if mine == label:
                    grouped.setdefault((label, record.strategy, record.top_k, record.setting), []).append(record)
        runs = {
            key: Run(*key, group, [model_usage(r) for r in group], [question_cost(r, prices) for r in group],
                     [escalated(r) for r in group])
            for key, group in grouped.items()
        }  # fmt: skip
        return cls(flagged, runs, prices)

    @property
    def by_model(self) -> bool:
        """Whether some record keeps its usage per model (`evidence["usage_by_model"]`)."""
        return any(record.evidence.get("usage_by_model") for record in self.records)

    def unlabelled(self) -> dict[tuple[str, int, str], list[QuestionRecord]]:
        """The records per (strategy, k, setting), the runs of every label together, in record order."""
        merged: dict[tuple[str, int, str], list[QuestionRecord]] = {}
        for run in self.runs.values():
            merged.setdefault((run.strategy, run.top_k, run.setting), []).extend(run.records)
        return merged
