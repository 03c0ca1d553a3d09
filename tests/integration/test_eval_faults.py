"""
Faults in a batch: the real `haystack-fusion eval --llm openai` on the SQuAD 2.0 subset (in-memory
BM25) against the fault-injecting test server (`tests.support.openai_server`), counting requests server-side.

The full run (200 questions x 4 strategies, and a 429 storm) is `research/benchmarks/faults.py`; these are its fast
forms.
"""

from __future__ import annotations

import json
import os

import pytest

from haystack_fusion.cli import EXIT_FAILED_QUESTIONS, main
from haystack_fusion.corpus import default_squad_path
from haystack_fusion.evaluation.records import RESULTS_FILE, read_failures, read_records
from haystack_fusion.settings import SQUAD_VARIABLE
from haystack_fusion.testing import PromptReplies
from tests.support.openai_server import FAULTS

STRATEGIES = ("concat_pf", "sure", "chain_of_note", "cascade")
QUESTIONS = 24
MAX_RETRIES = 2


def eval_args(server, out, *, strategies=STRATEGIES, questions=QUESTIONS, extra=()):
    if not os.environ.get(SQUAD_VARIABLE):
        pytest.skip("$HAYSTACK_FUSION_SQUAD is unset and ../shared/data/squad2-dev-subset is not there")
    dataset = default_squad_path()
    args = ["eval", "--llm", "openai", "--api-base-url", server.base_url, "--model", "m"]
    args += ["--max-retries", str(MAX_RETRIES), "--timeout", "1", "--dataset", str(dataset)]
    args += ["--sample", str(questions), "--strategies", ",".join(strategies), "--out", str(out), *extra]
    return args


def lines(out):
    return [json.loads(line) for line in (out / RESULTS_FILE).read_text().splitlines()]


def key(line):
    return (line["strategy"], line["top_k"], line["setting"], line["question_id"])


@pytest.fixture
def api_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")


def test_twenty_percent_faults_lose_nothing_and_a_rerun_retries_only_the_failed(
    start_openai_server, api_key, tmp_path, capsys
):
    server = start_openai_server(
        reply=PromptReplies(), fault_rate=0.2, seed=3, retry_after=0.05, hang_seconds=5, max_requests=20000
    )
    out = tmp_path / "run"
    status = main(eval_args(server, out))

    first = lines(out)
    keys = [key(line) for line in first]
    assert len(keys) == len(set(keys)) == len(STRATEGIES) * QUESTIONS  # every question has exactly one record
    failed = [line for line in first if "error" in line]
    assert failed, "seed 3 makes some questions fail: the test needs some"
    assert all(isinstance(line["error"], str) and line["error"].strip() for line in failed)
    assert status == EXIT_FAILED_QUESTIONS
    assert f"{len(failed)} question records failed" in capsys.readouterr().err

    stats = server.stats.snapshot()
    assert set(stats["faults"]) == set(FAULTS)  # every kind was injected
    assert stats["requests"] <= stats["first_attempts"] * (1 + MAX_RETRIES)
    assert stats["max_retry_count"] <= MAX_RETRIES

    # The same command again, on the same server (whose next draws differ): only the failed questions are asked.
    server.reset()
    main(eval_args(server, out))
    appended = lines(out)[len(first) :]
    assert sorted(key(line) for line in appended) == sorted(key(line) for line in failed)
    assert lines(out)[: len(first)] == first  # append-only
    assert server.stats.first_attempts < stats["first_attempts"] / 2

    # And once the faults stop, the batch completes: every question answered cleanly, none left to retry.
    server.fault_rate = 0.0
    assert main(eval_args(server, out)) == 0
    assert len(read_records(out / RESULTS_FILE)) == len(STRATEGIES) * QUESTIONS
    assert read_failures(out / RESULTS_FILE) == []


@pytest.mark.parametrize("limit", [None, 3])
def test_a_429_storm_slows_the_run_and_does_not_fail_it(start_openai_server, api_key, tmp_path, limit):
    """A server that takes 3 requests at once (429 beyond, with Retry-After): the process-wide limit keeps within it."""
    server = start_openai_server(reply=PromptReplies(concatenation_unknown=1.0), latency=0.1, capacity=3)
    extra = ["--parallel-questions", "4", "--max-retries", "0"]
    extra += ["--max-calls-in-flight", str(limit)] if limit else []
    out = tmp_path / "run"
    status = main(eval_args(server, out, strategies=("concat_pf",), questions=12, extra=extra))
    stats = server.stats.snapshot()
    if limit is None:  # 4 questions x 5 post-fusion calls at once: throttled, and without retries some calls fail
        assert stats["throttled"] > 0
        assert stats["max_in_flight"] > 3
        # failed question records (a round whose every call failed raises); ten of them in a row stop the batch
        assert status in (EXIT_FAILED_QUESTIONS, 1)
        assert read_failures(out / RESULTS_FILE)
    else:
        assert stats["throttled"] == 0
        assert stats["max_in_flight"] <= limit
        assert status == 0
        assert len(read_records(out / RESULTS_FILE)) == 12


@pytest.mark.parametrize("strategy", ["concatenation", "concat_pf", "sure"])
def test_a_refused_key_stops_the_batch_with_one_line(start_openai_server, tmp_path, capsys, monkeypatch, strategy):
    """
    The 401 is raised by concatenation's pipeline and by concat_pf's first call (a refused key is no reason to fall
    back: every call would be refused), and SuRe's calls abstain: either way one line, exit 1, no key, no record.
    """
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong-key-0000000000009876")
    server = start_openai_server(reply=PromptReplies(), api_key="sk-right-key")
    out = tmp_path / "run"
    assert main(eval_args(server, out, strategies=(strategy,), questions=6)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("haystack-fusion: the OpenAI-compatible server at http://127.0.0.1:")
    assert "refused the API key in $OPENAI_API_KEY" in err[-1]
    assert "9876" not in "\n".join(err)
    assert read_failures(out / RESULTS_FILE) == []
    assert server.stats.requests <= 4  # stopped at the first refusal (questions under way at once finish theirs)


@pytest.mark.parametrize("strategy", ["concat_pf", "sure"])
def test_a_server_that_is_down_stops_the_batch_after_ten_questions(api_key, tmp_path, capsys, strategy):
    class Closed:
        base_url = "http://127.0.0.1:9/v1"  # the discard port: nothing listens

    out = tmp_path / "run"
    args = eval_args(Closed(), out, strategies=(strategy,), questions=30, extra=["--parallel-questions", "1"])
    args[args.index("--max-retries") + 1] = "0"
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(
        "haystack-fusion: cannot connect to the OpenAI-compatible server at http://127.0.0.1:9/v1"
    )
    assert len(read_failures(out / RESULTS_FILE)) == 10
