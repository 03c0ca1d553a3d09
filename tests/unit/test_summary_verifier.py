import asyncio
from typing import Any

import pytest
from haystack import Document, component, default_from_dict, default_to_dict
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage

from haystack_fusion import SummaryVerifier
from haystack_fusion.failures import LLMCallsFailedError
from haystack_fusion.testing import ScriptedChatGenerator

QUERY = "What is the capital of France?"
CANDIDATES = ["Paris", "Lyon", "Nice"]
SUMMARIES = ["S-paris: Paris is the capital.", "S-lyon: Lyon is large.", "S-nice: Nice is sunny."]


def tag(text: str) -> str:
    return text.split(":", 1)[0]


def judge_generator(
    valid: set[str], prefer: dict[tuple[str, str], str] | None = None, fail_on: str = ""
) -> ScriptedChatGenerator:
    """
    Answers validity and ranking prompts from tables keyed by summary tag ("S-paris"); records the prompts.

    `valid`: tags judged True. `prefer`: (tag shown as Passage 1, tag shown as Passage 2) -> reply text; pairs not in
    the table get "Passage 1" (pure order bias).
    """
    preferences = prefer or {}

    def reply(prompt: str) -> str:
        if prompt.endswith("Choices: [True, False]. Answer:"):
            shown = tag(prompt.split("\n\nPassage: ", 1)[1])
            return " True" if shown in valid else " False"
        first = tag(prompt.split("Passage 1: ", 1)[1])
        second = tag(prompt.split("Passage 2: ", 1)[1])
        return preferences.get((first, second), "Passage 1")

    return ScriptedChatGenerator(reply, fail_on=fail_on, error="judge unavailable")


def verify(judge: Any, candidates=CANDIDATES[:2], summaries=SUMMARIES[:2], **kwargs: Any) -> list:
    return SummaryVerifier(chat_generator=judge, **kwargs).run(query=QUERY, candidates=candidates, summaries=summaries)[
        "answers"
    ]


class TestEquations:
    def test_agreeing_orders_and_validity(self):
        # Eq. 5: both orders prefer s_paris -> r = 1 and 0; Eq. 4: both valid -> scores 2 and 1.
        judge = judge_generator({"S-paris", "S-lyon"}, {("S-lyon", "S-paris"): "Passage 2"})
        answers = verify(judge)
        assert [a.data for a in answers] == ["Paris", "Lyon"]
        assert [(a.meta["validity"], a.meta["ranking"], a.meta["score"]) for a in answers] == [
            (1.0, 1.0, 2.0),
            (1.0, 0.0, 1.0),
        ]
        assert answers[0].meta["rationale"] == SUMMARIES[0]

    def test_validity_decides_against_ranking(self):
        # s_paris wins both rankings (r = 1) but is invalid (v = 0); s_lyon valid (v = 1, r = 0): tie 1 vs 1 ->
        # the earlier candidate (section 4.1).
        judge = judge_generator({"S-lyon"}, {("S-lyon", "S-paris"): "Passage 2"})
        answers = verify(judge)
        assert [a.meta["score"] for a in answers] == [1.0, 1.0]
        assert answers[0].data == "Paris"
        # Now s_lyon is valid and wins one order: r = 0.5 each, scores 0.5 vs 1.5.
        judge = judge_generator({"S-lyon"})
        answers = verify(judge)
        assert answers[0].data == "Lyon"
        assert (answers[0].meta["score"], answers[1].meta["score"]) == (1.5, 0.5)

    def test_order_bias_split_gives_half(self):
        judge = judge_generator({"S-paris", "S-lyon"})  # always "Passage 1": each order prefers the one shown first
        answers = verify(judge)
        assert [a.meta["ranking"] for a in answers] == [0.5, 0.5]
        assert answers[0].data == "Paris"  # tie -> earliest
        assert answers[0].meta["preferences"] == {"0,1": 1, "1,0": 1}

    def test_unreadable_ranking_gives_half(self):
        judge = judge_generator({"S-paris"}, {("S-paris", "S-lyon"): "Both are fine.", ("S-lyon", "S-paris"): "???"})
        answers = verify(judge)
        assert [a.meta["ranking"] for a in answers] == [0.5, 0.5]
        assert [a.data for a in answers] == ["Paris", "Lyon"]

    def test_three_candidates(self):
        # Rankings (Passage 1, Passage 2) -> reply; default "Passage 1".
        prefer = {
            ("S-lyon", "S-paris"): "Passage 2",  # paris beats lyon in both orders: r_pair(paris, lyon) = 1
            ("S-nice", "S-paris"): "Passage 1",  # paris vs nice split: 0.5 each
            ("S-paris", "S-nice"): "Passage 1",
            ("S-lyon", "S-nice"): "Passage 2",  # nice beats lyon in both orders
            ("S-nice", "S-lyon"): "Passage 1",
        }
        judge = judge_generator({"S-paris", "S-lyon", "S-nice"}, prefer)
        answers = verify(judge, CANDIDATES, SUMMARIES)
        by_candidate = {a.data: a.meta for a in answers}
        assert by_candidate["Paris"]["ranking"] == 1.5
        assert by_candidate["Lyon"]["ranking"] == 0.0
        assert by_candidate["Nice"]["ranking"] == 1.5
        assert [a.data for a in answers] == ["Paris", "Nice", "Lyon"]  # Paris and Nice tie at 2.5 -> earlier
        assert len(judge.prompts) == 3 + 6

    def test_rank_only_ablation(self):
        judge = judge_generator(set(), {("S-lyon", "S-paris"): "Passage 1", ("S-paris", "S-lyon"): "Passage 2"})
        answers = verify(judge, use_validity=False)
        assert answers[0].data == "Lyon"
        assert answers[0].meta["validity"] is None
        assert answers[0].meta["score"] == 1.0
        assert len(judge.prompts) == 2  # ranking only

    def test_single_candidate_needs_only_validity(self):
        judge = judge_generator({"S-paris"})
        answers = verify(judge, CANDIDATES[:1], SUMMARIES[:1])
        assert answers[0].meta["score"] == 1.0
        assert len(judge.prompts) == 1


class TestCalls:
    def test_k_plus_k_k_minus_1_calls_in_one_round(self):
        judge = judge_generator({"S-paris"})
        answers = verify(judge, CANDIDATES, SUMMARIES)
        usage = answers[0].meta["usage"]
        assert (usage["calls"], usage["rounds"]) == (3 + 3 * 2, 1)
        validity = [p for p in judge.prompts if p.endswith("[True, False]. Answer:")]
        ranking = [p for p in judge.prompts if "Target Question:" in p]
        assert (len(validity), len(ranking)) == (3, 6)
        assert all(p.startswith(f"Question: {QUERY}\n\nPrediction: ") for p in validity)

    def test_failed_calls_are_reported(self):
        judge = judge_generator({"S-paris", "S-lyon"}, fail_on="Prediction: Paris")
        answers = verify(judge)
        meta = answers[0].meta
        assert meta["usage"]["failed_calls"] == 1
        assert meta["failures"][0]["index"] == 0  # the first call: Paris's validity
        assert answers[0].data == "Lyon"  # failed validity counts as False; the ranking split 0.5 / 0.5

    def test_every_call_failed_raises_not_a_pick(self):
        judge = judge_generator({"S-paris", "S-lyon"}, fail_on=QUERY)
        with pytest.raises(LLMCallsFailedError) as raised:
            verify(judge)
        assert [failure.index for failure in raised.value.failures] == list(range(judge.calls))

    def test_empty_summary_is_not_sent(self):
        judge = judge_generator({"S-paris", "S-lyon"})
        answers = verify(judge, CANDIDATES[:2], ["", SUMMARIES[1]])
        assert answers[0].data == "Lyon"
        assert (answers[0].meta["ranking"], answers[1].meta["ranking"]) == (1.0, 0.0)
        assert len(judge.prompts) == 1  # only the validity of s_lyon

    def test_no_candidates_is_unknown_without_calls(self):
        judge = judge_generator(set())
        answers = verify(judge, [], [])
        assert [a.data for a in answers] == ["unknown"]
        assert judge.prompts == []

    def test_mismatched_lengths(self):
        with pytest.raises(ValueError, match="one summary per candidate"):
            verify(judge_generator(set()), CANDIDATES, SUMMARIES[:2])

    @pytest.mark.parametrize("query", ["", " \n"])
    def test_empty_query(self, query):
        with pytest.raises(ValueError, match="query"):
            SummaryVerifier(chat_generator=judge_generator(set())).run(query=query, candidates=["a"], summaries=["s"])

    def test_mock_chat_generator_in_call_order(self):
        # validity s_1, validity s_2, ranking (s_1, s_2), ranking (s_2, s_1)
        llm = MockChatGenerator(responses=["True", "False", "Passage 1", "Passage 2"])
        answers = verify(llm, max_concurrency=1)
        assert answers[0].data == "Paris"
        assert answers[0].meta["score"] == 2.0

    def test_run_async(self):
        judge = judge_generator({"S-lyon"})
        verifier = SummaryVerifier(chat_generator=judge)
        result = asyncio.run(verifier.run_async(query=QUERY, candidates=CANDIDATES[:2], summaries=SUMMARIES[:2]))
        assert result["answers"][0].data == "Lyon"


@component
class ReverseRanker:
    """A stand-in document ranker: reverses the documents and records the query it got."""

    def __init__(self) -> None:
        self.queries: list[str] = []

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ReverseRanker":
        return default_from_dict(cls, data)

    @component.output_types(documents=list[Document])
    def run(self, query: str, documents: list[Document]) -> dict[str, Any]:
        self.queries.append(query)
        return {"documents": list(reversed(documents))}


DOCS = [Document(id="a", content="a"), Document(id="b", content="b")]


class TestDocuments:
    def test_documents_attached_in_retrieval_order(self):
        verifier = SummaryVerifier(chat_generator=judge_generator({"S-paris"}))
        result = verifier.run(query=QUERY, candidates=CANDIDATES[:2], summaries=SUMMARIES[:2], documents=DOCS)
        assert [d.id for d in result["answers"][0].documents] == ["a", "b"]

    def test_winner_documents_reranked_by_its_summary(self):
        ranker = ReverseRanker()
        verifier = SummaryVerifier(chat_generator=judge_generator({"S-lyon"}), document_ranker=ranker)
        result = verifier.run(query=QUERY, candidates=CANDIDATES[:2], summaries=SUMMARIES[:2], documents=DOCS)
        winner, runner_up = result["answers"]
        assert ranker.queries == [SUMMARIES[1]]
        assert [d.id for d in winner.documents] == ["b", "a"]
        assert [d.id for d in runner_up.documents] == ["a", "b"]


class TestSerialization:
    def test_round_trip(self):
        verifier = SummaryVerifier(
            chat_generator=MockChatGenerator(responses=["True"]), use_validity=False, max_concurrency=2
        )
        data = verifier.to_dict()
        assert data["init_parameters"]["document_ranker"] is None
        assert SummaryVerifier.from_dict(verifier.to_dict()).to_dict() == data

    def test_invalid_concurrency(self):
        with pytest.raises(ValueError, match="max_concurrency"):
            SummaryVerifier(chat_generator=MockChatGenerator(responses=["True"]), max_concurrency=0)


def scored(text: str, *steps: tuple[str, float, dict[str, float]]) -> ChatMessage:
    """A reply whose meta carries OpenAI-style logprobs: (token, logprob, {alternative: logprob})."""
    content = [
        {
            "token": token,
            "logprob": logprob,
            "top_logprobs": [{"token": t, "logprob": lp} for t, lp in alternatives.items()],
        }
        for token, logprob, alternatives in steps
    ]
    return ChatMessage.from_assistant(text, meta={"logprobs": {"content": content}})


def p(x: float) -> float:
    import math

    return math.log(x)


class TestProbabilityScoring:
    def test_validity_and_ranking_from_probabilities(self):
        # validity s_1: P(True)=0.6, P(False)=0.2 -> 0.75; validity s_2: P(True)=0.3, P(False)=0.6 -> 1/3
        # ranking (s_1, s_2): P(1)=0.8, P(2)=0.2; ranking (s_2, s_1): P(1)=0.4, P(2)=0.6
        # r_pair(s_1, s_2) = mean(0.8, 0.6) = 0.7 -> r(s_1) = 0.7, r(s_2) = 0.3
        llm = MockChatGenerator(
            responses=[
                scored(" True", (" True", p(0.6), {" True": p(0.6), " False": p(0.2), " true": p(0.0001)})),
                scored(" False", (" False", p(0.6), {" False": p(0.6), " True": p(0.3)})),
                scored("Passage 1", ("Passage", p(0.9), {}), (" 1", p(0.8), {" 1": p(0.8), " 2": p(0.2)})),
                scored("Passage 2", ("Passage", p(0.9), {}), (" 2", p(0.6), {" 2": p(0.6), " 1": p(0.4)})),
            ]
        )
        answers = verify(llm, max_concurrency=1, scoring="probability")
        assert answers[0].data == "Paris"
        assert answers[0].meta["validity"] == pytest.approx((0.6 + 0.0001) / (0.8 + 0.0001))
        assert answers[1].meta["validity"] == pytest.approx(1 / 3)
        assert answers[0].meta["ranking"] == pytest.approx(0.7)
        assert answers[0].meta["preferences"] == {"0,1": pytest.approx(0.8), "1,0": pytest.approx(0.4)}
        assert answers[0].meta["scoring"] == "probability"
        assert answers[0].meta["scored_by"] == {"probability": 4, "text": 0}

    def test_replies_without_logprobs_fall_back_to_the_text(self):
        llm = MockChatGenerator(responses=["True", "False", "Passage 1", "Passage 2"])
        answers = verify(llm, max_concurrency=1, scoring="probability")
        assert answers[0].data == "Paris"
        assert answers[0].meta["score"] == 2.0
        assert answers[0].meta["scored_by"] == {"probability": 0, "text": 4}

    def test_text_scoring_ignores_logprobs(self):
        reply = scored(" True", (" True", p(0.5), {" True": p(0.5), " False": p(0.5)}))
        answers = verify(MockChatGenerator(responses=[reply]), candidates=["Paris"], summaries=["s"])
        assert answers[0].meta["validity"] == 1.0
        assert answers[0].meta["scored_by"] == {"probability": 0, "text": 1}

    @pytest.mark.parametrize(
        ("own", "scoring", "sent"),
        [
            ({"logprobs": True}, "probability", {"logprobs": True, "top_logprobs": 10}),
            ({"logprobs": True}, "text", None),
            ({}, "probability", None),  # a server not said to return them is not asked
            (None, "probability", None),  # nor a generator without settings
        ],
    )
    def test_asks_logprob_generators_for_logprobs(self, own, scoring, sent):
        generator = ScriptedChatGenerator("True", generation_kwargs=own)
        SummaryVerifier(chat_generator=generator, scoring=scoring).run(query="q", candidates=["Paris"], summaries=["s"])
        assert generator.kwargs == [sent]

    def test_invalid_scoring(self):
        with pytest.raises(ValueError, match="scoring"):
            SummaryVerifier(chat_generator=MockChatGenerator(responses=["x"]), scoring="logits")  # type: ignore[arg-type]

    def test_round_trip_keeps_scoring(self):
        verifier = SummaryVerifier(chat_generator=MockChatGenerator(responses=["x"]), scoring="probability")
        assert SummaryVerifier.from_dict(verifier.to_dict()).scoring == "probability"
