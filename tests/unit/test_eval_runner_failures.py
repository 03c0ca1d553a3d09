"""The evaluation runner's failed records: what a batch does when LLM calls fail (recorded, rerun, stopped)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.core.errors import PipelineRuntimeError
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.backends.errors import QUEUED_TIMEOUT_ADVICE
from haystack_fusion.corpus import Question
from haystack_fusion.evaluation.datasets import EvalDataset
from haystack_fusion.evaluation.records import RESULTS_FILE, QuestionRecord, read_failures, read_records
from haystack_fusion.evaluation.runner import FAILURES_IN_A_ROW_TO_STOP, BatchStoppedError, EvalConfig, Evaluator
from tests.unit.capitals_dataset import DOCUMENTS

QUESTIONS = [Question(f"q{i}", f"What is the capital of France, take {i}?", ("Paris",), False) for i in range(12)]


def evaluator(out: Path, response_fn, strategies=("concatenation",)) -> Evaluator:
    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    return Evaluator(
        EvalDataset("faults", DOCUMENTS, QUESTIONS),
        EvalConfig(strategies=list(strategies), top_ks=[2]),
        out,
        retriever_factory=lambda: InMemoryBM25Retriever(document_store=store),
        generator_factory=lambda: MockChatGenerator(response_fn=response_fn),
    )


def fails_on(*takes: int, error: Exception | None = None):
    def reply(messages):
        if any(f"take {take}?" in messages[-1].text for take in takes):
            raise error or RuntimeError("the server went away")
        return "Paris"

    return reply


class TestFailedRecords:
    def test_a_question_whose_pipeline_raised_gets_a_failed_record_and_a_rerun_asks_only_it(self, tmp_path):
        records = evaluator(tmp_path, fails_on(3, 7)).run()
        assert len(records) == 10
        lines = [json.loads(line) for line in (tmp_path / RESULTS_FILE).read_text().splitlines()]
        assert len(lines) == 12
        failed = [line for line in lines if "error" in line]
        assert sorted(line["question_id"] for line in failed) == ["q3", "q7"]
        assert failed[0]["error"] == ("component 'llm' (MockChatGenerator) failed: RuntimeError: the server went away")
        assert failed[0]["prediction"] == ""
        assert [r.question_id for r in read_failures(tmp_path / RESULTS_FILE)] == ["q3", "q7"]
        assert len(read_records(tmp_path / RESULTS_FILE)) == 10  # reports see the clean ones only

        asked = []

        def reply(messages):
            asked.append(messages[-1].text)
            return "Paris"

        again = evaluator(tmp_path, reply)
        assert len(again.run()) == 12
        assert len(asked) == 2  # only the failed questions
        assert again.failures() == []
        assert (tmp_path / RESULTS_FILE).read_text().splitlines()[:12] == [json.dumps(line) for line in lines]

    def test_a_failed_call_inside_a_fan_out_is_recorded_with_the_answer_kept(self, tmp_path):
        def one_passage_fails(messages):
            if "take 2?" in messages[-1].text and "Berlin" in messages[-1].text:
                raise TimeoutError("Request timed out.")
            return "Paris"

        evaluator(tmp_path, one_passage_fails, strategies=("post_fusion",)).run()
        (failure,) = read_failures(tmp_path / RESULTS_FILE)
        assert failure.question_id == "q2"
        assert failure.prediction == "Paris"
        assert failure.error.startswith("1 of 2 LLM calls failed: voter (")
        # the two passages' calls went out together: the timeout may have been spent in the server's queue
        assert failure.error.endswith(f"TimeoutError: Request timed out. ({QUEUED_TIMEOUT_ADVICE})")
        assert failure.evidence["failures"][0]["component"] == "voter"

    def test_a_clean_record_has_no_error_key(self, tmp_path):
        evaluator(tmp_path, fails_on()).run()
        line = (tmp_path / RESULTS_FILE).read_text().splitlines()[0]
        assert "error" not in json.loads(line)
        assert QuestionRecord.from_json(line).to_json() == line

    def test_a_refused_key_stops_the_run_at_once(self, tmp_path):
        response = httpx.Response(401, request=httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions"))
        refused = openai.AuthenticationError("Incorrect API key provided", response=response, body=None)
        with pytest.raises(PipelineRuntimeError) as raised:
            evaluator(tmp_path, fails_on(*range(12), error=refused)).run()
        assert isinstance(raised.value.__cause__, openai.AuthenticationError)
        assert not (tmp_path / RESULTS_FILE).exists()  # no failed record for a configuration error

    def test_questions_failing_in_a_row_stop_the_run(self, tmp_path):
        questions = [
            Question(f"q{i}", f"What is the capital of France, take {i}?", ("Paris",), False) for i in range(30)
        ]
        store = InMemoryDocumentStore()
        store.write_documents(DOCUMENTS)
        down = Evaluator(
            EvalDataset("down", DOCUMENTS, questions),
            EvalConfig(strategies=["post_fusion"], top_ks=[2]),
            tmp_path,
            retriever_factory=lambda: InMemoryBM25Retriever(document_store=store),
            generator_factory=lambda: MockChatGenerator(response_fn=fails_on(*range(30))),
        )
        with pytest.raises(BatchStoppedError, match=f"stopped after {FAILURES_IN_A_ROW_TO_STOP} questions in a row"):
            down.run()
        assert len(read_failures(tmp_path / RESULTS_FILE)) == FAILURES_IN_A_ROW_TO_STOP
