"""
Falling back across models: the fallback rounds of concat_pf, pf_concat and cascade on `fallback_chat_generator`, the
first round judged by token log-probabilities, by the agreement of sampled answers or not at all, and the usage
reported per model. Two scripted generators stand for a small and a strong model.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable

import pytest
from haystack import Document, Pipeline
from haystack.dataclasses import ChatMessage

from haystack_fusion import FusionAnswerer, UnknownRouter
from haystack_fusion.backends import BackendConfig, fallback_chat_generator, fallback_config
from haystack_fusion.cli import _backends, _strategy_options, build_parser, main
from haystack_fusion.components import AbstainingChatGenerator
from haystack_fusion.llm import model_name
from haystack_fusion.serving.presentation import api_result, format_run
from haystack_fusion.serving.yaml import pipeline_yaml
from haystack_fusion.strategies import build_pipeline
from haystack_fusion.strategies.registry import FALLBACK_STRATEGIES, strategy_settings
from haystack_fusion.strategies.run import StrategyRun, strategy_run
from haystack_fusion.testing import ScriptedChatGenerator

DOCUMENTS = [
    Document(content="Paris is the capital of France."),
    Document(content="Rome is the capital of Italy."),
    Document(content="Bern is the capital of Switzerland."),
]

SURE, UNSURE, ABSTAINS = "capital of France", "capital of Italy", "capital of Switzerland"


class SmallModel:
    """A small model's replies by question: sure of France (every sample agrees), unsure of Italy (its samples
    disagree), abstaining on Switzerland. The first call of a prompt is the greedy one; the later ones are samples."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    def __call__(self, prompt: str) -> str:
        question = prompt.rsplit("Question:", 1)[-1]
        self.seen[prompt] += 1
        sample = self.seen[prompt] - 1
        if SURE in question:
            return "Paris"
        if UNSURE in question:
            return ["Rome", "Milan", "Turin", "Naples", "Rome"][sample % 5]
        return "unknown"


CITIES = {"France": "Paris", "Italy": "Rome", "Switzerland": "Bern"}


def strong_reply(prompt: str) -> str:
    """The strong model: the city of the question's country when its passage is in the prompt, else unknown."""
    shown, question = prompt.rsplit("Question:", 1)
    return next((city for country, city in CITIES.items() if country in question and city in shown), "unknown")


def models(reply: Callable[[str], str] | None = None) -> tuple[ScriptedChatGenerator, ScriptedChatGenerator]:
    small = ScriptedChatGenerator(reply=reply or SmallModel(), model="small")
    strong = ScriptedChatGenerator(reply=strong_reply, model="strong")
    return small, strong


def ask(pipeline: Pipeline, country: str) -> StrategyRun:
    """One question about the three passages, read as `run_strategy` reads a run."""
    question = f"What is the capital of {country}?"
    given = {"query": question, "documents": DOCUMENTS}
    data = {name: {s: given[s] for s in sockets if s in given} for name, sockets in pipeline.inputs().items()}
    outputs = pipeline.run(data, include_outputs_from={name for name, _ in pipeline.walk()})
    return strategy_run(pipeline, question, outputs)


class TestOnlyUnsureQuestionsReachTheStrongModel:
    @pytest.mark.parametrize("strategy", ["concat_pf", "cascade"])
    def test_agreement(self, strategy):
        small, strong = models()
        pipeline = build_pipeline(
            strategy,
            chat_generator=small,
            fallback_chat_generator=strong,
            confidence="agreement",
            agreement_samples=4,
            min_confidence=0.75,
        )
        sure = ask(pipeline, "France")
        assert strong.calls == 0  # the small model was sure: the strong one never ran
        assert sure.answer.data == "Paris"
        assert sure.evidence.fallback is False
        assert sure.answer.meta["confidence"] == 1.0
        assert sure.answer.meta["agreement_samples"] == 4
        assert small.calls == 5  # the greedy call and its 4 samples
        assert sure.usage_by_model == {"small": sure.usage}

        unsure = ask(pipeline, "Italy")
        assert unsure.evidence.fallback is True
        assert unsure.evidence.stages[0].reason == "confidence 0.25 < 0.75"  # 1 of 4 samples said Rome
        assert unsure.evidence.stages[0].confidence == 0.25  # kept for a replay at another tau
        assert unsure.answer.data == "Rome"
        assert strong.calls >= len(DOCUMENTS)  # post-fusion: one call per passage, on the strong model
        assert all("Question: What is the capital of France?" not in prompt for prompt in strong.prompts)
        assert set(unsure.usage_by_model) == {"small", "strong"}
        assert unsure.usage_by_model["small"].calls == 5
        assert unsure.usage_by_model["strong"].calls == strong.calls
        assert unsure.usage.calls == 5 + strong.calls

        before = strong.calls
        abstains = ask(pipeline, "Switzerland")
        assert abstains.evidence.stages[0].reason == "unknown answer"
        assert abstains.answer.data == "Bern"
        assert strong.calls > before

    def test_unknown_alone_falls_back_with_confidence_none(self):
        small, strong = models()
        pipeline = build_pipeline(
            "concat_pf", chat_generator=small, fallback_chat_generator=strong, confidence="none", min_confidence=1.0
        )
        assert ask(pipeline, "Italy").answer.data == "Rome"  # unsure, but no confidence is read: it answers
        assert small.calls == 1
        assert strong.calls == 0
        assert ask(pipeline, "Switzerland").answer.data == "Bern"
        assert strong.calls == len(DOCUMENTS)

    def test_logprobs_without_logprobs_falls_back_on_unknown_only(self):
        small, strong = models()
        pipeline = build_pipeline("concat_pf", chat_generator=small, fallback_chat_generator=strong, min_confidence=1)
        assert ask(pipeline, "Italy").answer.data == "Rome"
        assert strong.calls == 0

    def test_pf_concat_distils_on_the_strong_model(self):
        small, strong = models(reply=lambda prompt: "Rome" if "Rome" in prompt.rsplit("Question:", 1)[0] else "unknown")
        pipeline = build_pipeline("pf_concat", chat_generator=small, fallback_chat_generator=strong)
        run = ask(pipeline, "Italy")
        assert small.calls == len(DOCUMENTS)  # k post-fusion calls, then the distiller
        assert strong.calls == 1
        assert set(run.usage_by_model) == {"small", "strong"}

    def test_without_a_fallback_every_round_is_the_first_model(self):
        small, _ = models()
        pipeline = build_pipeline("concat_pf", chat_generator=small, confidence="agreement", min_confidence=0.75)
        run = ask(pipeline, "Italy")
        assert set(run.usage_by_model) == {"small"}
        assert run.evidence.fallback is True


class TestSettings:
    @pytest.mark.parametrize("strategy", ["concatenation", "post_fusion", "sure", "chain_of_note"])
    def test_fallback_only_for_strategies_with_fallback_rounds(self, strategy):
        small, strong = models()
        with pytest.raises(ValueError, match=r"fallback_chat_generator.*concat_pf, pf_concat, cascade"):
            build_pipeline(strategy, chat_generator=small, fallback_chat_generator=strong)

    def test_confidence_only_where_a_first_answer_is_judged(self):
        with pytest.raises(ValueError, match=r"`confidence` is for.*concat_pf"):
            build_pipeline("pf_concat", chat_generator=models()[0], confidence="agreement")

    @pytest.mark.parametrize(
        ("settings", "message"),
        [
            ({"confidence": "tokens"}, "`confidence` must be one of logprobs, agreement, none"),
            ({"agreement_samples": 0}, "`agreement_samples` must be an integer >= 1"),
            ({"agreement_samples": 2.5}, "`agreement_samples` must be an integer >= 1"),
            ({"agreement_temperature": 0}, "`agreement_temperature` must be above 0"),
        ],
    )
    def test_bad_settings_are_named(self, settings, message):
        with pytest.raises(ValueError, match=message):
            build_pipeline("concat_pf", chat_generator=models()[0], **settings)

    def test_fallback_strategies(self):
        assert FALLBACK_STRATEGIES == ("concat_pf", "pf_concat", "cascade")

    def test_cascade_verifies_on_the_strong_model_unless_a_verifier_is_given(self):
        small, strong = models()
        pipeline = build_pipeline("cascade", chat_generator=small, fallback_chat_generator=strong)
        names = {name: model_name(pipeline.get_component(name)) for name in ("llm", "voter", "summarizer", "verifier")}
        assert names == {"llm": "small", "voter": "strong", "summarizer": "strong", "verifier": "strong"}
        verifier = ScriptedChatGenerator(model="verifier")
        pipeline = build_pipeline(
            "cascade", chat_generator=small, fallback_chat_generator=strong, verifier_chat_generator=verifier
        )
        assert model_name(pipeline.get_component("verifier")) == "verifier"

    def test_yaml_round_trip_keeps_both_models(self):
        small, strong = models(reply=lambda prompt: "Paris")
        small.reply, strong.reply = "Paris", "Rome"  # serializable replies
        pipeline = build_pipeline(
            "cascade", chat_generator=small, fallback_chat_generator=strong, confidence="agreement", agreement_samples=3
        )
        loaded = Pipeline.loads(pipeline.dumps())
        assert loaded == pipeline
        assert model_name(loaded.get_component("voter")) == "strong"
        assert loaded.get_component("llm").samples == 3
        assert loaded.get_component("router").confidence == "agreement"

    def test_fusion_answerer_carries_the_fallback(self):
        small, strong = ScriptedChatGenerator("unknown", model="small"), ScriptedChatGenerator("Rome", model="strong")
        answerer = FusionAnswerer(strategy="concat_pf", chat_generator=small, fallback_chat_generator=strong)
        data = answerer.to_dict()
        assert data["init_parameters"]["fallback_chat_generator"]["init_parameters"]["model"] == "strong"
        again = FusionAnswerer.from_dict(copy.deepcopy(data))
        assert again.to_dict() == data
        result = again.run(query="What is the capital of Italy?", documents=DOCUMENTS)
        assert result["answers"][0].data == "Rome"


class TestAgreement:
    def test_abstaining_generator_samples_after_a_reply(self):
        small = ScriptedChatGenerator(["Rome", "Milan", "Rome"], generation_kwargs={})
        llm = AbstainingChatGenerator(chat_generator=small, samples=2)
        result = llm.run(messages=[ChatMessage.from_user("Capital of Italy?")])
        first, *samples = [reply.text for reply in result["replies"]]
        assert (first, sorted(samples)) == ("Rome", ["Milan", "Rome"])  # the two samples are made concurrently
        assert small.kwargs[0] is None
        assert small.kwargs[1] == small.kwargs[2] == {"temperature": 0.7}
        assert result["meta"]["usage"]["calls"] == 3
        assert result["meta"]["usage"]["rounds"] == 2

    def test_no_samples_after_a_failed_call(self):
        small = ScriptedChatGenerator("Rome", fail_on="Italy")
        result = AbstainingChatGenerator(chat_generator=small, samples=3).run(messages=[ChatMessage.from_user("Italy")])
        assert result["replies"] == []
        assert small.calls == 1

    async def test_async_samples(self):
        small = ScriptedChatGenerator(["Rome", "Rome"])
        result = await AbstainingChatGenerator(chat_generator=small, samples=1).run_async(
            messages=[ChatMessage.from_user("Italy")]
        )
        assert len(result["replies"]) == 2

    def test_negative_samples(self):
        with pytest.raises(ValueError, match="`samples` must be at least 0"):
            AbstainingChatGenerator(chat_generator=ScriptedChatGenerator(), samples=-1)

    @pytest.mark.parametrize(
        ("samples", "confidence"), [(["Rome", "Rome"], 1.0), (["Rome", "the Rome."], 1.0), (["Milan", "Rome"], 0.5)]
    )
    def test_router_reads_the_share_of_agreeing_samples(self, samples, confidence):
        router = UnknownRouter(confidence="agreement", min_confidence=0.6)
        replies = [ChatMessage.from_assistant(text) for text in ["Rome", *samples]]
        result = router.run(replies=replies)
        branch = "known" if confidence >= 0.6 else "unknown"
        assert [reply.meta["confidence"] for reply in result[branch]] == [confidence]
        assert len(result[branch]) == 1

    def test_router_without_samples_has_no_confidence(self):
        result = UnknownRouter(confidence="agreement", min_confidence=0.9).run(
            replies=[ChatMessage.from_assistant("Rome")]
        )
        assert result["known"][0].meta["confidence"] is None

    def test_router_rejects_an_unknown_confidence(self):
        with pytest.raises(ValueError, match="`confidence` must be logprobs, agreement or none"):
            UnknownRouter(confidence="votes")  # type: ignore[arg-type]


class TestBackends:
    def test_fallback_config_takes_the_shared_settings_the_llm_takes(self):
        config = BackendConfig(
            llm="openai", model="small", api_base_url="http://127.0.0.1:8081/v1", timeout=5.0, max_retries=1,
            logprobs=True, fallback_llm="local",
        )  # fmt: skip
        fallback = fallback_config(config)
        assert fallback is not None
        assert (fallback.llm, fallback.model, fallback.api_base_url) == ("local", None, None)
        assert (fallback.timeout, fallback.max_retries, fallback.logprobs) == (None, None, False)
        assert fallback_config(BackendConfig()) is None
        assert config.llms_label() == (
            "openai small at http://127.0.0.1:8081/v1; fallback: embedded llama.cpp packaged gemma3 270M (Q4_K_M)"
        )

    def test_the_settings_variables_name_the_fallback(self):
        env = {
            "HAYSTACK_FUSION_FALLBACK_LLM": "openai",
            "HAYSTACK_FUSION_FALLBACK_MODEL": "strong",
            "HAYSTACK_FUSION_FALLBACK_API_BASE_URL": "http://127.0.0.1:8082/v1",
        }
        config = BackendConfig.from_env(env)
        generator = fallback_chat_generator(config)
        assert model_name(generator) == "strong"
        assert generator.api_base_url == "http://127.0.0.1:8082/v1"

    @pytest.mark.parametrize(
        ("settings", "message"),
        [
            ({"fallback_llm": "claude"}, "`fallback_llm` must be one of local, openai, ollama"),
            ({"fallback_model": "strong"}, "`fallback_model` and `fallback_api_base_url` need `fallback_llm`"),
        ],
    )
    def test_bad_fallback_settings(self, settings, message):
        with pytest.raises(ValueError, match=message):
            BackendConfig(**settings)

    def test_command_line_flags(self):
        args = build_parser().parse_args(
            ["ask", "Who?", "--llm", "openai", "--fallback-llm", "openai", "--fallback-model", "strong",
             "--fallback-api-base-url", "http://127.0.0.1:8082/v1", "--confidence", "agreement",
             "--agreement-samples", "3", "--agreement-temperature", "1.0"]
        )  # fmt: skip
        config = _backends(args)
        assert (config.fallback_llm, config.fallback_model) == ("openai", "strong")
        options = _strategy_options(args, config.llm)
        assert (options["confidence"], options["agreement_samples"], options["agreement_temperature"]) == (
            "agreement",
            3,
            1.0,
        )

    def test_strategy_settings_leave_out_what_a_strategy_does_not_take(self):
        settings = {"fallback_chat_generator": object(), "confidence": "agreement", "agreement_samples": 3, "top": 1}
        assert strategy_settings("cascade", settings) == settings
        assert strategy_settings("pf_concat", settings) == {
            "fallback_chat_generator": settings["fallback_chat_generator"],
            "top": 1,
        }
        assert strategy_settings("sure", settings) == {"top": 1}


def test_the_terminal_and_the_served_json_show_each_models_usage():
    small, strong = models()
    pipeline = build_pipeline(
        "concat_pf", chat_generator=small, fallback_chat_generator=strong, confidence="agreement", min_confidence=0.75
    )
    run = ask(pipeline, "Italy")
    assert "; small: 5 calls, 0 + 0 tokens; strong: 3 calls, 0 + 0 tokens" in format_run("Capital?", run)
    assert api_result(run)["usage_by_model"] == {model: used.to_dict() for model, used in run.usage_by_model.items()}
    assert "small" not in format_run("Capital?", ask(build_pipeline("concat_pf", chat_generator=small), "France"))


def test_the_yaml_of_a_fallback_strategy_names_both_models(tmp_path):
    config = BackendConfig(
        llm="openai", model="small", index_path=str(tmp_path / "index.json"), fallback_llm="openai",
        fallback_model="strong", fallback_api_base_url="http://127.0.0.1:8082/v1",
    )  # fmt: skip
    text = pipeline_yaml("cascade", config)
    loaded = Pipeline.loads(text)
    assert model_name(loaded.get_component("llm")) == "small"
    assert {model_name(loaded.get_component(name)) for name in ("voter", "summarizer", "verifier")} == {"strong"}
    assert "strong" not in pipeline_yaml("sure", config)  # no fallback rounds: the fallback LLM is left out


def test_pipelines_command_writes_the_fallback(tmp_path, capsys):
    assert main(["pipelines", "--out", str(tmp_path), "--fallback-llm", "openai"]) == 0
    assert "memory_bm25_local_to_openai" in capsys.readouterr().out
    cascade = Pipeline.loads((tmp_path / "yaml" / "cascade__memory_bm25_local_to_openai.yml").read_text())
    assert model_name(cascade.get_component("llm")) == "LocalChatGenerator"
    assert model_name(cascade.get_component("voter")) == "gpt-4o-mini"
