"""
The process-wide limit on LLM calls in flight (`llm_calls.max_calls_in_flight`, `CallSlots`, `limit_calls`) and the
evaluation's failed records: what a batch does when calls fail.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.core.errors import PipelineRuntimeError
from haystack.dataclasses import ChatMessage
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.backends.errors import QUEUED_TIMEOUT_ADVICE
from haystack_fusion.evaluation.datasets import EvalDataset, EvalQuestion
from haystack_fusion.evaluation.records import RESULTS_FILE, QuestionRecord, read_failures, read_records
from haystack_fusion.evaluation.runner import FAILURES_IN_A_ROW_TO_STOP, BatchStoppedError, EvalConfig, Evaluator
from haystack_fusion.llm_calls import (
    MAX_CALLS_IN_FLIGHT_ENV,
    CallSlots,
    call_slot,
    calls_in_flight_limit,
    limit_calls,
    max_calls_in_flight,
    run_chat_calls,
)
from tests.unit.test_eval_runner import DOCUMENTS


class Gauge:
    """Counts calls under way and the most at once."""

    def __init__(self) -> None:
        self.now = self.most = 0
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.now -= 1


class TestCallSlots:
    def test_threads_share_the_slots(self):
        slots, gauge = CallSlots(2), Gauge()

        def work():
            slots.acquire()
            try:
                with gauge:
                    time.sleep(0.02)
            finally:
                slots.release()

        threads = [threading.Thread(target=work) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert gauge.most <= 2
        assert slots.taken == 0

    def test_event_loops_in_threads_share_the_slots(self):
        slots, gauge = CallSlots(3), Gauge()

        async def work():
            await slots.acquire_async()
            try:
                with gauge:
                    await asyncio.sleep(0.02)
            finally:
                slots.release()

        async def many():
            await asyncio.gather(*(work() for _ in range(6)))

        threads = [threading.Thread(target=asyncio.run, args=(many(),)) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert gauge.most <= 3
        assert slots.taken == 0

    def test_a_cancelled_waiter_gives_its_turn_back(self):
        slots = CallSlots(1)
        slots.acquire()

        async def cancelled_waiter():
            task = asyncio.create_task(slots.acquire_async())
            await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(cancelled_waiter())
        slots.release()
        assert slots.taken == 0
        asyncio.run(asyncio.wait_for(slots.acquire_async(), timeout=1))  # free at once
        assert slots.taken == 1


class TestProcessWideLimit:
    def test_the_block_overrides_the_environment(self, monkeypatch):
        monkeypatch.setenv(MAX_CALLS_IN_FLIGHT_ENV, "7")
        assert calls_in_flight_limit() == 7
        with max_calls_in_flight(2):
            assert calls_in_flight_limit() == 2
        assert calls_in_flight_limit() == 7
        monkeypatch.delenv(MAX_CALLS_IN_FLIGHT_ENV)
        assert calls_in_flight_limit() is None

    @pytest.mark.parametrize("value", ["0", "x", "-1"])
    def test_a_bad_environment_value_is_refused(self, monkeypatch, value):
        monkeypatch.setenv(MAX_CALLS_IN_FLIGHT_ENV, value)
        with pytest.raises(ValueError, match=MAX_CALLS_IN_FLIGHT_ENV):
            calls_in_flight_limit()

    def test_fan_outs_from_many_threads_keep_within_the_limit(self):
        gauge = Gauge()

        def slow(messages):
            with gauge:
                time.sleep(0.02)
            return "Paris"

        generator = MockChatGenerator(response_fn=slow)
        prompts = [[ChatMessage.from_user(f"question {i}")] for i in range(5)]
        with max_calls_in_flight(3):
            threads = [threading.Thread(target=run_chat_calls, args=(generator, prompts)) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert gauge.most <= 3

    def test_a_limited_generator_takes_one_slot_per_call_even_inside_a_fan_out(self):
        gauge = Gauge()

        def slow(messages):
            with gauge:
                time.sleep(0.01)
            return "Paris"

        generator = limit_calls(MockChatGenerator(response_fn=slow))
        assert limit_calls(generator) is generator
        prompts = [[ChatMessage.from_user(f"question {i}")] for i in range(4)]
        with max_calls_in_flight(1):  # a second slot for the nested call would never come
            result = run_chat_calls(generator, prompts)
            threads = [threading.Thread(target=generator.run, args=(prompts[0],)) for _ in range(3)]
            for thread in threads:
                thread.start()
            with call_slot():
                pass
            for thread in threads:
                thread.join()
        assert [reply.text for reply in result.replies] == ["Paris"] * 4
        assert gauge.most == 1
        assert type(generator) is MockChatGenerator  # the class (and so the fingerprint) is unchanged


QUESTIONS = [EvalQuestion(f"q{i}", f"What is the capital of France, take {i}?", ("Paris",), False) for i in range(12)]


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
            EvalQuestion(f"q{i}", f"What is the capital of France, take {i}?", ("Paris",), False) for i in range(30)
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
