import json
from typing import Any

import pytest
from haystack import Pipeline
from haystack.components.generators.chat import MockChatGenerator
from haystack.core.errors import PipelineRuntimeError
from haystack.dataclasses import ChatMessage, GeneratedAnswer

import haystack_fusion  # noqa: F401  (allowlists the package for deserialization)
from haystack_fusion.failures import CallFailure, LLMCallsFailedError
from haystack_fusion.strategies import (
    STRATEGIES,
    StrategyRun,
    get_strategy,
    run_strategy,
    strategy_run,
)
from haystack_fusion.testing import ScriptedChatGenerator
from tests.unit.scripted_pipelines import (
    DISTILLER_START,
    QUERY,
    answer_from_context,
    answer_of,
    concatenation_fails,
    live_passages,
    make_pipeline,
    recording_generator,
    sure_reply,
    unknown_for_concatenation,
)


class TestRunStrategy:
    @pytest.mark.parametrize(
        ("name", "calls"),
        [
            ("concatenation", 1),
            ("post_fusion", 3),
            ("pruning", 1),
            ("summary_cot", 1),
            ("concat_pf", 1),
            ("pf_concat", 4),
            ("cascade", 1),
            ("base", 1),
            ("sure", 1 + 2 + 2 + 2),
            ("sure_rank_only", 1 + 2 + 2),
            ("sure_sum_all", 1 + 2 + 1),
            ("mcq", 2),
            ("generic_summary", 2),
            ("chain_of_note", 1),
            ("chain_of_note_per_document", 3 + 1),
        ],
    )
    def test_end_to_end(self, name, calls):
        pipeline = make_pipeline(name, MockChatGenerator(response_fn=answer_from_context))
        run = run_strategy(pipeline, QUERY)
        assert isinstance(run, StrategyRun)
        assert isinstance(run.answer, GeneratedAnswer)
        assert run.answer.data == "Paris"
        assert run.answer.query == QUERY
        assert run.answers[0] is run.answer
        assert len(run.documents) == 3
        assert run.documents[0].id == "paris"
        assert run.usage.calls == calls
        assert run.usage.failed_calls == 0
        assert run.usage.prompt_tokens > 0
        assert run.seconds >= 0
        assert "retriever" in run.evidence.components_run
        assert get_strategy(name).answer_component in run.evidence.components_run

    def test_to_dict_is_the_json_of_ask(self):
        run = run_strategy(make_pipeline("post_fusion", MockChatGenerator(response_fn=answer_from_context)), QUERY)
        result = json.loads(json.dumps(run.to_dict(), default=str))
        assert (result["question"], result["answer"], result["strategy"]) == (QUERY, "Paris", "post_fusion")
        assert result["evidence"]["votes"] == run.evidence.votes
        assert [source["id"] for source in result["sources"]] == [d.id for d in run.documents]
        assert (result["usage"]["calls"], result["seconds"]) == (3, run.seconds)

    @pytest.mark.parametrize("name", list(STRATEGIES))
    def test_top_k_override(self, name):
        pipeline = make_pipeline(name, MockChatGenerator(response_fn=answer_from_context))
        run = run_strategy(pipeline, QUERY, top_k=5)
        assert len(run.documents) == 5
        assert run.answer.data == "Paris"

    @pytest.mark.parametrize("name", list(STRATEGIES))
    def test_no_answer_in_passages(self, name):
        pipeline = make_pipeline(name, MockChatGenerator(response_fn=answer_from_context))
        run = run_strategy(pipeline, "How high is Mount Everest?", top_k=1)
        assert [document.id for document in run.documents] == ["everest"]
        assert run.answer.data == "unknown"

    def test_post_fusion_evidence(self):
        pipeline = make_pipeline("post_fusion", MockChatGenerator(response_fn=answer_from_context), top_k=5)
        run = run_strategy(pipeline, QUERY)
        assert run.evidence.votes == {"paris": 2, "lyon": 1}
        assert run.evidence.candidates == ["Paris", "Lyon"]
        assert run.evidence.fallback is None
        assert run.usage.calls == 5
        assert run.usage.rounds == 1

    @pytest.mark.parametrize("k", [2, 3])
    def test_sure_calls_and_rounds(self, k):
        """1 + K + K + K(K-1) calls in 3 dependent rounds (Kim et al., Algorithm 1)."""
        generator = recording_generator()
        pipeline = make_pipeline("sure", generator, num_candidates=k)
        run = run_strategy(pipeline, QUERY)
        assert run.usage.calls == len(generator.prompts)
        # the mock gives two candidates whatever K is asked for
        candidates = len(run.evidence.candidates)
        assert candidates == 2
        assert run.usage.calls == 1 + candidates + candidates + candidates * (candidates - 1)
        assert run.usage.rounds == 3
        assert f"provide {['two', 'three'][k - 2]} correct candidates" in generator.prompts[0]

    def test_sure_evidence_and_rationale(self):
        pipeline = make_pipeline("sure", MockChatGenerator(response_fn=answer_from_context))
        run = run_strategy(pipeline, QUERY)
        assert run.answer.data == "Paris"
        assert run.answer.meta["rationale"] == "Paris is the capital of France."
        assert run.evidence.candidates == ["Paris", "Lyon"]
        assert run.evidence.to_dict()["summaries"] == ["Paris is the capital of France.", "Lyon is a French city."]
        assert run.evidence.to_dict()["scores"][0] == {
            "candidate_index": 0,
            "validity": 1.0,
            "ranking": 1.0,
            "score": 2.0,
        }
        assert [d.id for d in run.answer.documents] == [d.id for d in run.documents]

    def test_sure_with_a_separate_verifier(self):
        """Kim et al., Table 10: candidates and summaries by one LLM, validity and ranking by another."""
        writer, judge = recording_generator(), recording_generator()
        pipeline = make_pipeline("sure", writer, verifier_chat_generator=judge)
        run = run_strategy(pipeline, QUERY)
        assert (len(writer.prompts), len(judge.prompts)) == (3, 4)
        assert all("Target Question:" in p or p.endswith("[True, False]. Answer:") for p in judge.prompts)
        assert run.usage.calls == 7
        assert Pipeline.loads(pipeline.dumps(), allowed_modules=["tests.unit.scripted_pipelines"]) == pipeline

    @pytest.mark.parametrize(("name", "rounds"), [("chain_of_note", 1), ("chain_of_note_per_document", 2)])
    def test_chain_of_note_evidence(self, name, rounds):
        pipeline = make_pipeline(name, MockChatGenerator(response_fn=answer_from_context))
        run = run_strategy(pipeline, QUERY)
        assert run.answer.data == "Paris"
        assert run.evidence.to_dict()["answer_source"] == "passages"
        assert [note["document_id"] for note in run.evidence.to_dict()["notes"]] == [d.id for d in run.documents]
        assert run.evidence.to_dict()["notes"][0]["relevance"] == "direct"
        assert run.usage.rounds == rounds
        assert [d.id for d in run.answer.documents] == ["paris"]

    def test_post_fusion_samples(self):
        pipeline = make_pipeline(
            "post_fusion", MockChatGenerator(response_fn=answer_from_context), samples_per_passage=2
        )
        run = run_strategy(pipeline, QUERY)
        assert run.usage.calls == 6
        expected: dict[str, int] = {}
        for document in run.documents:
            answer = answer_of(document.content)
            if answer != "unknown":
                expected[answer.lower()] = expected.get(answer.lower(), 0) + 2
        assert run.evidence.votes == expected
        assert run.answer.data == "Paris"

    def test_concat_pf_known_needs_one_call(self):
        pipeline = make_pipeline("concat_pf", MockChatGenerator(response_fn=answer_from_context))
        run = run_strategy(pipeline, QUERY)
        assert run.answer.data == "Paris"
        assert run.evidence.fallback is False
        assert run.usage.calls == 1
        assert run.usage.rounds == 1
        assert "voter" not in run.evidence.components_run
        assert run.evidence.votes is None

    def test_concat_pf_unknown_falls_back_to_post_fusion(self):
        pipeline = make_pipeline("concat_pf", MockChatGenerator(response_fn=unknown_for_concatenation), top_k=5)
        run = run_strategy(pipeline, QUERY)
        assert run.evidence.fallback is True
        assert "voter" in run.evidence.components_run
        assert "answer_builder" not in run.evidence.components_run
        assert run.answer.data == "Paris"
        assert run.answer.meta["strategy"] == "post_fusion"
        assert run.answer.meta["votes"] == {"paris": 2, "lyon": 1}
        assert run.evidence.votes == {"paris": 2, "lyon": 1}
        assert [answer.data for answer in run.answers] == ["Paris", "Lyon"]

    def test_concat_pf_fallback_usage(self):
        k = 5
        pipeline = make_pipeline("concat_pf", MockChatGenerator(response_fn=unknown_for_concatenation), top_k=k)
        run = run_strategy(pipeline, QUERY)
        assert run.evidence.fallback is True
        assert run.usage.calls == 1 + k
        assert run.usage.rounds == 2

    def test_concat_pf_fallback_with_unknown_everywhere(self):
        pipeline = make_pipeline("concat_pf", MockChatGenerator(responses="unknown"))
        run = run_strategy(pipeline, QUERY)
        assert run.evidence.fallback is True
        assert run.answer.data == "unknown"

    def test_cascade_concatenation_answers(self):
        pipeline = make_pipeline("cascade", MockChatGenerator(response_fn=answer_from_context))
        run = run_strategy(pipeline, QUERY)
        assert run.answer.data == "Paris"
        assert run.answer.meta["stage"] == "concatenation"
        assert run.evidence.to_dict()["stages"] == [{"stage": "concatenation", "answered": True}]

    def test_cascade_clear_vote_answers_at_post_fusion(self):
        pipeline = make_pipeline("cascade", MockChatGenerator(response_fn=unknown_for_concatenation), top_k=5)
        run = run_strategy(pipeline, QUERY)
        assert run.answer.data == "Paris"
        assert run.answer.meta["stages"] == [
            {"stage": "concatenation", "answered": False, "reason": "unknown answer"},
            {"stage": "post_fusion", "answered": True},
        ]
        assert run.usage.calls == 1 + 5
        assert "verifier" not in run.evidence.components_run

    def test_cascade_split_vote_is_verified_from_each_candidates_passages(self):
        def respond(messages: list[ChatMessage]) -> str:
            prompt = messages[-1].text
            return unknown_for_concatenation(messages) if sure_reply(prompt) is None else answer_from_context(messages)

        llm = MockChatGenerator(response_fn=respond)
        pipeline = make_pipeline("cascade", llm, top_k=3, min_vote_share=0.9)
        run = run_strategy(pipeline, QUERY)
        assert run.answer.data == "Paris"
        assert run.answer.meta["stage"] == "sure"
        assert run.answer.meta["stages"][1] == {
            "stage": "post_fusion",
            "answered": False,
            "reason": "tie at the top",
        }
        assert run.usage.calls == 1 + 3 + 2 + 2 + 2
        assert run.usage.rounds == 4
        assert run.answer.meta["scoring"] == "probability"

    def test_concat_pf_min_confidence_falls_back_on_an_unsure_answer(self):
        unsure = ChatMessage.from_assistant(
            "Lyon", meta={"logprobs": {"content": [{"token": "Lyon", "logprob": -3.0}]}}
        )

        def respond(messages: list[ChatMessage]) -> Any:
            return unsure if messages[-1].text.count("<passage ") > 1 else unknown_for_concatenation(messages)

        pipeline = make_pipeline("concat_pf", MockChatGenerator(response_fn=respond), top_k=3, min_confidence=0.2)
        run = run_strategy(pipeline, QUERY)
        assert run.answer.data == "Paris"
        assert run.answer.meta["stages"][0] == {
            "stage": "concatenation",
            "confidence": pytest.approx(0.0498, abs=1e-3),  # exp(-3), kept so a replay can move tau
            "answered": False,
            "reason": "confidence 0.05 < 0.2",
        }
        # off by default: the paper's concat_pf keeps the unsure answer
        default = run_strategy(make_pipeline("concat_pf", MockChatGenerator(response_fn=respond)), QUERY)
        assert default.answer.data == "Lyon"
        assert default.answer.meta["confidence"] == pytest.approx(0.0498, abs=1e-3)
        assert default.evidence.confidence == default.answer.meta["confidence"]

    @pytest.mark.parametrize("name", ["concat_pf", "cascade"])
    def test_a_failed_concatenation_call_falls_back_to_post_fusion(self, name):
        generator = concatenation_fails()
        run = run_strategy(make_pipeline(name, generator, top_k=5), QUERY)
        assert run.answer.data == "Paris"
        assert run.answer.meta["votes"] == {"paris": 2, "lyon": 1}
        failure = CallFailure("failing", "RuntimeError", "backend exploded", component="llm")
        assert run.failures == [failure]
        assert run.answer.meta["failures"] == [failure.to_dict()]
        assert run.answers[0] is run.answer
        assert run.evidence.fallback is True
        assert run.evidence.to_dict()["stages"] == [
            {"stage": "concatenation", "answered": False, "reason": "no reply"},
            {"stage": "post_fusion", "answered": True},
        ]
        assert generator.calls == 1 + 5
        assert run.usage.calls == 1 + 5
        assert run.usage.failed_calls == 1
        assert run.usage.rounds == 2

    def test_the_answer_lists_the_failed_calls_of_every_stage(self):
        generator = concatenation_fails(passages=("Lyon is the third-largest city",))
        run = run_strategy(make_pipeline("concat_pf", generator), QUERY)
        assert run.answer.data == "Paris"
        assert [(failure["component"], failure["index"]) for failure in run.answer.meta["failures"]] == [
            ("llm", None),
            ("voter", 2),
        ]
        assert run.evidence.to_dict()["failures"] == run.answer.meta["failures"]
        assert run.usage.failed_calls == 2

    def test_a_failed_concatenation_call_fails_the_concatenation_strategy(self):
        pipeline = make_pipeline("concatenation", concatenation_fails())
        with pytest.raises(LLMCallsFailedError) as raised:
            run_strategy(pipeline, QUERY)
        assert raised.value.failures == [CallFailure("failing", "RuntimeError", "backend exploded", component="llm")]
        assert isinstance(raised.value.__cause__, PipelineRuntimeError)

    @pytest.mark.parametrize("name", ["concat_pf", "cascade"])
    def test_when_the_fallback_fails_too_the_run_raises_with_both_rounds_failures(self, name):
        generator = ScriptedChatGenerator("Paris", fail_on=lambda prompt: True)
        with pytest.raises(LLMCallsFailedError) as raised:
            run_strategy(make_pipeline(name, generator), QUERY)
        assert [(failure.component, failure.index) for failure in raised.value.failures] == [
            ("llm", None),
            ("voter", 0),
            ("voter", 1),
            ("voter", 2),
        ]
        assert str(raised.value) == (
            "every LLM call of PostFusionVoter 'voter' (after 1 failed call of earlier rounds) failed (4 failed "
            "calls): RuntimeError: backend exploded"
        )

    def test_pf_concat_distiller_prompt(self):
        generator = recording_generator()
        pipeline = make_pipeline("pf_concat", generator, top_k=5)
        run = run_strategy(pipeline, QUERY)
        distiller_prompts = [prompt for prompt in generator.prompts if prompt.startswith(DISTILLER_START)]
        assert len(distiller_prompts) == 1
        assert len(generator.prompts) == 6  # 5 post-fusion calls, then the distiller
        prompt = distiller_prompts[0]
        retrieved = {document.content: document for document in run.documents}
        answering = [document.content for document in run.documents if answer_of(document.content) != "unknown"]
        assert len(retrieved) == 5
        assert live_passages(prompt) == answering
        assert {retrieved[text].id for text in live_passages(prompt)} == {"paris", "eiffel", "lyon"}
        assert "Berlin" not in prompt
        assert "Everest" not in prompt
        assert f"Question: {QUERY}\nCandidate answers: (a) Paris (b) Lyon\nAnswer:" in prompt
        assert run.answer.data == "Paris"  # "(a) Paris (b) something else" read by the distiller pattern
        assert [document.content for document in run.answer.documents] == answering
        assert run.evidence.candidates == ["Paris", "Lyon"]
        assert run.usage.calls == 6
        assert run.usage.rounds == 2

    def test_pf_concat_all_unknown_skips_distiller(self):
        generator = recording_generator()
        pipeline = make_pipeline("pf_concat", generator, top_k=1)
        # Only the Everest passage is retrieved; post-fusion says unknown. A distiller call with an empty context
        # would get "unknown" from `answer_from_context` too, so also check that no such call was made.
        run = run_strategy(pipeline, "How high is Mount Everest?")
        assert run.answer.data == "unknown"
        assert [prompt for prompt in generator.prompts if prompt.startswith(DISTILLER_START)] == []
        assert run.usage.calls == 1

    def test_usage_counts_each_call_once(self):
        reply = ChatMessage.from_assistant("x", meta={"usage": {"prompt_tokens": 5, "completion_tokens": 1}})
        voter_answer = GeneratedAnswer(
            data="Paris",
            query=QUERY,
            documents=[],
            meta={"usage": {"prompt_tokens": 20, "completion_tokens": 2, "calls": 2, "failed_calls": 1, "rounds": 1}},
        )
        builder_answer = GeneratedAnswer(
            data="x", query=QUERY, documents=[], meta={"usage": {"prompt_tokens": 5}, "all_messages": [reply]}
        )
        usage = strategy_run(
            make_pipeline("concat_pf", MockChatGenerator(responses="x")),
            QUERY,
            {
                "llm": {"replies": [reply]},
                "voter": {"answers": [voter_answer]},
                "answer_builder": {"answers": [builder_answer]},
                "joiner": {"answers": [voter_answer]},  # passed on, not counted again
                "retriever": {"documents": []},
            },
        ).usage
        assert usage.to_dict() == {
            "prompt_tokens": 25,
            "completion_tokens": 3,
            "calls": 3,
            "failed_calls": 1,
            "rounds": 2,
        }

    @pytest.mark.parametrize(("name", "calls"), [("concatenation", 1), ("sure", 7), ("cascade", 1)])
    def test_cached_tokens_summed_when_reported(self, name, calls):
        def respond(messages: list[ChatMessage]) -> ChatMessage:
            usage = {"prompt_tokens": 100, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 60}}
            return ChatMessage.from_assistant(answer_from_context(messages), meta={"usage": usage})

        run = run_strategy(make_pipeline(name, MockChatGenerator(response_fn=respond)), QUERY)
        assert run.usage.calls == calls
        assert run.usage.prompt_tokens == 100 * calls
        assert run.usage.cached_tokens == 60 * calls

    def test_cached_tokens_absent_when_not_reported(self):
        run = run_strategy(make_pipeline("sure", MockChatGenerator(response_fn=answer_from_context)), QUERY)
        assert run.usage.cached_tokens is None

    @pytest.mark.parametrize("query", ["  ", ""])
    def test_empty_query_raises(self, query):
        pipeline = make_pipeline("concatenation", MockChatGenerator(responses="Paris"))
        with pytest.raises(ValueError, match="query"):
            run_strategy(pipeline, query)

    @pytest.mark.parametrize("metadata", [{}, {"strategy": "no_such_strategy"}])
    def test_a_pipeline_naming_no_registered_strategy_raises(self, metadata):
        pipeline = make_pipeline("concatenation", MockChatGenerator(responses="Paris"))
        pipeline.metadata = metadata
        with pytest.raises(ValueError, match="registered strategies"):
            run_strategy(pipeline, QUERY)

    def test_loaded_pipeline_runs(self):
        pipeline = make_pipeline("pf_concat", MockChatGenerator(response_fn=answer_from_context))
        loaded = Pipeline.loads(pipeline.dumps(), allowed_modules=[answer_from_context.__module__])
        # InMemoryDocumentStore instances with the same index share their documents.
        run = run_strategy(loaded, QUERY)
        assert len(run.documents) == 3
        assert run.answer.data == "Paris"
