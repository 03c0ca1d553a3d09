"""The evaluation runner (resume, concurrency, failed records, missing log-probabilities), on MockChatGenerator."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.dataclasses import GeneratedAnswer
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.backends import missing_logprobs
from haystack_fusion.backends.errors import QUEUED_TIMEOUT_ADVICE
from haystack_fusion.corpus import Question
from haystack_fusion.evaluation.datasets import EvalDataset
from haystack_fusion.evaluation.records import (
    RESULTS_FILE,
    QuestionRecord,
    read_failures,
    read_records,
    read_run_manifest,
    write_run_manifest,
)
from haystack_fusion.evaluation.report import (
    TABLE_FILE,
    write_report,
)
from haystack_fusion.evaluation.runner import (
    FAILURES_IN_A_ROW_TO_STOP,
    BatchStoppedError,
    EvalConfig,
    Evaluator,
)
from tests.unit.capitals_dataset import DOCUMENTS, QUESTIONS, capital_from_prompt, make_evaluator


class TestEvaluator:
    def test_runs_every_strategy_and_scores(self, tmp_path):
        records = make_evaluator(tmp_path).run()
        assert len(records) == 2 * len(QUESTIONS)
        by_key = {(r.strategy, r.question_id): r for r in records}
        assert by_key[("concatenation", "q1")].prediction == "Paris"
        assert by_key[("concatenation", "q1")].score.em == 1.0
        assert by_key[("post_fusion", "q1")].score.pool_has_gold is True
        assert by_key[("post_fusion", "q1")].score.calls == 2
        assert len(read_records(tmp_path / RESULTS_FILE)) == len(records)

    def test_resume_asks_only_the_missing_questions(self, tmp_path):
        make_evaluator(tmp_path, strategies=["concatenation"]).run(QUESTIONS[:2])
        lines_before = (tmp_path / RESULTS_FILE).read_text().splitlines()
        evaluator = make_evaluator(tmp_path, strategies=["concatenation"])
        calls = []
        original = evaluator._answer

        def counting(pipeline, strategy, top_k, setting, question, fingerprint, generator):
            calls.append(question.id)
            return original(pipeline, strategy, top_k, setting, question, fingerprint, generator)

        evaluator._answer = counting  # type: ignore[method-assign]
        records = evaluator.run()
        assert calls == ["q3"]
        assert len(records) == 3
        assert (tmp_path / RESULTS_FILE).read_text().splitlines()[:2] == lines_before

    def test_a_torn_last_line_is_ignored_and_redone(self, tmp_path):
        make_evaluator(tmp_path, strategies=["concatenation"]).run(QUESTIONS[:1])
        with (tmp_path / RESULTS_FILE).open("a") as file:
            file.write('{"strategy": "concatenation", "top_k"')
        assert len(make_evaluator(tmp_path, strategies=["concatenation"]).run()) == 3

    def test_concurrent_questions_give_the_same_records(self, tmp_path):
        serial = make_evaluator(tmp_path / "a").run()
        concurrent = make_evaluator(tmp_path / "b", parallel_questions=3).run()
        assert [(r.strategy, r.question_id, r.prediction) for r in serial] == [
            (r.strategy, r.question_id, r.prediction) for r in concurrent
        ]

    def test_closed_book_filter_drops_questions_answered_without_passages(self, tmp_path):
        evaluator = make_evaluator(tmp_path, closed_book_filter=True)
        evaluator.generator_factory = lambda: MockChatGenerator(responses="Paris")  # right for q1 only
        kept = evaluator.closed_book_filter(QUESTIONS)
        assert [q.id for q in kept] == ["q2", "q3"]

    def test_config_errors(self):
        with pytest.raises(ValueError, match="registered strategies"):
            EvalConfig(strategies=["nope"])
        with pytest.raises(ValueError, match="top-k"):
            EvalConfig(strategies=["concatenation"], top_ks=[0])
        with pytest.raises(ValueError, match="`parallel_questions`"):
            EvalConfig(strategies=["concatenation"], parallel_questions=0)
        with pytest.raises(ValueError, match="`max_concurrency`"):
            EvalConfig(strategies=["concatenation"], max_concurrency=0)
        assert EvalConfig(strategies=["concatenation"]).max_concurrency is None


def NoLogprobsServer() -> MockChatGenerator:  # noqa: N802 - stands for a class
    """An OpenAI-compatible server asked for token log-probabilities that sends none (its replies: finish_reason)."""
    generator = MockChatGenerator(response_fn=capital_from_prompt)
    # the answer line's stop already in its settings: the strategy uses it as it is, not a copy from its to_dict
    generator.generation_kwargs = {"logprobs": True, "top_logprobs": 0, "stop": ["\n"]}  # type: ignore[attr-defined]
    generator.api_base_url = "http://user:secret@127.0.0.1:8080/v1"  # type: ignore[attr-defined]
    return generator


class TestMissingLogprobs:
    MESSAGE = (
        "the OpenAI-compatible server at http://127.0.0.1:8080/v1 returned no token log-probabilities although the "
        'requests asked for them ({"logprobs": true, "top_logprobs": 0}): answers carry no confidence, so a '
        "confidence threshold (tau, --min-confidence) never routes a question"
    )

    def test_named_once_and_noted_in_the_report(self, tmp_path, caplog):
        evaluator = make_evaluator(tmp_path, strategies=["concatenation"])
        evaluator.generator_factory = NoLogprobsServer
        records = evaluator.run()
        assert evaluator.notes == [self.MESSAGE]
        assert caplog.text.count("returned no token log-probabilities") <= 1  # once per process: maybe earlier
        assert "secret" not in self.MESSAGE
        write_run_manifest(tmp_path, title="capitals", dataset="d.json", notes=evaluator.notes)
        write_run_manifest(tmp_path, title="capitals", dataset="d.json", notes=evaluator.notes)
        assert read_run_manifest(tmp_path)["notes"] == [self.MESSAGE]
        summary = write_report(records, tmp_path, title="capitals", notes=evaluator.notes)
        assert summary["notes"] == [self.MESSAGE]
        assert (tmp_path / TABLE_FILE).read_text().startswith(f"capitals\n\nNote: {self.MESSAGE}\n\n| strategy")

    def test_nothing_to_say_when_none_were_asked_for_or_they_came(self):
        answer = GeneratedAnswer(data="Paris", query="q", documents=[], meta={"finish_reason": "stop"})
        assert missing_logprobs(MockChatGenerator(), [answer]) is None
        assert missing_logprobs(NoLogprobsServer(), []) is None
        with_logprobs = GeneratedAnswer(
            data="Paris", query="q", documents=[], meta={"finish_reason": "stop", "logprobs": {"content": []}}
        )
        assert missing_logprobs(NoLogprobsServer(), [with_logprobs]) is None
        voted = GeneratedAnswer(data="Paris", query="q", documents=[], meta={"votes": 3})
        assert missing_logprobs(NoLogprobsServer(), [voted]) is None
        assert missing_logprobs(NoLogprobsServer(), [answer]) == TestMissingLogprobs.MESSAGE


FORTY_QUESTIONS = [Question(f"q{i}", f"What is the capital of France, take {i}?", ("Paris",), False) for i in range(12)]


def evaluator(out: Path, response_fn, strategies=("concatenation",)) -> Evaluator:
    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    return Evaluator(
        EvalDataset("faults", DOCUMENTS, FORTY_QUESTIONS),
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
        # the strategy's one call failed: a failure, not an answer
        assert failed[0]["error"] == "1 of 1 LLM calls failed: llm: RuntimeError: the server went away"
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
        assert read_failures(again.out / RESULTS_FILE) == []
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

    def test_a_question_whose_every_call_failed_gets_a_failed_record_not_an_answer(self, tmp_path):
        def timeout(messages):
            if "take 2?" in messages[-1].text:
                raise TimeoutError("Request timed out.")
            return "Paris"

        evaluator(tmp_path, timeout, strategies=("post_fusion",)).run()
        (failure,) = read_failures(tmp_path / RESULTS_FILE)
        assert (failure.question_id, failure.prediction) == ("q2", "")
        assert failure.error == (
            "2 of 2 LLM calls failed: voter (index 0): TimeoutError: Request timed out.; voter (index 1): "
            f"TimeoutError: Request timed out. ({QUEUED_TIMEOUT_ADVICE})"
        )

    def test_a_clean_record_has_no_error_key(self, tmp_path):
        evaluator(tmp_path, fails_on()).run()
        line = (tmp_path / RESULTS_FILE).read_text().splitlines()[0]
        assert "error" not in json.loads(line)
        assert QuestionRecord.from_json(line).to_json() == line

    def test_a_refused_key_stops_the_run_at_once(self, tmp_path):
        response = httpx.Response(401, request=httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions"))
        refused = openai.AuthenticationError("Incorrect API key provided", response=response, body=None)
        with pytest.raises(BatchStoppedError, match=r"refused \(AuthenticationError\)") as raised:
            evaluator(tmp_path, fails_on(*range(12), error=refused)).run()
        assert [(failure.kind, failure.status) for failure in raised.value.failures] == [("key", 401)]
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
