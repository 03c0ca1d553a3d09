"""Overlap voting (issue 16, item 3) and the voter's answer checks: pure functions, then PostFusionVoter."""

import math
from typing import Any

import pytest
from haystack import Document, Pipeline
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage
from hypothesis import given, settings
from hypothesis import strategies as st

from haystack_fusion import PostFusionVoter
from haystack_fusion.answers import (
    DEFAULT_OVERLAP_THRESHOLD,
    VOTE_MODES,
    answers_agree,
    majority_vote,
    normalize_answer,
    overlap_vote,
    token_f1,
    vote_answers,
)
from haystack_fusion.evaluation import metrics
from haystack_fusion.evaluation.metrics import gold_in_pool
from haystack_fusion.validation import DEMONSTRATION, PASSAGE_MARKUP

ACRONYM = "2BP"
LONG_FORM = "2-bromopalmitic acid (2-BP)"
"""The issue's containment example: normalized, `2bp` is a token of `2bromopalmitic acid 2bp`."""

MARKUP = '<passage key="1c6071d9">'
DEMO = "1925"
"""A demonstration answer of the Figure 7 prompt (`prompts.examples.FORMAT_EXAMPLE_ANSWERS`)."""


def docs(n: int, content: str = "Some passage text {i}.") -> list[Document]:
    return [Document(id=f"d{i}", content=content.format(i=i)) for i in range(n)]


def voter_with(responses: list[Any], **kwargs: Any) -> PostFusionVoter:
    return PostFusionVoter(chat_generator=MockChatGenerator(responses=responses), max_concurrency=1, **kwargs)


class TestTokenF1:
    def test_one_copy_shared_with_the_metrics(self):
        assert metrics.token_f1 is token_f1
        assert not hasattr(metrics, "_token_f1")

    @pytest.mark.parametrize(
        ("a", "b", "expected"),
        [
            ("Paris", "paris.", 1.0),
            ("New York", "New Jersey", 0.5),
            ("Gaul", "Roman Gaul", 2 / 3),
            ("Battle of Trafalgar", "Battle of Britain", 2 / 3),
            ("Oslo", "Rome", 0.0),
            ("", "the", 1.0),
            ("", "Rome", 0.0),
        ],
    )
    def test_values_and_symmetry(self, a, b, expected):
        assert token_f1(a, b) == pytest.approx(expected)
        assert token_f1(b, a) == pytest.approx(expected)

    def test_metric_f1_is_the_best_over_golds(self):
        assert metrics.f1("New York", ["New Jersey", "York"]) == pytest.approx(2 / 3)


class TestAnswersAgree:
    def test_containment_of_an_acronym_in_its_long_form(self):
        assert normalize_answer(LONG_FORM).split() == ["2bromopalmitic", "acid", "2bp"]
        assert answers_agree(ACRONYM, LONG_FORM)
        assert answers_agree(LONG_FORM, ACRONYM)
        # containment agrees at any threshold, F1 alone would not
        assert token_f1(ACRONYM, LONG_FORM) == pytest.approx(0.5)
        assert answers_agree(ACRONYM, LONG_FORM, threshold=1.0)

    def test_containment_is_contiguous(self):
        # "new york" is not a run of "new jersey york" (F1 0.8), "jersey york" is
        assert not answers_agree("New York", "New Jersey York", threshold=0.9)
        assert answers_agree("Jersey York", "New Jersey York", threshold=0.9)

    @pytest.mark.parametrize(("a", "b"), [("New York", "New Jersey"), ("Battle of Trafalgar", "Battle of Britain")])
    def test_f1_threshold_edge(self, a, b):
        score = token_f1(a, b)
        assert answers_agree(a, b, threshold=score)
        assert not answers_agree(a, b, threshold=math.nextafter(score, 2.0))

    def test_default_threshold(self):
        assert DEFAULT_OVERLAP_THRESHOLD == 0.5
        assert answers_agree("New York", "New Jersey")  # F1 0.5, the documented cost of 0.5
        assert not answers_agree("New York", "York Minster cathedral")  # F1 0.4

    def test_equal_after_normalization_and_empty(self):
        assert answers_agree("The Paris.", "paris", threshold=1.0)
        assert answers_agree("", "the")
        assert not answers_agree("", "Rome")

    @pytest.mark.parametrize("threshold", [0, -0.1, 1.01, float("nan"), "0.5", True])
    def test_invalid_threshold(self, threshold):
        with pytest.raises(ValueError, match="overlap_threshold"):
            answers_agree("a", "b", threshold=threshold)


class TestOverlapVote:
    def test_containment_clusters_and_best_ranked_representative(self):
        result = overlap_vote([ACRONYM, LONG_FORM, "palmitate"])
        assert result.answer == ACRONYM
        assert result.votes == {"2bp": 2, "palmitate": 1}
        assert result.candidates == [ACRONYM, "palmitate"]
        assert result.clusters == {"2bp": ["2bp", "2bromopalmitic acid 2bp"], "palmitate": ["palmitate"]}
        assert result.best_rank == {"2bp": 0, "palmitate": 2}

    def test_representative_is_best_ranked_not_most_voted_member(self):
        result = overlap_vote(["Roman Gaul", "Gaul", "gaul.", "Lyon"])
        assert majority_vote(["Roman Gaul", "Gaul", "gaul.", "Lyon"]).answer == "Gaul"
        assert result.answer == "Roman Gaul"
        assert result.votes == {"roman gaul": 3, "lyon": 1}
        assert result.clusters == {"roman gaul": ["roman gaul", "gaul"], "lyon": ["lyon"]}

    def test_tie_goes_to_the_better_ranked_cluster(self):
        result = overlap_vote(["Lyon", "Gaul", "Roman Gaul", "Lyon city"])
        assert result.votes == {"lyon": 2, "gaul": 2}
        assert result.answer == "Lyon"

    def test_clusters_do_not_chain(self):
        # "red apple" ~ "apple pie" ~ "pie crust", but "red apple" and "pie crust" share nothing: greedy by rank
        # joins each answer to the first representative it agrees with, so the third starts its own cluster
        assert answers_agree("red apple", "apple pie")
        assert answers_agree("apple pie", "pie crust")
        result = overlap_vote(["red apple", "apple pie", "pie crust"])
        assert result.clusters == {"red apple": ["red apple", "apple pie"], "pie crust": ["pie crust"]}
        assert result.answer == "red apple"

    def test_abstentions_and_failures_do_not_vote(self):
        result = overlap_vote(["unknown", None, "I don't know", ACRONYM])
        assert result.votes == {"2bp": 1}
        assert result.answer == ACRONYM
        nothing = overlap_vote(["unknown", None])
        assert nothing.is_unknown
        assert nothing.answer == "unknown"
        assert nothing.clusters == {}

    def test_samples_share_a_rank(self):
        result = overlap_vote(["Oslo", "Roman Gaul", "Gaul", "Oslo"], ranks=[0, 0, 1, 1])
        assert result.votes == {"oslo": 2, "roman gaul": 2}
        assert result.answer == "Oslo"  # equal votes and ranks: the exact vote's order (first given)

    def test_deterministic(self):
        answers = ["Gaul", ACRONYM, "Roman Gaul", LONG_FORM, "unknown"]
        assert overlap_vote(answers) == overlap_vote(list(answers))

    def test_vote_answers_dispatches(self):
        answers = [ACRONYM, LONG_FORM]
        assert vote_answers(answers) == majority_vote(answers)
        assert vote_answers(answers, vote="overlap") == overlap_vote(answers)
        assert vote_answers(answers, vote="overlap", threshold=0.9) == overlap_vote(answers, threshold=0.9)
        assert VOTE_MODES == ("exact", "overlap")
        with pytest.raises(ValueError, match="`vote`"):
            vote_answers(answers, vote="fuzzy")

    def test_ranks_length_is_checked(self):
        with pytest.raises(ValueError, match="ranks"):
            overlap_vote(["a", "b"], ranks=[0])


WORDS = ["paris", "lyon", "gaul", "roman", "new", "york", "of", "2bp", "acid"]
PHRASES = st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join)
ANSWERS = st.lists(st.one_of(PHRASES, st.just("unknown"), st.none()), max_size=8)


class TestOverlapVoteProperties:
    @settings(max_examples=200, deadline=None)
    @given(ANSWERS, st.sampled_from([0.3, 0.5, 0.8, 1.0]))
    def test_clusters_partition_the_exact_vote(self, answers, threshold):
        exact = majority_vote(answers)
        result = overlap_vote(answers, threshold=threshold)
        assert result.clusters is not None
        members = [member for cluster in result.clusters.values() for member in cluster]
        assert sorted(members) == sorted(exact.votes)  # every exact key in exactly one cluster
        assert len(result.votes) <= len(exact.votes)  # never more clusters than exact keys
        assert sum(result.votes.values()) == sum(exact.votes.values())
        for representative, cluster in result.clusters.items():
            assert cluster[0] == representative
            assert result.votes[representative] == sum(exact.votes[m] for m in cluster)
            assert all(answers_agree(representative, member, threshold) for member in cluster)
            assert all(exact.best_rank[representative] <= exact.best_rank[member] for member in cluster)
        if exact.votes:
            assert max(result.votes.values()) >= max(exact.votes.values())
            assert normalize_answer(result.answer) == next(iter(result.votes))

    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.one_of(st.sampled_from(WORDS), st.just("unknown"), st.none()), max_size=8))
    def test_single_distinct_words_vote_as_exact(self, answers):
        # two different one-token answers have F1 0 and neither contains the other: overlap changes nothing
        exact = majority_vote(answers)
        result = overlap_vote(answers, threshold=1.0)
        assert (result.answer, result.votes, result.candidates, result.best_rank) == (
            exact.answer,
            exact.votes,
            exact.candidates,
            exact.best_rank,
        )

    @settings(max_examples=200, deadline=None)
    @given(ANSWERS, st.randoms(use_true_random=False))
    def test_passage_order_does_not_matter_given_ranks(self, answers, random):
        ranks = list(range(len(answers)))
        pairs = list(zip(answers, ranks, strict=True))
        random.shuffle(pairs)
        shuffled = overlap_vote([a for a, _ in pairs], [r for _, r in pairs])
        assert shuffled == overlap_vote(answers, ranks)


class TestGoldInPool:
    def test_exact_is_the_default(self):
        assert gold_in_pool(["Paris"], ["the paris"]) is True
        assert gold_in_pool([ACRONYM], [LONG_FORM]) is False
        assert gold_in_pool([ACRONYM], [LONG_FORM], vote="exact") is False

    def test_overlap_uses_the_voters_rule(self):
        assert gold_in_pool(["Lyon", ACRONYM], [LONG_FORM], vote="overlap") is True
        assert gold_in_pool(["New York"], ["New Jersey"], vote="overlap") is True
        assert gold_in_pool(["New York"], ["New Jersey"], vote="overlap", overlap_threshold=0.6) is False
        assert gold_in_pool([], [LONG_FORM], vote="overlap") is False
        assert gold_in_pool([ACRONYM], [], vote="overlap") is False

    def test_invalid_arguments(self):
        with pytest.raises(ValueError, match="`vote`"):
            gold_in_pool(["a"], ["a"], vote="fuzzy")
        with pytest.raises(ValueError, match="overlap_threshold"):
            gold_in_pool([], ["a"], vote="overlap", overlap_threshold=0)


class TestVoterOverlapMode:
    def test_defaults(self):
        voter = PostFusionVoter(chat_generator=MockChatGenerator(responses=["x"]))
        assert (voter.vote, voter.overlap_threshold, voter.answer_checks) == ("exact", DEFAULT_OVERLAP_THRESHOLD, True)
        params = voter.to_dict()["init_parameters"]
        assert (params["vote"], params["overlap_threshold"], params["answer_checks"]) == (
            "exact",
            DEFAULT_OVERLAP_THRESHOLD,
            True,
        )

    def test_to_dict_writes_the_vote_settings(self):
        params = voter_with(["x"], vote="overlap", overlap_threshold=0.8, answer_checks=False).to_dict()
        assert {k: params["init_parameters"][k] for k in ("vote", "overlap_threshold", "answer_checks")} == {
            "vote": "overlap",
            "overlap_threshold": 0.8,
            "answer_checks": False,
        }

    @pytest.mark.parametrize(
        "kwargs", [{}, {"vote": "overlap"}, {"vote": "overlap", "overlap_threshold": 0.75, "answer_checks": False}]
    )
    def test_from_dict_round_trip(self, kwargs):
        voter = voter_with([ACRONYM, LONG_FORM], **kwargs)
        restored = PostFusionVoter.from_dict(voter.to_dict())
        assert restored.to_dict() == voter.to_dict()
        assert (restored.vote, restored.overlap_threshold, restored.answer_checks) == (
            voter.vote,
            voter.overlap_threshold,
            voter.answer_checks,
        )

    def test_yaml_round_trip_in_pipeline(self):
        pipeline = Pipeline()
        pipeline.add_component("voter", voter_with(["x"], vote="overlap", overlap_threshold=0.6))
        assert Pipeline.loads(pipeline.dumps()) == pipeline

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"vote": "fuzzy"}, "`vote`"),
            ({"vote": None}, "`vote`"),
            ({"overlap_threshold": 0}, "overlap_threshold"),
            ({"overlap_threshold": 1.5}, "overlap_threshold"),
        ],
    )
    def test_invalid_params(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            voter_with(["x"], **kwargs)

    def test_overlap_run(self):
        documents = docs(4)
        voter = voter_with([ACRONYM, "palmitate", LONG_FORM, "unknown"], vote="overlap")
        result = voter.run(query="Q?", documents=documents)
        winner = result["answers"][0]
        assert winner.data == ACRONYM
        assert winner.meta["votes"] == {"2bp": 2, "palmitate": 1}
        assert winner.meta["clusters"] == {"2bp": ["2bp", "2bromopalmitic acid 2bp"], "palmitate": ["palmitate"]}
        assert winner.meta["vote_share"] == pytest.approx(2 / 3)
        assert winner.meta["tie"] is False
        assert winner.documents == [documents[0], documents[2]]
        assert result["candidates"] == [ACRONYM, "palmitate"]
        assert [(a.data, a.meta) for a in result["answers"][1:]] == [("palmitate", {"votes": 1})]
        assert result["answers"][1].documents == [documents[1]]
        assert result["documents"] == documents[:3]

    def test_exact_run_has_no_clusters(self):
        result = voter_with([ACRONYM, "palmitate", LONG_FORM]).run(query="Q?", documents=docs(3))
        assert result["answers"][0].meta["votes"] == {"2bp": 1, "palmitate": 1, "2bromopalmitic acid 2bp": 1}
        assert result["answers"][0].meta["tie"] is True
        assert "clusters" not in result["answers"][0].meta

    def test_overlap_resolves_a_one_vote_tie(self):
        exact = voter_with(["palmitate", ACRONYM, LONG_FORM]).run(query="Q?", documents=docs(3))
        overlap = voter_with(["palmitate", ACRONYM, LONG_FORM], vote="overlap").run(query="Q?", documents=docs(3))
        assert exact["answers"][0].data == "palmitate"  # 1-1-1: the best-ranked
        assert overlap["answers"][0].data == ACRONYM

    def test_confidence_counts_the_cluster(self):
        def reply(text: str, logprob: float) -> ChatMessage:
            logprobs = {"content": [{"token": text, "logprob": logprob}]}
            return ChatMessage.from_assistant(text, meta={"logprobs": logprobs})

        replies = [reply(ACRONYM, -0.2), reply(LONG_FORM, -0.4), reply("palmitate", -3.0)]
        meta = voter_with(replies, vote="overlap").run(query="Q?", documents=docs(3))["answers"][0].meta
        assert meta["confidence"] == pytest.approx((math.exp(-0.2) + math.exp(-0.4)) / 2)

    def test_split_outputs_are_per_cluster(self):
        documents = docs(4)
        voter = voter_with([ACRONYM, "palmitate", LONG_FORM, "oleate"], vote="overlap", min_vote_share=0.6)
        result = voter.run(query="Q?", documents=documents)
        assert "answers" not in result
        assert result["split_candidates"] == [ACRONYM, "palmitate"]
        assert result["split_documents"] == [[documents[0], documents[2]], [documents[1]]]
        assert result["split"][0].meta["split_reason"] == "vote share 0.50 < 0.6"

    async def test_run_async_same_output(self):
        responses = [ACRONYM, "palmitate", LONG_FORM]
        sync = voter_with(responses, vote="overlap").run(query="Q?", documents=docs(3))
        result = await voter_with(responses, vote="overlap").run_async(query="Q?", documents=docs(3))
        assert result["answers"][0].data == sync["answers"][0].data
        assert result["answers"][0].meta["clusters"] == sync["answers"][0].meta["clusters"]


class TestVoterAnswerChecks:
    def test_invalid_answers_do_not_vote_and_are_reported(self):
        documents = docs(4)
        result = voter_with([MARKUP, "Lyon", DEMO, "lyon"]).run(query="Q?", documents=documents)
        winner = result["answers"][0]
        assert winner.data == "Lyon"
        assert winner.meta["votes"] == {"lyon": 2}
        assert winner.meta["invalid_answers"] == 2
        entries = winner.meta["passage_answers"]
        assert entries[0] == {"rank": 0, "document_id": "d0", "answers": [MARKUP], "invalid": [PASSAGE_MARKUP]}
        assert entries[2]["invalid"] == [DEMONSTRATION]
        assert "invalid" not in entries[1]
        assert "invalid" not in entries[3]
        assert result["candidates"] == ["Lyon"]
        assert result["documents"] == [documents[1], documents[3]]

    def test_a_demonstration_answer_the_passage_holds_votes(self):
        documents = [Document(id="d0", content=f"It happened in {DEMO}."), *docs(1, "Nothing here.")]
        result = voter_with([DEMO, DEMO]).run(query="Q?", documents=documents)
        winner = result["answers"][0]
        assert winner.meta["votes"] == {DEMO: 1}  # the second passage does not hold it
        assert winner.meta["invalid_answers"] == 1
        assert winner.documents == [documents[0]]

    def test_all_invalid_is_unknown(self):
        result = voter_with([MARKUP, "(i) (ii) (iii)"]).run(query="Q?", documents=docs(2))
        assert result["answers"][0].data == "unknown"
        assert result["unknown"] == result["answers"]
        assert result["answers"][0].meta["invalid_answers"] == 2

    def test_samples_are_checked_one_by_one(self):
        voter = voter_with(["Lyon", MARKUP, "Oslo", "Oslo"], samples_per_passage=2)
        meta = voter.run(query="Q?", documents=docs(2))["answers"][0].meta
        assert meta["passage_answers"][0]["invalid"] == [None, PASSAGE_MARKUP]
        assert meta["votes"] == {"oslo": 2, "lyon": 1}

    def test_overlap_mode_skips_invalid_answers_too(self):
        result = voter_with([MARKUP, ACRONYM, LONG_FORM], vote="overlap").run(query="Q?", documents=docs(3))
        assert result["answers"][0].data == ACRONYM
        assert result["answers"][0].meta["votes"] == {"2bp": 2}

    def test_valid_answers_vote_as_without_checks(self):
        responses = ["Paris", "unknown", "paris.", "Lyon"]
        on = voter_with(responses).run(query="Q?", documents=docs(4))
        off = voter_with(responses, answer_checks=False).run(query="Q?", documents=docs(4))
        on_meta = dict(on["answers"][0].meta)
        assert on_meta.pop("invalid_answers") == 0
        assert on_meta == off["answers"][0].meta
        assert [a.data for a in on["answers"]] == [a.data for a in off["answers"]]

    def test_checks_off_is_the_voter_before_the_validator(self):
        documents = docs(3)
        result = voter_with([MARKUP, DEMO, "Lyon"], answer_checks=False).run(query="Q?", documents=documents)
        winner = result["answers"][0]
        # every answer votes, as before: the 1-1-1 tie goes to the best-ranked passage
        assert winner.data == MARKUP
        assert winner.meta["votes"] == {normalize_answer(MARKUP): 1, DEMO: 1, "lyon": 1}
        assert set(winner.meta) == {
            "strategy",
            "source",
            "votes",
            "vote_share",
            "tie",
            "confidence",
            "passage_answers",
            "failures",
            "usage",
        }
        assert winner.meta["passage_answers"] == [
            {"rank": 0, "document_id": "d0", "answers": [MARKUP]},
            {"rank": 1, "document_id": "d1", "answers": [DEMO]},
            {"rank": 2, "document_id": "d2", "answers": ["Lyon"]},
        ]
        assert result["documents"] == documents
        assert result["candidates"] == [MARKUP, DEMO, "Lyon"]
