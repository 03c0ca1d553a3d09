"""The records of a report grouped once (`ReportView`): one `Run` per (run label, strategy, k, setting) of `Question`s,
each a record with what every section of the report derives from it. A cascade is read by its cost and the share that
fell back (FrugalGPT, Chen et al., 2023)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from haystack_fusion.answers import copies_demonstration
from haystack_fusion.evaluation.metrics import QuestionScore, with_answer_outcome
from haystack_fusion.evaluation.records import QuestionRecord
from haystack_fusion.prompts import PROMPTS
from haystack_fusion.strategies import STRATEGIES

Price = tuple[float, float]
"""US dollars per million (prompt, completion) tokens."""
UNNAMED_MODEL = "model"
"""The model name of records without `usage_by_model` when their run does not name its model."""
TOKENS_PER_PRICE = 1_000_000
RunKey = tuple[str, str, int, str]  # (run label, strategy, k, setting); the label is "" for records of one run


def parse_price(text: str) -> tuple[str, Price]:
    """Read `MODEL=IN,OUT` (US dollars per million input and output tokens), e.g. `gpt-4o-mini=0.15,0.60`, as (model,
    (input price, output price)). :raises ValueError: For another form, or a price negative or not a number."""
    model, _, figures = text.rpartition("=")
    try:
        prompt, completion = map(float, figures.split(","))
        if not model.strip():
            raise ValueError
    except ValueError:
        raise ValueError(f"price {text!r}: expected MODEL=IN,OUT in US dollars per million input and output tokens, "
                         "e.g. gpt-4o-mini=0.15,0.60") from None  # fmt: skip
    if not all(math.isfinite(value) and value >= 0 for value in (prompt, completion)):
        raise ValueError(f"price {text!r}: prices must be finite numbers >= 0")
    return model.strip(), (prompt, completion)


def parse_prices(texts: Iterable[str]) -> dict[str, Price]:
    """`parse_price` of each text, a later price of a model replacing an earlier one. :raises ValueError: As it."""
    return dict(parse_price(text) for text in texts)


def with_model(records: Iterable[QuestionRecord], model: str) -> list[QuestionRecord]:
    """The records, those without `usage_by_model` given one that counts all their usage against `model`."""
    return [record if record.evidence.get("usage_by_model") else dataclasses.replace(record, evidence={
        **record.evidence, "usage_by_model": {model: score_usage(record.score)}}) for record in records]  # fmt: skip


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
    """The cost in US dollars of one model's usage at `price`; None without a price (unless no tokens)."""
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    if price is None:
        return 0.0 if prompt + completion == 0 else None
    return (prompt * price[0] + completion * price[1]) / TOKENS_PER_PRICE


def total(costs: Iterable[float | None]) -> float | None:
    """The sum of costs in US dollars; None when one is unknown."""
    return None if None in (known := list(costs)) else sum(c for c in known if c is not None)


def demonstration_answers(strategy: str) -> dict[str, tuple[str, ...]]:
    """Prompt name -> few-shot demonstration answers, for the prompts of a strategy that have any (none if unknown)."""
    spec = STRATEGIES.get(strategy)
    return {name: PROMPTS[name].demonstrations for name in spec.prompts if PROMPTS[name].demonstrations} if spec else {}


@dataclass(frozen=True)
class Question:
    """One record (outcome flags set) with its usage (`model_usage`) and cost in US dollars (`usage_cost`) per model,
    whether the first round passed it on to the fallback rounds (`fell_back`: `evidence["fallback"]`, None for a
    strategy without rounds), and whether its answer copies a few-shot demonstration answer, per prompt that has any."""

    record: QuestionRecord
    usage: dict[str, Mapping[str, Any]]
    model_costs: dict[str, float | None]
    fell_back: bool | None
    demo_copies: dict[str, bool]

    @classmethod
    def of(cls, record: QuestionRecord, prices: Mapping[str, Price]) -> Question:
        score = with_answer_outcome(record.score, record.prediction, record.evidence)
        record = dataclasses.replace(record, score=score)
        usage, fallback = model_usage(record), record.evidence.get("fallback")
        copies = {name: copies_demonstration(record.prediction, answers, ())
                  for name, answers in demonstration_answers(record.strategy).items()}  # fmt: skip
        costs = {model: usage_cost(used, prices.get(model)) for model, used in usage.items()}
        return cls(record, usage, costs, None if fallback is None else bool(fallback), copies)

    @property
    def cost(self) -> float | None:
        """The question's cost in US dollars over every model it used; None when one that spent tokens has no price."""
        return total(self.model_costs.values())


@dataclass(frozen=True)
class Run:
    """The questions of one run, in record order."""

    label: str
    strategy: str
    top_k: int
    setting: str
    questions: list[Question]

    @property
    def records(self) -> list[QuestionRecord]:
        return [question.record for question in self.questions]

    @property
    def scores(self) -> list[QuestionScore]:
        return [question.record.score for question in self.questions]

    def head(self) -> dict[str, Any]:
        """The keys that name the run in a summary: `run` (when labelled), `strategy`, `top_k`, `setting`."""
        return {**({"run": self.label} if self.label else {}), "strategy": self.strategy, "top_k": self.top_k,
                "setting": self.setting}  # fmt: skip


@dataclass(frozen=True)
class ReportView:
    """Every record of a report once, as a `Question`: `questions` in record order, `runs` by `RunKey` and
    `by_strategy` by (strategy, k, setting) (the runs of every label together), and the `prices` of their costs."""

    questions: list[Question]
    runs: dict[RunKey, Run]
    by_strategy: dict[tuple[str, int, str], list[Question]]
    prices: dict[str, Price]

    @classmethod
    def of(cls, records: Sequence[QuestionRecord], labels: Sequence[str] | None = None,
           prices: Mapping[str, Price] | None = None) -> ReportView:  # fmt: skip
        """Group the records by run (`labels`: a run label per record; None: all ""). :raises ValueError: If `labels`
        does not have one label per record."""
        labels = [""] * len(records) if labels is None else list(labels)
        if len(labels) != len(records):
            raise ValueError(f"one run label per record: got {len(labels)} labels and {len(records)} records")
        prices = dict(prices or {})
        questions = [Question.of(record, prices) for record in records]
        runs: dict[RunKey, Run] = {}
        by_strategy: dict[tuple[str, int, str], list[Question]] = {}
        order = {label: index for index, label in enumerate(dict.fromkeys(labels))}  # runs label by label
        for question, label in sorted(zip(questions, labels, strict=True), key=lambda pair: order[pair[1]]):
            key = (question.record.strategy, question.record.top_k, question.record.setting)
            runs.setdefault((label, *key), Run(label, *key, [])).questions.append(question)
            by_strategy.setdefault(key, []).append(question)
        return cls(questions, runs, by_strategy, prices)

    @property
    def records(self) -> list[QuestionRecord]:
        """The records in their order, outcome flags set."""
        return [question.record for question in self.questions]

    @property
    def by_model(self) -> bool:
        """Whether some record keeps its usage per model (`evidence["usage_by_model"]`)."""
        return any(question.record.evidence.get("usage_by_model") for question in self.questions)
