"""Evaluation records: no dataset text, fingerprints that refuse mixing, SIGKILL-safe resume, stratified samples."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from haystack import Document
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.evaluation.datasets import EvalDataset, EvalQuestion
from haystack_fusion.evaluation.metrics import QuestionScore
from haystack_fusion.evaluation.records import (
    EVIDENCE_TEXT_FILE,
    FINGERPRINTS_FILE,
    RESULTS_FILE,
    DatasetText,
    FingerprintMismatchError,
    QuestionRecord,
    RunSettings,
    append_line,
    merge_evidence,
    read_records,
    read_run_manifest,
    redact_records,
    repair,
    split_evidence,
    write_run_manifest,
)
from haystack_fusion.evaluation.runner import EvalConfig, Evaluator, rescore
from tests.unit.test_eval_runner import DATASET, DOCUMENTS, QUESTIONS, capital_from_prompt


def evaluator(tmp_path: Path, **options) -> Evaluator:
    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    return Evaluator(
        DATASET,
        EvalConfig(strategies=["concatenation", "post_fusion"], top_ks=[2], strategy_options=options),
        tmp_path,
        retriever_factory=lambda: InMemoryBM25Retriever(document_store=store),
        generator_factory=lambda: MockChatGenerator(response_fn=capital_from_prompt),
    )


class TestRecordsHoldNoDatasetText:
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
        assert len(json.loads((tmp_path / FINGERPRINTS_FILE).read_text())) == 2  # one per strategy

    def test_changed_settings_are_refused_with_what_changed(self, tmp_path):
        evaluator(tmp_path).run()
        with pytest.raises(FingerprintMismatchError, match=r"max_passage_chars: .* -> 100"):
            evaluator(tmp_path, max_passage_chars=100).run()

    def test_runtime_settings_do_not_count(self):
        a = RunSettings("concatenation", 5, "s", options={"few_shot": True}, llm={"model": "m", "timeout": 3})
        b = RunSettings("concatenation", 5, "s", options={"few_shot": True}, llm={"model": "m", "timeout": 9})
        assert a.fingerprint() == b.fingerprint()
        assert a.fingerprint() != RunSettings("concatenation", 5, "s", llm={"model": "other"}).fingerprint()


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
            import time, sys
            sys.path.insert(0, {str(Path(__file__).parents[2])!r})
            from haystack.components.generators.chat import MockChatGenerator
            from haystack_fusion.evaluation.datasets import EvalDataset, EvalQuestion
            from tests.unit.test_eval_records import many_questions_evaluator

            def slow(messages):
                time.sleep(0.05)
                return "Paris"

            many_questions_evaluator({str(tmp_path)!r}, lambda: MockChatGenerator(response_fn=slow)).run()
            """
        )
        process = subprocess.Popen(
            [sys.executable, "-c", script], env={**os.environ, "HAYSTACK_TELEMETRY_ENABLED": "False"}
        )
        path = tmp_path / RESULTS_FILE
        try:
            for _ in range(600):  # until some records are written, at most 60 s
                if path.is_file() and len(path.read_text().splitlines()) >= 5:
                    break
                if process.poll() is not None:
                    pytest.fail("the run ended before it could be killed")
                import time

                time.sleep(0.1)
            os.kill(process.pid, signal.SIGKILL)
        finally:
            process.wait(timeout=30)
        before = read_records(path)
        assert 5 <= len(before) < 40
        many_questions_evaluator(str(tmp_path), lambda: MockChatGenerator(response_fn=lambda m: "Paris")).run()
        lines = path.read_text().splitlines()
        ids = [json.loads(line)["question_id"] for line in lines]  # every line parses: nothing torn
        assert sorted(ids) == sorted(f"q{i}" for i in range(40))  # each question once
        assert [r.prediction for r in read_records(path)][: len(before)] == [r.prediction for r in before]


def many_questions_evaluator(out: str, generator_factory) -> Evaluator:
    """40 questions over the capitals corpus, concatenation only (used by the SIGKILL test's child process)."""
    questions = [
        EvalQuestion(f"q{i}", f"What is the capital of France, take {i}?", ("Paris",), False) for i in range(40)
    ]
    dataset = EvalDataset("many", DOCUMENTS, questions)
    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    return Evaluator(
        dataset,
        EvalConfig(strategies=["concatenation"], top_ks=[2]),
        out,
        retriever_factory=lambda: InMemoryBM25Retriever(document_store=store),
        generator_factory=generator_factory,
    )


class TestSample:
    def dataset(self) -> EvalDataset:
        questions = [EvalQuestion(f"a{i}", "q", ("x",), False) for i in range(30)] + [
            EvalQuestion(f"u{i}", "q", (), True) for i in range(10)
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


class TestRedaction:
    @staticmethod
    def copied_run(tmp_path: Path, strategy: str) -> tuple[EvalDataset, list[QuestionRecord]]:
        """A run of `strategy` whose model copies 9 words of a passage into every reply."""
        long = Document(content="Paris is the capital and the largest city of France by far.", id="long")
        dataset = EvalDataset("long", [*DOCUMENTS, long], QUESTIONS)
        store = InMemoryDocumentStore()
        store.write_documents(dataset.documents)
        copier = Evaluator(
            dataset,
            EvalConfig(strategies=[strategy], top_ks=[2]),
            tmp_path,
            retriever_factory=lambda: InMemoryBM25Retriever(document_store=store),
            generator_factory=lambda: MockChatGenerator(responses="Paris is the capital and the largest city of"),
        )
        return dataset, copier.run()

    def test_copied_dataset_text_is_cut_out_and_the_score_kept(self, tmp_path):
        text = DatasetText(["Paris is the capital and the largest city of France by far."])
        assert text.redact("Paris") == ("Paris", False)
        redacted, cut = text.redact("It says: Paris is the capital and the largest city of France, so Paris")
        assert cut
        assert redacted == "It says: [10 words of the dataset] so Paris"
        dataset, records = self.copied_run(tmp_path, "concatenation")
        assert all(r.redacted and "Paris is the capital" not in r.prediction for r in records)
        assert rescore(read_records(tmp_path / RESULTS_FILE), dataset) == read_records(tmp_path / RESULTS_FILE)

    def test_a_sample_run_cuts_out_the_questions_it_left_out(self, tmp_path):
        """`eval --sample` runs a part of the dataset; a copy of a question outside it is cut out all the same."""
        left_out = EvalQuestion("out", "Which river flows through the old town of Lyon today?", ("Saone",), False)
        whole = EvalDataset("whole", DOCUMENTS, [*QUESTIONS, left_out])
        part = EvalDataset("whole", DOCUMENTS, list(QUESTIONS))
        store = InMemoryDocumentStore()
        store.write_documents(DOCUMENTS)

        def run(out: Path, **kwargs) -> list[QuestionRecord]:
            return Evaluator(
                part,
                EvalConfig(strategies=["concatenation"], top_ks=[2]),
                out,
                retriever_factory=lambda: InMemoryBM25Retriever(document_store=store),
                generator_factory=lambda: MockChatGenerator(responses=left_out.question),
                **kwargs,
            ).run()

        assert not any(r.redacted for r in run(tmp_path / "part"))  # the sample's own text alone misses it
        records = run(tmp_path / "whole", dataset_text=DatasetText.of(whole))
        assert records
        assert all(r.redacted and "Lyon" not in r.prediction for r in records)

    def test_near_copies_are_cut_out_too(self):
        """Case, punctuation and articles do not hide a copy: SQuAD-normalized text (vote keys) is cut as well."""
        text = DatasetText(
            ["The river otters were moved into the Lake-Shore reserve of their keepers, see Old Harbour."]
        )
        for near in (
            "the river otters were moved into the Lakeshore reserve of their keepers",  # case, hyphen
            "river otters were moved into lakeshore reserve of their keepers",  # SQuAD normalization
            "The river otters - were moved into the Lake-Shore reserve of their keepers!",  # punctuation-only word
        ):
            redacted, cut = text.redact(near)
            assert cut, near
            assert redacted.startswith("["), redacted
            assert redacted.endswith("words of the dataset]"), redacted
        kept = "The river otters were moved into a reserve"
        assert text.redact(kept) == (kept, False)
        assert text.redact("the " * 9) == ("the " * 9, False)

    def test_model_text_in_the_evidence_is_cut_out_too(self, tmp_path):
        """Post-fusion's candidates (its per-passage answers) are model text like the prediction: same redaction."""
        text = DatasetText(["Paris is the capital and the largest city of France by far."])
        evidence = {"candidates": ["Paris", "Paris is the capital and the largest city of"], "votes": {"paris": 1}}
        redacted, cut = text.redact_value(evidence)
        assert cut
        assert redacted == {"candidates": ["Paris", "[9 words of the dataset]"], "votes": {"paris": 1}}
        copied = "Paris is the capital and the largest city of"
        other = "is the capital and the largest city of France"
        votes, cut = text.redact_value({"votes": {copied: 2, other: 1, "paris": 1}})
        assert cut
        assert votes == {"votes": {"[9 words of the dataset]": 2, "[9 words of the dataset] (2)": 1, "paris": 1}}
        assert text.redact_value({"passages": ["1c6071d9"], "k": 5, "x": None}) == (
            {"passages": ["1c6071d9"], "k": 5, "x": None},
            False,
        )
        self.copied_run(tmp_path, "post_fusion")
        lines = (tmp_path / RESULTS_FILE).read_text(encoding="utf-8")
        assert "Paris is the capital" not in lines
        assert all(r.redacted for r in read_records(tmp_path / RESULTS_FILE))

    def test_committed_records_are_redacted_in_place_and_keep_their_scores(self, tmp_path):
        text = DatasetText(["Paris is the capital and the largest city of France by far."])
        copied = "Paris is the capital and the largest city of"
        score = QuestionScore("q1", True, 1.0, 1.0, 1.0, False, True, True, True, 10, 2, 5, 1.0)
        copier = QuestionRecord("post_fusion", 5, "retrieved", "q1", True, "Paris", {"candidates": [copied]}, [], score)
        clean = dataclasses.replace(copier, question_id="q2", evidence={"candidates": ["Paris"]})
        failed = dataclasses.replace(copier, question_id="q3", error="1 of 5 LLM calls failed: timeout")
        path = tmp_path / RESULTS_FILE
        lines = [copier.to_json(), clean.to_json(), failed.to_json(), '{"torn": ']
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        assert redact_records(path, text) == 2
        after = path.read_text(encoding="utf-8").splitlines()
        assert after[1] == lines[1]
        assert after[3] == lines[3]
        first, second = read_records(path)
        assert first.evidence == {"candidates": ["[9 words of the dataset]"]}
        assert first.redacted
        assert first.prediction == "Paris"
        assert first.score == score
        assert second == clean
        assert redact_records(path, text) == 0


def test_fingerprints_name_a_class_by_its_public_path():
    """Moving a class between this package's internal modules changes no fingerprint (committed runs resume)."""
    from haystack.components.generators.chat import MockChatGenerator

    from haystack_fusion.backends import BackendConfig
    from haystack_fusion.evaluation.records import public_class_path

    assert public_class_path(BackendConfig) == "haystack_fusion.backends.BackendConfig"
    assert public_class_path(MockChatGenerator) == f"{MockChatGenerator.__module__}.MockChatGenerator"


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

    def test_no_runtime_no_key(self, tmp_path):
        write_run_manifest(tmp_path, title="t", dataset="d.json")
        assert "runtimes" not in read_run_manifest(tmp_path)

    def test_the_embedded_models_runtime_names_its_build(self):
        pytest.importorskip("llama_cpp")
        from haystack_fusion.backends import llama_cpp_runtime

        runtime = llama_cpp_runtime()
        assert runtime["llama_cpp_python"]
        assert runtime["system_info"].startswith("CPU")
