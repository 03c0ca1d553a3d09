"""The evaluation runner: strategies x top-k x questions, concurrent, resumable, one JSONL line per answered question
(the protocol of Liu et al. section 4, with Yu et al. section 3.1's noise ratio and reject rate)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from haystack import Document, Pipeline, logging
from haystack.components.generators.chat.types import ChatGenerator
from haystack.core.errors import PipelineRuntimeError
from tqdm import tqdm

from haystack_fusion.backends import backend_pipeline
from haystack_fusion.backends.checks import warn_missing_logprobs
from haystack_fusion.backends.errors import queued_timeout_advice
from haystack_fusion.corpus import Question
from haystack_fusion.evaluation.datasets import EvalDataset
from haystack_fusion.evaluation.metrics import (
    QuestionScore,
    accuracy,
    exact_match,
    f1,
    gold_in_pool,
    is_unknown,
    retrieval_hit,
    with_answer_outcome,
)
from haystack_fusion.evaluation.passages import EvalRetriever, PassageSetting
from haystack_fusion.evaluation.records import (
    CLOSED_BOOK_FILE,
    EVIDENCE_TEXT_FILE,
    RESULTS_FILE,
    QuestionRecord,
    append_line,
    read_records,
    repair,
    run_fingerprint,
    split_evidence,
)
from haystack_fusion.failures import (
    CONFIGURATION_KINDS,
    DOCUMENT_STORE,
    CallFailure,
    calls_failed,
    classify,
    failure_kind,
)
from haystack_fusion.llm import (
    CallLimitedChatGenerator,
    calls_in_flight_limit,
    check_max_concurrency,
    max_calls_in_flight,
    unwrap_call_limit,
)
from haystack_fusion.strategies import get_strategy, run_strategy

logger = logging.getLogger(__name__)

FAILURES_IN_A_ROW_TO_STOP = 10
"""A run stops, raising the last error, when this many questions in a row failed outright (the pipeline raised, or
every LLM call failed)."""


class FingerprintMismatchError(ValueError):
    """Resuming would mix records made with other settings (another pipeline or prompt) into a run."""


@dataclass(frozen=True)
class EvalConfig:
    """What to evaluate: `strategies` at every k of `top_ks` (Liu et al. Figure 4: 5, 10, 20) in the passage `setting`;
    `parallel_questions` questions at once, `max_concurrency` LLM calls per round (None: all), `max_calls_in_flight`
    in the process. `closed_book_filter`: Liu et al. section 4 "Dataset Filter". :raises ValueError: For a value
    out of range or an unregistered strategy."""

    strategies: list[str]
    top_ks: list[int] = field(default_factory=lambda: [5])
    setting: PassageSetting = field(default_factory=PassageSetting)
    parallel_questions: int = 1
    max_concurrency: int | None = None
    max_calls_in_flight: int | None = None
    closed_book_filter: bool = False
    strategy_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        list(map(get_strategy, self.strategies))
        if not self.strategies:
            raise ValueError("`strategies` is empty")
        if any(k < 1 for k in self.top_ks) or not self.top_ks:
            raise ValueError(f"every top-k must be at least 1, got {self.top_ks}")
        if self.parallel_questions < 1:
            raise ValueError(f"`parallel_questions` must be at least 1, got {self.parallel_questions}")
        check_max_concurrency(self.max_concurrency)
        check_max_concurrency(self.max_calls_in_flight)


def _describe_failure(failure: CallFailure) -> str:
    """A failed call in words, e.g. "voter (index 2): APITimeoutError: ..."."""
    return f"{failure.component}{f' (index {failure.index})' if failure.index is not None else ''}: {failure}"


class BatchStoppedError(RuntimeError):
    """An evaluation stopped: an LLM call was refused (`failures.CONFIGURATION_KINDS`), or `FAILURES_IN_A_ROW_TO_STOP`
    questions in a row had every LLM call fail. `failures`: the last question's failed calls; `calls`: its LLM calls."""

    def __init__(self, message: str, *, failures: list[CallFailure] | None = None, calls: int = 0) -> None:
        super().__init__(message)
        self.failures = list(failures or [])
        self.calls = calls


def _refused(failures: list[CallFailure], calls: int) -> BatchStoppedError | None:
    """What stops a run whose question had a failed call no retry cures (`failures.CONFIGURATION_KINDS`: a refused
    key, a missing model or route), else None."""
    refused = [failure for failure in failures if failure.kind in CONFIGURATION_KINDS]
    message = f"stopped: an LLM call was refused ({refused[0].error_type})" if refused else ""
    return BatchStoppedError(message, failures=refused, calls=calls) if refused else None


def score_run(question: Question, prediction: str, evidence: dict[str, Any], passages: list[Document],
              usage: dict[str, int], seconds: float) -> QuestionScore:  # fmt: skip
    """Score one answered question; the post-fusion pool (`evidence["candidates"]`) gives %NM (Liu et al. section 4)."""
    golds = list(question.answers)
    candidates: list[str] = evidence.get("candidates") or []
    pool = evidence.get("candidates") is not None and bool(golds)
    score = QuestionScore(
        question.id, not question.is_impossible, exact_match(prediction, golds), f1(prediction, golds),
        accuracy(prediction, golds), is_unknown(prediction), gold_in_pool(candidates, golds) if pool else None,
        bool(exact_match(candidates[0], golds)) if pool and candidates else None,
        retrieval_hit([d.content or "" for d in passages], golds) if golds else None, usage.get("prompt_tokens", 0),
        usage.get("completion_tokens", 0), usage.get("calls", 0), seconds,
    )  # fmt: skip
    return with_answer_outcome(score, prediction, evidence, usage)


class Evaluator:
    """
    Runs strategies over a dataset and appends one record per answered question to `out/results.jsonl`; re-running
    with the same `out` resumes (failed records are asked again).

    ### Usage example
    ```python
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
    from haystack.document_stores.in_memory import InMemoryDocumentStore
    from haystack_fusion.backends import local_chat_generator
    from haystack_fusion.corpus import default_squad_path
    from haystack_fusion.evaluation.datasets import load_dataset
    from haystack_fusion.evaluation.runner import EvalConfig, Evaluator

    dataset = load_dataset(default_squad_path()).sample(20, seed=0)
    store = InMemoryDocumentStore()
    store.write_documents(dataset.documents)
    records = Evaluator(dataset, EvalConfig(strategies=["concatenation", "concat_pf"]), "runs/demo",
                        retriever_factory=lambda: InMemoryBM25Retriever(document_store=store),
                        generator_factory=local_chat_generator).run()
    ```

    The factories make a fresh retriever, ChatGenerator and fallback rounds' ChatGenerator (None: `generator_factory`'s
    for every round) per pipeline.
    """

    def __init__(self, dataset: EvalDataset, config: EvalConfig, out: str | Path, *,
                 retriever_factory: Callable[[], Any], generator_factory: Callable[[], ChatGenerator],
                 fallback_generator_factory: Callable[[], ChatGenerator] | None = None) -> None:  # fmt: skip
        self.dataset, self.config, self.out = dataset, config, Path(out)
        self.retriever_factory, self.generator_factory = retriever_factory, generator_factory
        self.fallback_generator_factory = fallback_generator_factory
        self._gold = {d.id: d for d in dataset.documents}
        self._lock = threading.Lock()
        self.notes: list[str] = []  # what the report should say beside its figures

    def _pipeline(self, strategy: str, top_k: int, setting: PassageSetting, generator: ChatGenerator) -> Pipeline:
        retriever = EvalRetriever(self.retriever_factory(), setting=setting, corpus=self.dataset.documents, top_k=top_k)
        make_fallback = self.fallback_generator_factory
        fallback = make_fallback and CallLimitedChatGenerator(chat_generator=make_fallback())
        # no backend configuration: `config.strategy_options` are every setting (`eval` puts the LLM's defaults in)
        return backend_pipeline(strategy, None, self.config.strategy_options, retriever=retriever,
                                chat_generator=CallLimitedChatGenerator(chat_generator=generator),
                                fallback_chat_generator=fallback,
                                max_concurrency=self.config.max_concurrency)  # fmt: skip

    def fingerprint(self, strategy: str, top_k: int, setting: PassageSetting) -> str:
        """The `records.run_fingerprint` of the run's pipeline."""
        return run_fingerprint(self._pipeline(strategy, top_k, setting, self.generator_factory()))

    def _answer(self, pipeline: Pipeline, strategy: str, top_k: int, setting: PassageSetting,
                question: Question, fingerprint: str,
                generator: ChatGenerator | None = None) -> tuple[QuestionRecord, dict[str, Any]]:  # fmt: skip
        gold = self._gold.get(question.gold_document_id) if question.gold_document_id else None
        run = run_strategy(
            pipeline,
            question.question,
            top_k=top_k,
            retriever_inputs={"question_id": question.id, "answers": list(question.answers), "gold": gold},
        )
        if generator is not None and (note := warn_missing_logprobs(generator, run.answers)) is not None:
            with self._lock:
                if note not in self.notes:
                    self.notes.append(note)
        prediction = run.answer.data or ""
        key = (strategy, top_k, setting.label(), question.id, not question.is_impossible)
        run_record = run.to_dict()
        evidence, usage = run_record["evidence"], run_record["usage"]
        structured, text = split_evidence({**evidence, "usage": usage, "usage_by_model": run_record["usage_by_model"]})
        score = score_run(question, prediction, evidence, run.documents, usage, run.seconds)
        error = self._calls_failed(run.failures, run.usage.calls, run.usage.rounds or 0) if run.failures else None
        passages = [d.id for d in run.documents]
        return QuestionRecord(*key, prediction, structured, passages, score, fingerprint, error=error), text

    def _calls_failed(self, failures: list[CallFailure], calls: int, rounds: int) -> str:
        """A record's `error` for its failed calls: how many, the first three, and `queued_timeout_advice`."""
        listed = "; ".join(_describe_failure(failure) for failure in failures[:3])
        in_flight = (
            1 if self.config.max_concurrency == 1 else self.config.max_calls_in_flight or calls_in_flight_limit()
        )
        advice = queued_timeout_advice(failures, calls=calls, rounds=rounds, max_calls_in_flight=in_flight)
        line = f"{len(failures)} of {calls} LLM calls failed: {listed}" + (f" ({advice})" if advice else "")
        return self._one_line(line, limit=1000)

    @staticmethod
    def _one_line(message: str, limit: int = 500) -> str:
        return " ".join(message.split())[:limit]

    def _failed(self, strategy: str, top_k: int, setting: PassageSetting, question: Question, fingerprint: str,
                error: Exception, seconds: float, pipeline: Pipeline) -> QuestionRecord:  # fmt: skip
        """The failed record of a question whose pipeline raised `error`: what failed, no prediction."""
        cause = error.__cause__ if isinstance(error, PipelineRuntimeError) and error.__cause__ else error
        where = ""
        if isinstance(error, PipelineRuntimeError) and error.component_name:
            kind = error.component_type.__name__ if error.component_type else "component"
            if error.component_type is CallLimitedChatGenerator:  # name the LLM, not the call slot around it
                kind = type(unwrap_call_limit(pipeline.get_component(error.component_name))).__name__
            where = f"component {error.component_name!r} ({kind}) failed: "
        score = score_run(question, "", {}, [], {}, seconds)
        key = (strategy, top_k, setting.label(), question.id, not question.is_impossible)
        error_text = self._one_line(f"{where}{type(cause).__name__}: {cause}")
        if (failed := calls_failed(error)) is not None:  # every call failed: each component's calls count as a round
            rounds = len({failure.component for failure in failed.failures})
            error_text = self._calls_failed(failed.failures, len(failed.failures), rounds)
        return QuestionRecord(*key, "", {}, [], score, fingerprint, error=error_text)

    def _run_all(self, path: Path, runs: list[tuple[str, int]], setting: PassageSetting,
                 questions: list[Question], label: str) -> list[QuestionRecord]:  # fmt: skip
        """Answer the questions not yet in `path`, every run on a question before the next; all clean records of the
        runs on `questions`, in run, question order."""
        repair(path)
        repair(self.out / EVIDENCE_TEXT_FILE)
        existing = read_records(path)
        fingerprints = {run: self.fingerprint(*run, setting) for run in runs}
        for (strategy, top_k), fingerprint in fingerprints.items():
            if others := sorted({r.fingerprint for r in existing if r.key()[:3] == (strategy, top_k, setting.label())}
                                - {fingerprint}):  # fmt: skip
                raise FingerprintMismatchError(
                    f"{path} already holds {strategy} top-{top_k} records made with other settings (fingerprint "
                    f"{others[0] or 'none'}, now {fingerprint}: another pipeline, LLM or prompt). Resuming would mix "
                    "them: use another --out folder, or delete those records to start them again.")  # fmt: skip
        done = {(r.strategy, r.top_k, r.question_id): r for r in existing if r.setting == setting.label()}
        todo = [(q, [run for run in runs if (*run, q.id) not in done]) for q in questions]
        todo = [(question, missing) for question, missing in todo if missing]
        local = threading.local()
        stop = threading.Event()  # set when the run must stop: later questions are not started
        in_a_row = [0]  # questions that failed outright since the last answered one

        def answer(task: tuple[Question, list[tuple[str, int]]]) -> list[QuestionRecord]:
            question, missing = task
            pipelines: dict[tuple[str, int], tuple[Pipeline, ChatGenerator]] = local.__dict__.setdefault(
                "pipelines", {}
            )
            answered = []
            for strategy, top_k in missing:
                if stop.is_set():
                    break
                if (strategy, top_k) not in pipelines:
                    generator = self.generator_factory()
                    pipelines[(strategy, top_k)] = (self._pipeline(strategy, top_k, setting, generator), generator)
                pipeline, generator = pipelines[(strategy, top_k)]
                fingerprint = fingerprints[(strategy, top_k)]
                start = time.perf_counter()
                try:
                    record, text = self._answer(pipeline, strategy, top_k, setting, question, fingerprint, generator)
                except Exception as error:
                    failed = calls_failed(error)
                    if failed is not None and (stopping := _refused(failed.failures, len(failed.failures))):
                        stop.set()
                        raise stopping from error
                    llm = failed is None and classify(error, DOCUMENT_STORE) is None
                    if llm and failure_kind(error) in CONFIGURATION_KINDS:  # a refused key, a missing model or route
                        stop.set()
                        raise
                    elapsed = time.perf_counter() - start
                    record = self._failed(strategy, top_k, setting, question, fingerprint, error, elapsed, pipeline)
                    text = {}
                    logger.warning(
                        "Question {question_id} ({strategy}, top-{top_k}) failed and is recorded as failed: {error}",
                        question_id=question.id,
                        strategy=strategy,
                        top_k=top_k,
                        error=record.error,
                    )
                    outright: Exception | None = error
                    if failed is not None:
                        outright = BatchStoppedError(
                            f"stopped after {FAILURES_IN_A_ROW_TO_STOP} questions in a row failed, every LLM call of "
                            "each; the records so far are kept (each failed one says what failed): fix the backend "
                            "and run the same command again to go on",
                            failures=failed.failures,
                            calls=len(failed.failures),
                        )
                else:
                    failures = [CallFailure.from_dict(f) for f in record.evidence.get("failures") or []]
                    calls = record.evidence.get("usage", {}).get("calls", 0)
                    if stopping := _refused(failures, calls):  # in a fan-out a refused key is one failed call
                        stop.set()
                        raise stopping
                    outright = None
                with self._lock:
                    if text and not record.failed:
                        line = {"key": list(record.key()), **text}
                        append_line(self.out / EVIDENCE_TEXT_FILE, json.dumps(line, ensure_ascii=False))
                    append_line(path, record.to_json())
                    in_a_row[0] = in_a_row[0] + 1 if outright is not None else 0
                    if outright is not None and in_a_row[0] >= FAILURES_IN_A_ROW_TO_STOP and not stop.is_set():
                        stop.set()
                        raise outright
                answered.append(record)
            return answered

        with (
            tqdm(total=len(questions), initial=len(questions) - len(todo), desc=label, unit="q") as progress,
            ThreadPoolExecutor(max_workers=self.config.parallel_questions) as pool,
        ):
            for answered in pool.map(answer, todo):
                for record in answered:
                    if not record.failed:
                        done[(record.strategy, record.top_k, record.question_id)] = record
                progress.update(1)
        return [done[(*run, q.id)] for run in runs for q in questions if (*run, q.id) in done]

    def closed_book_filter(self, questions: list[Question]) -> list[Question]:
        """Liu et al. section 4 "Dataset Filter": drop answerable questions closed-book concatenation gets right."""
        records = self._run_all(self.out / CLOSED_BOOK_FILE, [("concatenation", self.config.top_ks[0])],
                                PassageSetting(closed_book=True), [q for q in questions if not q.is_impossible],
                                "closed book")  # fmt: skip
        known = {r.question_id for r in records if r.score.em == 1.0}
        return [q for q in questions if q.id not in known]

    def run(self, questions: Iterable[Question] | None = None) -> list[QuestionRecord]:
        """Evaluate every strategy at every k on `questions` (default: the dataset's), question by question.
        :returns: The clean records, in strategy, k, question order (failed ones: `records.read_failures`).
        :raises FingerprintMismatchError: If `out` holds records of the same run made with other settings.
        :raises Exception: A question's error on `failures.CONFIGURATION_KINDS` or after `FAILURES_IN_A_ROW_TO_STOP`
            outright failures (`BatchStoppedError` when every LLM call failed)."""
        self.out.mkdir(parents=True, exist_ok=True)
        if not (ignore := self.out / ".gitignore").is_file():
            ignore.write_text(f"# model text that may quote passages: not committed\n{EVIDENCE_TEXT_FILE}\n")
        questions = list(self.dataset.questions if questions is None else questions)
        if self.config.closed_book_filter:
            questions = self.closed_book_filter(questions)
        runs = [(strategy, top_k) for strategy in self.config.strategies for top_k in self.config.top_ks]
        limit = self.config.max_calls_in_flight
        with max_calls_in_flight(limit) if limit is not None else contextlib.nullcontext():
            return self._run_all(self.out / RESULTS_FILE, runs, self.config.setting, questions,
                                 f"{len(runs)} strategy x top-k runs")  # fmt: skip


def rescore(records: Iterable[QuestionRecord], dataset: EvalDataset) -> list[QuestionRecord]:
    """Score records again from their predictions and the dataset; usage, latency and a redacted record's score kept.
    :raises ValueError: If a record's question id or passage id is not in the dataset."""
    questions, documents = {q.id: q for q in dataset.questions}, {d.id: d for d in dataset.documents}
    rescored = []
    for record in records:
        if record.question_id not in questions:
            raise ValueError(f"question {record.question_id!r} of the records is not in dataset {dataset.name!r}")
        if missing := [i for i in record.passages if i not in documents]:
            raise ValueError(f"passage {missing[0]!r} of question {record.question_id!r} is not in {dataset.name!r}")
        if record.redacted:
            rescored.append(record)
            continue
        old, passages = record.score, [documents[i] for i in record.passages]
        usage = {"prompt_tokens": old.prompt_tokens, "completion_tokens": old.completion_tokens, "calls": old.calls}
        score = score_run(questions[record.question_id], record.prediction, record.evidence, passages, usage,
                          old.seconds)  # fmt: skip
        if old.retrieval_hit is None:  # not measured in the run (e.g. closed book): keep it so
            score = dataclasses.replace(score, retrieval_hit=None)
        rescored.append(dataclasses.replace(record, score=score))
    return rescored
