"""
The evaluation runner: strategies x top-k x questions, concurrent, resumable, one JSONL line per answered question.

Paper 000 section 4 is the protocol: top-k BM25 passages (optionally with the gold passage inserted), greedy
decoding, EM / F1 / %Unk / %NM; paper 004 section 3.1 adds the noise ratio and the reject rate.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from haystack import Document, Pipeline
from haystack.components.generators.chat.types import ChatGenerator
from tqdm import tqdm

from haystack_fusion.evaluation.datasets import EvalDataset, EvalQuestion
from haystack_fusion.evaluation.metrics import (
    QuestionScore,
    accuracy,
    exact_match,
    f1,
    gold_in_pool,
    is_unknown,
    retrieval_hit,
)
from haystack_fusion.evaluation.passages import EvalRetriever, PassageSetting
from haystack_fusion.strategies import build_pipeline, get_strategy, run_strategy

RESULTS_FILE = "results.jsonl"
CLOSED_BOOK_FILE = "closed_book.jsonl"


@dataclass(frozen=True)
class EvalConfig:
    """
    What to evaluate.

    :param strategies: Registered strategy names.
    :param top_ks: One run per k (paper 000 Figure 4 sweeps 5, 10, 20).
    :param setting: The passage setting (gold passage, noise ratio).
    :param concurrency: Questions answered at once.
    :param max_concurrency: LLM calls under way at once within one question.
    :param closed_book_filter: Drop answerable questions the LLM answers correctly with no passages (paper 000
        section 4 "Dataset Filter").
    :param strategy_options: Further `StrategyConfig` fields for every pipeline (e.g. `num_candidates`,
        `few_shot` for SuRe).
    :raises ValueError: For an unregistered strategy, a k below 1 or a concurrency below 1.
    """

    strategies: list[str]
    top_ks: list[int] = field(default_factory=lambda: [5])
    setting: PassageSetting = field(default_factory=PassageSetting)
    concurrency: int = 1
    max_concurrency: int = 4
    closed_book_filter: bool = False
    strategy_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.strategies:
            get_strategy(name)
        if not self.strategies:
            raise ValueError("`strategies` is empty")
        if any(k < 1 for k in self.top_ks) or not self.top_ks:
            raise ValueError(f"every top-k must be at least 1, got {self.top_ks}")
        if self.concurrency < 1 or self.max_concurrency < 1:
            raise ValueError("`concurrency` and `max_concurrency` must be at least 1")


@dataclass
class QuestionRecord:
    """One line of `results.jsonl`: a question answered by one strategy at one k, with its score."""

    strategy: str
    top_k: int
    setting: str
    question_id: str
    question: str
    gold: list[str]
    answerable: bool
    prediction: str
    evidence: dict[str, Any]
    passages: list[str]
    score: QuestionScore

    def key(self) -> tuple[str, int, str]:
        """The resume key: (strategy, k, question id)."""
        return (self.strategy, self.top_k, self.question_id)

    def to_json(self) -> str:
        """The JSONL line."""
        return json.dumps(asdict(self), default=str, ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> QuestionRecord:
        """Read a JSONL line back."""
        data = json.loads(line)
        data["score"] = QuestionScore(**data["score"])
        return cls(**data)


def score_run(question: EvalQuestion, prediction: str, evidence: dict[str, Any], passages: list[Document],
              usage: dict[str, int], seconds: float) -> QuestionScore:  # fmt: skip
    """
    Score one answered question with the papers' metrics.

    The post-fusion pool (`evidence["candidates"]`, most votes first) gives %NM's inputs: whether the pool holds a
    gold answer and whether the majority (its first candidate) is correct (paper 000 section 4).
    """
    golds = list(question.answers)
    candidates: list[str] = evidence.get("candidates") or []
    has_pool = evidence.get("candidates") is not None and bool(question.answers)
    return QuestionScore(
        id=question.id,
        answerable=not question.is_impossible,
        em=exact_match(prediction, golds),
        f1=f1(prediction, golds),
        accuracy=accuracy(prediction, golds),
        unknown=is_unknown(prediction),
        pool_has_gold=gold_in_pool(candidates, golds) if has_pool else None,
        majority_correct=bool(exact_match(candidates[0], golds)) if has_pool and candidates else None,
        retrieval_hit=retrieval_hit([d.content or "" for d in passages], golds) if golds else None,
        prompt_tokens=usage.get("prompt_tokens", 0),
        completion_tokens=usage.get("completion_tokens", 0),
        calls=usage.get("calls", 0),
        seconds=seconds,
    )


def read_records(path: Path) -> list[QuestionRecord]:
    """The records of a results file (none when it does not exist); a torn last line is ignored."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(QuestionRecord.from_json(line))
        except (json.JSONDecodeError, TypeError, KeyError):
            continue
    return records


class Evaluator:
    """
    Runs strategies over a dataset and appends one record per answered question to `out/results.jsonl`.

    Records already in the file are not asked again, so re-running with the same `out` resumes.

    :param dataset: The questions and the passage corpus.
    :param config: The `EvalConfig`.
    :param out: The output folder.
    :param retriever_factory: Makes a fresh retriever (one per pipeline), e.g. an InMemoryBM25Retriever.
    :param generator_factory: Makes a fresh ChatGenerator (one per pipeline).
    """

    def __init__(
        self,
        dataset: EvalDataset,
        config: EvalConfig,
        out: str | Path,
        *,
        retriever_factory: Callable[[], Any],
        generator_factory: Callable[[], ChatGenerator],
    ) -> None:
        self.dataset = dataset
        self.config = config
        self.out = Path(out)
        self.retriever_factory = retriever_factory
        self.generator_factory = generator_factory
        self._gold = {d.id: d for d in dataset.documents}
        self._lock = threading.Lock()

    def _pipeline(self, strategy: str, top_k: int, setting: PassageSetting) -> Pipeline:
        retriever = EvalRetriever(self.retriever_factory(), setting=setting, corpus=self.dataset.documents, top_k=top_k)
        return build_pipeline(
            strategy,
            retriever=retriever,
            chat_generator=self.generator_factory(),
            max_concurrency=self.config.max_concurrency,
            **self.config.strategy_options,
        )

    def _answer(self, pipeline: Pipeline, strategy: str, top_k: int, setting: PassageSetting,
                question: EvalQuestion) -> QuestionRecord:  # fmt: skip
        gold = self._gold.get(question.gold_document_id) if question.gold_document_id else None
        run = run_strategy(
            strategy,
            pipeline,
            question.question,
            top_k=top_k,
            retriever_inputs={"question_id": question.id, "answers": list(question.answers), "gold": gold},
        )
        prediction = run.answer.data or ""
        return QuestionRecord(
            strategy=strategy,
            top_k=top_k,
            setting=setting.label(),
            question_id=question.id,
            question=question.question,
            gold=list(question.answers),
            answerable=not question.is_impossible,
            prediction=prediction,
            evidence={**run.evidence, "usage": run.usage},
            passages=[d.id for d in run.documents],
            score=score_run(question, prediction, run.evidence, run.documents, run.usage, run.seconds),
        )

    def _run_all(self, path: Path, strategy: str, top_k: int, setting: PassageSetting,
                 questions: list[EvalQuestion], label: str) -> list[QuestionRecord]:  # fmt: skip
        """Answer the questions not yet in `path`, `concurrency` at a time; return all records of this run."""
        done = {r.question_id: r for r in read_records(path) if r.strategy == strategy and r.top_k == top_k}
        todo = [q for q in questions if q.id not in done]
        local = threading.local()

        def answer(question: EvalQuestion) -> QuestionRecord:
            if not hasattr(local, "pipeline"):
                local.pipeline = self._pipeline(strategy, top_k, setting)
            record = self._answer(local.pipeline, strategy, top_k, setting, question)
            with self._lock, path.open("a", encoding="utf-8") as file:
                file.write(record.to_json() + "\n")
            return record

        with (
            tqdm(total=len(questions), initial=len(questions) - len(todo), desc=label, unit="q") as progress,
            ThreadPoolExecutor(max_workers=self.config.concurrency) as pool,
        ):
            for record in pool.map(answer, todo):
                done[record.question_id] = record
                progress.update(1)
        return [done[q.id] for q in questions if q.id in done]

    def closed_book_filter(self, questions: list[EvalQuestion]) -> list[EvalQuestion]:
        """
        Paper 000 section 4 "Dataset Filter": ask concatenation with no passages and drop the answerable questions
        it already answers correctly (EM); unanswerable questions stay.
        """
        records = self._run_all(
            self.out / CLOSED_BOOK_FILE,
            "concatenation",
            self.config.top_ks[0],
            PassageSetting(closed_book=True),
            [q for q in questions if not q.is_impossible],
            "closed book",
        )
        known = {r.question_id for r in records if r.score.em == 1.0}
        return [q for q in questions if q.id not in known]

    def run(self, questions: Iterable[EvalQuestion] | None = None) -> list[QuestionRecord]:
        """
        Evaluate every strategy at every k.

        :param questions: The questions (default: the dataset's).
        :returns: The records of this evaluation, in strategy, k, question order.
        """
        self.out.mkdir(parents=True, exist_ok=True)
        questions = list(self.dataset.questions if questions is None else questions)
        if self.config.closed_book_filter:
            questions = self.closed_book_filter(questions)
        records: list[QuestionRecord] = []
        for strategy in self.config.strategies:
            for top_k in self.config.top_ks:
                label = f"{strategy} top-{top_k}"
                records += self._run_all(
                    self.out / RESULTS_FILE, strategy, top_k, self.config.setting, questions, label
                )
        return records
