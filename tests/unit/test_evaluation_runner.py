"""The evaluation's passage settings, runner (resume, concurrency) and report, driven by MockChatGenerator."""

from __future__ import annotations

import json

import pytest
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.dataclasses import GeneratedAnswer
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.backends import missing_logprobs
from haystack_fusion.cli import main
from haystack_fusion.evaluation.passages import EvalRetriever, PassageSetting, arrange_passages
from haystack_fusion.evaluation.records import read_run_manifest, write_run_manifest
from haystack_fusion.evaluation.report import (
    NOISE_CHART,
    SUMMARY_FILE,
    TABLE_FILE,
    TOKENS_CHART,
    TOPK_CHART,
    markdown_table,
    summarize_runs,
    write_report,
)
from haystack_fusion.evaluation.runner import RESULTS_FILE, EvalConfig, Evaluator, read_records
from tests.unit.capitals_dataset import DATASET, DOCUMENTS, QUESTIONS, capital_from_prompt


def make_evaluator(tmp_path, **config) -> Evaluator:
    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    return Evaluator(
        DATASET,
        EvalConfig(**{"strategies": ["concatenation", "post_fusion"], "top_ks": [2], **config}),
        tmp_path,
        retriever_factory=lambda: InMemoryBM25Retriever(document_store=store),
        generator_factory=lambda: MockChatGenerator(response_fn=capital_from_prompt),
    )


class TestArrangePassages:
    retrieved = DOCUMENTS[1:4]  # berlin, madrid, rome: the gold "paris" is missed

    def test_none_keeps_retrieval(self):
        got = arrange_passages(self.retrieved, top_k=2, setting=PassageSetting(), question_id="q", gold=DOCUMENTS[0])
        assert [d.id for d in got] == ["berlin", "madrid"]

    def test_random_inserts_the_missed_gold_and_keeps_k(self):
        setting = PassageSetting(gold_passage="random", seed=3)
        got = arrange_passages(self.retrieved, top_k=3, setting=setting, question_id="q", gold=DOCUMENTS[0])
        assert len(got) == 3
        assert "paris" in [d.id for d in got]
        again = arrange_passages(self.retrieved, top_k=3, setting=setting, question_id="q", gold=DOCUMENTS[0])
        assert got == again  # seeded per question

    def test_random_leaves_a_retrieved_gold_alone(self):
        setting = PassageSetting(gold_passage="random")
        got = arrange_passages(self.retrieved, top_k=3, setting=setting, question_id="q", gold=DOCUMENTS[2])
        assert [d.id for d in got] == ["berlin", "madrid", "rome"]

    @pytest.mark.parametrize(("position", "index"), [("first", 0), ("last", -1)])
    def test_first_and_last_move_the_gold(self, position, index):
        setting = PassageSetting(gold_passage=position)
        got = arrange_passages(self.retrieved, top_k=3, setting=setting, question_id="q", gold=DOCUMENTS[2])
        assert got[index].id == "madrid"
        assert len(got) == 3

    def test_noise_ratio_mixes_relevant_and_irrelevant(self):
        retrieved = [DOCUMENTS[0], DOCUMENTS[5], DOCUMENTS[1], DOCUMENTS[2]]
        setting = PassageSetting(noise_ratio=0.5)
        got = arrange_passages(
            retrieved, top_k=2, setting=setting, question_id="q", answers=["Paris"], gold=None, corpus=DOCUMENTS
        )
        assert [d.id for d in got] == ["paris", "danube"]

    def test_full_noise_draws_from_the_corpus_when_retrieval_is_short(self):
        setting = PassageSetting(noise_ratio=1.0)
        got = arrange_passages(
            [DOCUMENTS[0]], top_k=3, setting=setting, question_id="q", answers=["Paris"], corpus=DOCUMENTS
        )
        assert len(got) == 3
        assert all("Paris" not in (d.content or "") for d in got)

    def test_closed_book_has_no_passages(self):
        setting = PassageSetting(closed_book=True)
        assert arrange_passages(self.retrieved, top_k=3, setting=setting, question_id="q") == []

    @pytest.mark.parametrize("kwargs", [{"gold_passage": "middle"}, {"noise_ratio": 1.5}])
    def test_invalid_settings(self, kwargs):
        with pytest.raises(ValueError, match="must be"):
            PassageSetting(**kwargs)


class TestEvalRetriever:
    def test_wraps_a_retriever(self):
        store = InMemoryDocumentStore()
        store.write_documents(DOCUMENTS)
        retriever = EvalRetriever(InMemoryBM25Retriever(store), setting=PassageSetting(gold_passage="first"), top_k=2)
        got = retriever.run(query="capital of Germany", question_id="q", answers=["Lisbon"], gold=DOCUMENTS[4])
        assert got["documents"][0].id == "lisbon"
        assert len(got["documents"]) == 2


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
        concurrent = make_evaluator(tmp_path / "b", concurrency=3).run()
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
        with pytest.raises(ValueError, match="`concurrency`"):
            EvalConfig(strategies=["concatenation"], concurrency=0)
        with pytest.raises(ValueError, match="`max_concurrency`"):
            EvalConfig(strategies=["concatenation"], max_concurrency=0)
        assert EvalConfig(strategies=["concatenation"]).max_concurrency is None


class TestReport:
    def test_writes_summary_table_and_charts(self, tmp_path):
        records = make_evaluator(tmp_path, top_ks=[1, 2]).run()
        summary = write_report(records, tmp_path, title="capitals")
        assert [(run["strategy"], run["top_k"]) for run in summary["runs"]] == [
            ("concatenation", 1),
            ("concatenation", 2),
            ("post_fusion", 1),
            ("post_fusion", 2),
        ]
        assert json.loads((tmp_path / "summary.json").read_text())["runs"][0]["questions"] == 3
        table = (tmp_path / TABLE_FILE).read_text()
        assert "| strategy | top-k | EM | F1 | %Unk | %NM |" in table
        assert "| concatenation | 1 | 100.0 [100.0, 100.0] |" in table
        assert "| concatenation | 2 | 50.0 [0.0, 100.0] |" in table  # the mock reads the first city of the context
        assert "| post_fusion | 2 | 100.0 [100.0, 100.0] |" in table  # one passage per call: no distraction
        assert (tmp_path / TOKENS_CHART).stat().st_size > 0
        assert (tmp_path / TOPK_CHART).stat().st_size > 0

    def test_rates_carry_bootstrap_intervals(self, tmp_path):
        records = make_evaluator(tmp_path).run()
        write_report(records, tmp_path, title="capitals")
        summary = json.loads((tmp_path / SUMMARY_FILE).read_text())
        assert summary["bootstrap"] == {"resamples": 1000, "confidence": 0.95, "seed": 0, "method": "percentile"}
        run = summary["runs"][0]
        assert (run["strategy"], run["em"], run["em_ci"]) == ("concatenation", 50.0, [0.0, 100.0])
        assert run["f1_ci"] == [0.0, 100.0]
        assert run["accuracy_ci"] == [0.0, 100.0]
        assert run["unknown_rate_ci"] == [0.0, 0.0]  # two answerable questions, neither answered unknown
        assert run["reject_rate_ci"] is None  # one unanswerable question: no interval
        assert "recall_at_k_ci" in run
        assert list(run)[list(run).index("em") + 1] == "em_ci"
        table = (tmp_path / TABLE_FILE).read_text()
        assert "1000 resamples of the questions, percentile method, seed 0 (paper 002, Appendix H)" in table

    def test_paired_difference_against_the_default_baseline(self, tmp_path):
        records = make_evaluator(tmp_path).run()
        summary = write_report(records, tmp_path, seed=3)
        assert summary["baseline"] == "concatenation"
        assert summary["bootstrap"]["seed"] == 3
        baseline, other = summary["runs"]
        assert "em_diff" not in baseline
        # post_fusion gets q1 and q2 right, concatenation only q1: differences 0 and 100 points per question.
        assert other["paired_questions"] == 2
        assert (other["em_diff"], other["em_diff_ci"]) == (50.0, [0.0, 100.0])
        assert other["f1_diff"] == 50.0
        assert other["diff_significant"] is False
        assert json.loads((tmp_path / SUMMARY_FILE).read_text())["runs"][1]["em_diff_ci"] == [0.0, 100.0]
        table = (tmp_path / TABLE_FILE).read_text()
        assert "Paired difference vs concatenation (answerable questions)" in table
        assert "| post_fusion | 2 | +50.0 [+0.0, +100.0] | +50.0 [+0.0, +100.0] | 2 |" in table

    def test_explicit_baseline_and_significance_marker(self, tmp_path):
        records = make_evaluator(tmp_path).run()
        runs = summarize_runs(records)
        runs[1].update(em_diff=80.0, em_diff_ci=[62.0, 96.0], f1_diff=1.0, f1_diff_ci=[-2.0, 4.0], paired_questions=50)
        table = markdown_table(runs, baseline="concatenation")
        assert "| post_fusion | 2 | +80.0 [+62.0, +96.0]* | +1.0 [-2.0, +4.0] | 50 |" in table
        assert "* marks a difference whose interval excludes 0" in table
        summary = write_report(records, tmp_path, baseline="post_fusion")
        assert summary["baseline"] == "post_fusion"
        assert summary["runs"][0]["em_diff"] == -50.0
        assert "em_diff" not in summary["runs"][1]

    def test_unknown_baseline(self, tmp_path):
        records = make_evaluator(tmp_path).run()
        with pytest.raises(ValueError, match=r"'sure' did not run.*concatenation, post_fusion"):
            write_report(records, tmp_path, baseline="sure")

    def test_without_concatenation_there_is_no_comparison(self, tmp_path):
        records = make_evaluator(tmp_path, strategies=["post_fusion"]).run()
        summary = write_report(records, tmp_path)
        assert summary["baseline"] is None
        assert "em_diff" not in summary["runs"][0]
        assert "Paired difference" not in (tmp_path / TABLE_FILE).read_text()

    def test_table_of_summaries_without_intervals(self, tmp_path):
        records = make_evaluator(tmp_path, strategies=["concatenation"]).run()
        plain = [{k: v for k, v in run.items() if not k.endswith("_ci")} for run in summarize_runs(records)]
        table = markdown_table(plain)
        assert "| concatenation | 2 | 50.0 | 50.0 | 0.0% |" in table
        assert "bootstrap" not in table

    def test_no_records(self, tmp_path):
        with pytest.raises(ValueError, match="no answered questions"):
            write_report([], tmp_path)

    def test_several_noise_ratios_in_one_table_and_chart(self, tmp_path):
        records = []
        for ratio in (0.0, 0.5):
            evaluator = make_evaluator(
                tmp_path / str(ratio), strategies=["concatenation"], setting=PassageSetting(noise_ratio=ratio)
            )
            records += evaluator.run()
        summary = write_report(records, tmp_path, title="noise")
        assert [run["setting"] for run in summary["runs"]] == ["retrieved, noise ratio 0", "retrieved, noise ratio 0.5"]
        table = (tmp_path / TABLE_FILE).read_text()
        assert "| strategy | setting | top-k |" in table
        assert "| concatenation | retrieved, noise ratio 0.5 |" in table
        assert (tmp_path / NOISE_CHART).stat().st_size > 0

    def test_report_command_merges_runs(self, tmp_path, capsys):
        make_evaluator(tmp_path / "a", strategies=["concatenation"]).run()
        make_evaluator(tmp_path / "b", strategies=["post_fusion"]).run()
        assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "both")]) == 0
        assert "| post_fusion |" in (tmp_path / "both" / TABLE_FILE).read_text()
        assert main(["report", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2


def NoLogprobsServer() -> MockChatGenerator:  # noqa: N802 - stands for a class
    """An OpenAI-compatible server asked for token log-probabilities that sends none (its replies: finish_reason)."""
    generator = MockChatGenerator(response_fn=capital_from_prompt)
    generator.generation_kwargs = {"logprobs": True, "top_logprobs": 0}  # type: ignore[attr-defined]
    generator.api_base_url = "http://user:secret@127.0.0.1:8080/v1"  # type: ignore[attr-defined]
    return generator


class TestMissingLogprobs:
    MESSAGE = (
        "the OpenAI-compatible server at http://127.0.0.1:8080/v1 returned no token log-probabilities although the "
        'requests asked for them ({"logprobs": true, "top_logprobs": 0}): answers carry no confidence, so a '
        "confidence threshold (tau, --min-confidence) never routes a question"
    )

    def test_named_once_and_noted_in_the_report(self, tmp_path, caplog):
        # without stop sequences: adding them copies the generator through to_dict / from_dict
        evaluator = make_evaluator(tmp_path, strategies=["concatenation"], strategy_options={"stop_sequences": False})
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
