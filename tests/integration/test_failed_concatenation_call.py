"""
A concatenation call that fails after its retries falls back to post-fusion in `concat_pf` and `cascade`.

The real OpenAIChatGenerator against the test server (`tests.support.openai_server`), which answers every
request of a concatenation prompt with HTTP 500 (`PromptReplies(concatenation_fails=1.0)`: the openai client retries,
then raises InternalServerError), over the SQuAD 2.0 dev subset with in-memory BM25.
"""

from __future__ import annotations

import json
import os

import pytest
from haystack.components.generators.chat import OpenAIChatGenerator

from haystack_fusion.cli import EXIT_FAILED_QUESTIONS, main
from haystack_fusion.evaluation.records import RESULTS_FILE
from haystack_fusion.settings import SQUAD_VARIABLE
from haystack_fusion.strategies import build_pipeline, run_strategy
from haystack_fusion.testing import PromptReplies

MAX_RETRIES = 1
ANSWERS = ("Paris", "Lyon", "Marseille")
"""What the test server's replies answer (`PromptReplies`' default answers)."""


@pytest.fixture
def server(start_openai_server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")  # any key: the test server takes it
    return start_openai_server(reply=PromptReplies(ANSWERS, concatenation_unknown=0.0, concatenation_fails=1.0))


@pytest.mark.parametrize("strategy", ["concat_pf", "cascade"])
def test_the_fallback_answers_when_the_concatenation_call_fails(server, retriever, questions, strategy):
    llm = OpenAIChatGenerator(api_base_url=server.base_url, model="m", max_retries=MAX_RETRIES)
    pipeline = build_pipeline(strategy, retriever=retriever, chat_generator=llm)
    run = run_strategy(pipeline, questions[0].question)

    assert run.answer.data in ANSWERS
    (failure,) = run.failures
    assert (failure.component, failure.error_type, failure.status) == ("llm", "InternalServerError", 500)
    assert run.answer.meta["failures"] == [failure.to_dict()]
    stages = run.answer.meta["stages"]
    assert stages[0] == {"stage": "concatenation", "answered": False, "reason": "no reply"}
    assert stages[-1]["answered"] is True
    assert stages[-1]["stage"] in ("post_fusion", "sure")
    assert run.answer.meta["stage"] == stages[-1]["stage"]
    assert run.evidence.votes  # post-fusion ran and voted
    assert run.usage.failed_calls == 1
    assert run.usage.calls >= 1 + len(run.documents)
    # the server refused the concatenation call's request and each retry
    assert server.stats.refused == 1 + MAX_RETRIES


def test_eval_records_the_failed_call_with_the_fallback_answer(server, tmp_path):
    if not os.environ.get(SQUAD_VARIABLE):
        pytest.skip("$HAYSTACK_FUSION_SQUAD is unset and ../shared/data/squad2-dev-subset is not there")
    out = tmp_path / "run"
    args = ["eval", "--llm", "openai", "--api-base-url", server.base_url, "--model", "m", "--max-retries", "0"]
    args += ["--dataset", os.environ[SQUAD_VARIABLE], "--sample", "2", "--strategies", "concat_pf,cascade"]
    assert main([*args, "--out", str(out)]) == EXIT_FAILED_QUESTIONS  # a record with a failed call is retried
    lines = [json.loads(line) for line in (out / RESULTS_FILE).read_text().splitlines()]
    assert sorted(line["strategy"] for line in lines) == ["cascade", "cascade", "concat_pf", "concat_pf"]
    for line in lines:
        assert line["prediction"] in ANSWERS
        (failure,) = line["evidence"]["failures"]
        assert (failure["component"], failure["error_type"], failure["status"]) == ("llm", "InternalServerError", 500)
        assert line["error"].startswith("1 of ")
        assert "LLM calls failed: llm: InternalServerError: " in line["error"]
