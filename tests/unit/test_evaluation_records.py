"""Evaluation records: what a line holds, fingerprints that refuse mixing, SIGKILL-safe resume, stratified samples."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.corpus import Question
from haystack_fusion.evaluation.datasets import EvalDataset
from haystack_fusion.evaluation.passages import PassageSetting
from haystack_fusion.evaluation.records import (
    EVIDENCE_TEXT_FILE,
    RESULTS_FILE,
    QuestionRecord,
    append_line,
    merge_evidence,
    read_records,
    read_run_manifest,
    repair,
    split_evidence,
    write_run_manifest,
)
from haystack_fusion.evaluation.runner import EvalConfig, Evaluator, FingerprintMismatchError, rescore
from haystack_fusion.evaluation.view import ReportView
from haystack_fusion.prompts import PROMPTS
from tests.unit.capitals_dataset import (
    DATASET,
    DOCUMENTS,
    QUESTIONS,
    capital_from_prompt,
    many_questions_evaluator,
    slow_paris,
)
from tests.unit.scores import outcome_score


def evaluator(tmp_path: Path, max_concurrency: int | None = None, **options) -> Evaluator:
    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    return Evaluator(
        DATASET,
        EvalConfig(
            strategies=["concatenation", "post_fusion"],
            top_ks=[2],
            max_concurrency=max_concurrency,
            strategy_options=options,
        ),
        tmp_path,
        retriever_factory=lambda: InMemoryBM25Retriever(document_store=store),
        generator_factory=lambda: MockChatGenerator(response_fn=capital_from_prompt),
    )


class TestRecords:
    def test_no_question_gold_or_passage_text(self, tmp_path):
        evaluator(tmp_path).run()
        text = (tmp_path / RESULTS_FILE).read_text()
        for question in QUESTIONS:
            assert question.question not in text
        for document in DOCUMENTS:
            assert document.content not in text
        record = json.loads(text.splitlines()[0])
        assert {"question", "gold"}.isdisjoint(record)
        assert record["fingerprint"]
        assert (tmp_path / ".gitignore").read_text().strip().endswith(EVIDENCE_TEXT_FILE)

    def test_split_and_merge_evidence(self):
        evidence = {
            "votes": {"paris": 2},
            "summaries": ["Paris is the capital."],
            "notes": [{"relevance": "direct", "note": "Passage #1 says Paris."}],
        }
        structured, text = split_evidence(evidence)
        assert structured == {"votes": {"paris": 2}, "notes": [{"relevance": "direct"}]}
        assert text == {"summaries": ["Paris is the capital."], "notes": ["Passage #1 says Paris."]}
        assert merge_evidence(structured, text) == evidence

    def test_rescore_from_records_and_dataset(self, tmp_path):
        records = evaluator(tmp_path).run()
        again = rescore(read_records(tmp_path / RESULTS_FILE), DATASET)
        assert {r.key(): r.score for r in again} == {r.key(): r.score for r in records}
        with pytest.raises(ValueError, match="not in dataset"):
            rescore(records, EvalDataset("other", DOCUMENTS, QUESTIONS[:1]))

    def test_question_major_order(self, tmp_path):
        evaluator(tmp_path).run()
        lines = [json.loads(line) for line in (tmp_path / RESULTS_FILE).read_text().splitlines()]
        first_two = [(r["question_id"], r["strategy"]) for r in lines[:2]]
        assert first_two == [("q1", "concatenation"), ("q1", "post_fusion")]


class TestFingerprints:
    def test_same_settings_resume(self, tmp_path):
        evaluator(tmp_path).run()
        lines = (tmp_path / RESULTS_FILE).read_text().splitlines()
        evaluator(tmp_path).run()
        assert (tmp_path / RESULTS_FILE).read_text().splitlines() == lines
        assert len({r.fingerprint for r in read_records(tmp_path / RESULTS_FILE)}) == 2  # one per strategy

    def test_changed_settings_are_refused(self, tmp_path):
        evaluator(tmp_path).run()
        with pytest.raises(FingerprintMismatchError, match="concatenation top-2 records made with other settings"):
            evaluator(tmp_path, max_passage_chars=100).run()

    def test_the_pipeline_and_the_prompts_count_runtime_settings_do_not(self, tmp_path, monkeypatch):
        def fingerprint(strategy: str = "concatenation", top_k: int = 2, **options) -> str:
            return evaluator(tmp_path, **options).fingerprint(strategy, top_k, PassageSetting())

        first = fingerprint()
        assert fingerprint() == first  # the same in every process: no random index name, no object ids
        assert fingerprint(max_concurrency=1) == first  # speed, not predictions
        assert fingerprint(max_passage_chars=100) != first
        assert fingerprint(top_k=3) != first
        assert fingerprint("post_fusion") != first
        prompt = PROMPTS["figure7"]
        monkeypatch.setitem(PROMPTS, "figure7", type(prompt)(prompt.name, prompt.source, prompt.text + " ", r"(.*)"))
        assert fingerprint() != first


class TestKilledRuns:
    def test_repair_cuts_a_torn_line(self, tmp_path):
        path = tmp_path / "r.jsonl"
        append_line(path, '{"a": 1}')
        with path.open("a") as file:
            file.write('{"a": 2, "torn')
        repair(path)
        assert path.read_text() == '{"a": 1}\n'
        append_line(path, '{"a": 3}')
        assert path.read_text().splitlines() == ['{"a": 1}', '{"a": 3}']

    def test_sigkill_mid_run_resumes_without_torn_or_duplicated_records(self, tmp_path):
        """A real process appending records is SIGKILLed; the resumed run has each question exactly once."""
        script = textwrap.dedent(
            f"""
            from haystack.components.generators.chat import MockChatGenerator
            from tests.unit.capitals_dataset import many_questions_evaluator, slow_paris

            many_questions_evaluator({str(tmp_path)!r}, lambda: MockChatGenerator(response_fn=slow_paris)).run()
            """
        )
        process = subprocess.Popen(
            [sys.executable, "-c", script],
            env={**os.environ, "HAYSTACK_TELEMETRY_ENABLED": "False"},
            cwd=Path(__file__).parents[2],  # the checkout, so that `tests` imports
        )
        path = tmp_path / RESULTS_FILE
        try:
            for _ in range(600):  # until some records are written, at most 60 s
                if path.is_file() and len(path.read_text().splitlines()) >= 5:
                    break
                if process.poll() is not None:
                    pytest.fail("the run ended before it could be killed")
                time.sleep(0.1)
            os.kill(process.pid, signal.SIGKILL)
        finally:
            process.wait(timeout=30)
        before = read_records(path)
        assert 5 <= len(before) < 40
        many_questions_evaluator(str(tmp_path), lambda: MockChatGenerator(response_fn=slow_paris)).run()
        lines = path.read_text().splitlines()
        ids = [json.loads(line)["question_id"] for line in lines]  # every line parses: nothing torn
        assert sorted(ids) == sorted(f"q{i}" for i in range(40))  # each question once
        assert [r.prediction for r in read_records(path)][: len(before)] == [r.prediction for r in before]


class TestSample:
    def dataset(self) -> EvalDataset:
        questions = [Question(f"a{i}", "q", ("x",), False) for i in range(30)] + [
            Question(f"u{i}", "q", (), True) for i in range(10)
        ]
        return EvalDataset("d", DOCUMENTS, questions)

    def test_stratified_fixed_and_in_file_order(self):
        sample = self.dataset().sample(10, seed=0)
        assert sample.answerable == 5
        assert sample.unanswerable == 5
        assert sample.questions == self.dataset().sample(10, seed=0).questions
        assert sample.questions != self.dataset().sample(10, seed=1).questions
        order = [q.id for q in self.dataset().questions]
        assert [q.id for q in sample.questions] == sorted((q.id for q in sample.questions), key=order.index)

    def test_a_short_stratum_is_filled_by_the_other(self):
        sample = self.dataset().sample(30, seed=0)
        assert sample.unanswerable == 10
        assert sample.answerable == 20
        assert len(self.dataset().sample(100).questions) == 40

    def test_negative(self):
        with pytest.raises(ValueError, match="at least 0"):
            self.dataset().sample(-1)


class TestRunManifest:
    def test_runtimes_accumulate_one_entry_per_distinct_build(self, tmp_path):
        """A run resumed on another llama.cpp build lists both builds; the same build is listed once."""
        first = {"llama_cpp_python": "0.3.36", "system_info": "CPU : AVX2 = 1"}
        second = {"llama_cpp_python": "0.3.36", "system_info": "CPU : AVX2 = 1 | AVX512 = 1"}
        write_run_manifest(tmp_path, title="t", dataset="d.json", command=["eval"], runtime=first)
        write_run_manifest(tmp_path, title="t", dataset="d.json", command=["eval"], runtime=first)
        assert read_run_manifest(tmp_path)["runtimes"] == [first]
        write_run_manifest(tmp_path, title="t2", dataset="d.json", runtime=second)
        write_run_manifest(tmp_path, title="t3", dataset="d.json")  # a server run names no build: the list stays
        manifest = read_run_manifest(tmp_path)
        assert manifest["runtimes"] == [first, second]
        assert manifest["title"] == "t3"

    def test_strategy_options_are_kept_until_given_again(self, tmp_path):
        write_run_manifest(tmp_path, title="t", dataset="d.json", strategy_options={"min_confidence": 1.0})
        write_run_manifest(tmp_path, title="t", dataset="d.json", notes=["a note"])
        assert read_run_manifest(tmp_path)["strategy_options"] == {"min_confidence": 1.0}
        write_run_manifest(tmp_path, title="t", dataset="d.json", strategy_options={})
        assert read_run_manifest(tmp_path)["strategy_options"] == {}

    def test_no_runtime_no_key(self, tmp_path):
        write_run_manifest(tmp_path, title="t", dataset="d.json")
        assert "runtimes" not in read_run_manifest(tmp_path)

    def test_the_embedded_models_runtime_names_its_build(self):
        pytest.importorskip("llama_cpp")
        from haystack_fusion.backends import llama_cpp_runtime

        runtime = llama_cpp_runtime()
        assert runtime["llama_cpp_python"]
        assert runtime["system_info"].startswith("CPU")


LINE_WITHOUT_FLAGS = {
    "strategy": "concatenation",
    "top_k": 5,
    "setting": "retrieved",
    "question_id": "q3",
    "answerable": False,
    "prediction": "",
    "evidence": {"votes": None, "candidates": None, "usage": {"prompt_tokens": 9, "completion_tokens": 0, "calls": 1}},
    "passages": [],
    "score": {
        "id": "q3",
        "answerable": False,
        "em": 0.0,
        "f1": 0.0,
        "accuracy": 0.0,
        "unknown": True,
        "pool_has_gold": None,
        "majority_correct": None,
        "retrieval_hit": None,
        "prompt_tokens": 9,
        "completion_tokens": 0,
        "calls": 1,
        "seconds": 1.0,
    },
    "fingerprint": "cf62d6279f86714a",
    "redacted": False,
}


class TestRecordsWithoutOutcomeFlags:
    def test_a_line_without_the_flags_reads_unflagged_and_scores_the_same(self):
        old = QuestionRecord.from_json(json.dumps(LINE_WITHOUT_FLAGS))
        assert (old.score.empty, old.score.invalid, old.score.truncated, old.score.truncated_calls) == (
            False,
            False,
            False,
            0,
        )
        answered = dataclasses.replace(old, question_id="q1", prediction="Paris")
        records = [old, answered]
        view = ReportView.of(records)
        assert ReportView.of(view.records).runs == view.runs  # setting the flags twice changes nothing
        (flagged,) = ReportView.of([old]).records
        assert (flagged.score.empty, flagged.score.unknown) == (True, True)  # a blank answer without flags abstains

    def test_new_flags_round_trip(self):
        new = dataclasses.replace(
            QuestionRecord.from_json(json.dumps(LINE_WITHOUT_FLAGS)),
            score=outcome_score(id="q3", answerable=False, unknown=False, invalid=True, empty=True, truncated_calls=2),
        )
        assert QuestionRecord.from_json(new.to_json()) == new
