import math
import re
from typing import Any

import pytest
from haystack import Document, Pipeline
from haystack.components.generators.chat import MockChatGenerator
from haystack.core.serialization import component_from_dict, component_to_dict
from haystack.dataclasses import ChatMessage, GeneratedAnswer

from haystack_fusion import NoteTaker, PostFusionVoter
from haystack_fusion.answers import DEMONSTRATION, PASSAGE_MARKUP, has_visible_text, validate_query
from haystack_fusion.components.split_vote_router import SplitVoteRouter
from haystack_fusion.failures import CallFailure, LLMCallsFailedError
from haystack_fusion.llm import DEFAULT_SAMPLING_KWARGS
from haystack_fusion.prompts import DEFAULT_MAX_PASSAGE_CHARS, PROMPTS
from haystack_fusion.testing import ScriptedChatGenerator
from tests.unit.scripted_calls import kwargs_recording_generator

QUERY = "What is the capital of France?"

DOCUMENTS = [
    Document(id="d0", content="Paris is the capital and largest city of France."),
    Document(id="d1", content="Berlin is the capital of Germany."),
    Document(id="d2", content="The Eiffel Tower is in Paris, the French capital."),
    Document(id="d3", content="Lyon is a city in France."),
]

ANSWERS_BY_PASSAGE = {
    "Paris is the capital": "Paris",
    "Berlin is the capital": "unknown",
    "The Eiffel Tower": "paris.",
    "Lyon is a city": "Lyon",
}

PASSAGE_BLOCK = re.compile(r'<passage key="([0-9a-f]+)">\n(.*?)\n</passage key="\1">', re.DOTALL)


def passages_in(prompt_text: str) -> list[str]:
    return [match.group(2) for match in PASSAGE_BLOCK.finditer(prompt_text)]


def answer_by_passage(messages: list[ChatMessage]) -> str:
    """A MockChatGenerator response_fn: answers from the one passage in the prompt."""
    (passage,) = passages_in(messages[-1].text)
    for start, answer in ANSWERS_BY_PASSAGE.items():
        if passage.startswith(start):
            return answer
    return "unknown"


def recording_generator(fail_on: str | None = None) -> ScriptedChatGenerator:
    """Answers like `answer_by_passage`, records every call's prompt and generation_kwargs; can fail on a passage."""
    return ScriptedChatGenerator(lambda prompt: answer_by_passage([ChatMessage.from_user(prompt)]), fail_on=fail_on)


def voter_with(responses: list[str], **kwargs: Any) -> PostFusionVoter:
    return PostFusionVoter(chat_generator=MockChatGenerator(responses=responses), **kwargs)


class TestValidateQuery:
    def test_strips(self):
        assert validate_query("  Who?  ") == "Who?"

    @pytest.mark.parametrize("query", ["", "   ", "\n\t", None, 3])
    def test_invalid(self, query):
        with pytest.raises(ValueError, match="query"):
            validate_query(query)

    @pytest.mark.parametrize(
        "query",
        [
            "\x00",
            "\x00\x00 \n\x00",
            "\x1b\x07\x7f",
            "\x85\x9f",
            "\u200b\u200d\ufeff",
            "\u202e \u2066",
            "\x00" * 100_000,
        ],
    )
    def test_only_control_and_format_characters_is_no_question(self, query):
        with pytest.raises(ValueError, match="non-empty question with visible text") as refused:
            validate_query(query)
        assert len(str(refused.value)) < 300  # a huge query is not echoed

    @pytest.mark.parametrize("query", ["\x00Who?", "\u200bWho?\x00", "?", "\u0301", "\U000f0000"])
    def test_one_visible_character_is_a_question(self, query):
        assert validate_query(query) == query.strip()
        assert has_visible_text(query)

    def test_a_lone_surrogate_is_named(self):
        with pytest.raises(ValueError, match="lone surrogate at character 1"):
            validate_query("\x00\ud800")


class TestPostFusionVoter:
    def test_init_defaults(self):
        voter = voter_with(["x"])
        assert voter.max_concurrency is None
        assert voter.samples_per_passage == 1
        assert voter.sampling_generation_kwargs is None
        assert voter.max_passage_chars == DEFAULT_MAX_PASSAGE_CHARS
        assert voter.unknown_patterns is None
        assert voter.raise_on_failure is False

    def test_majority_vote(self):
        voter = voter_with(["Paris", "unknown", "paris.", "Lyon"])
        result = voter.run(query=QUERY, documents=DOCUMENTS)
        winner = result["answers"][0]
        assert isinstance(winner, GeneratedAnswer)
        assert winner.data == "Paris"
        assert winner.query == QUERY
        assert winner.meta["votes"] == {"paris": 2, "lyon": 1}
        assert [document.id for document in winner.documents] == ["d0", "d2"]

    def test_winner_meta(self):
        result = voter_with(["Paris", "unknown", "paris.", "Lyon"]).run(query=QUERY, documents=DOCUMENTS)
        meta = result["answers"][0].meta
        assert {"votes", "passage_answers", "failures", "usage"} <= set(meta)
        assert meta["strategy"] == "post_fusion"
        assert meta["passage_answers"] == [
            {"rank": 0, "document_id": "d0", "answers": ["Paris"]},
            {"rank": 1, "document_id": "d1", "answers": ["unknown"]},
            {"rank": 2, "document_id": "d2", "answers": ["paris."]},
            {"rank": 3, "document_id": "d3", "answers": ["Lyon"]},
        ]
        assert meta["failures"] == []
        usage = meta["usage"]
        assert usage["calls"] == 4
        assert usage["failed_calls"] == 0
        assert usage["rounds"] == 1
        assert usage["prompt_tokens"] > 0
        assert usage["completion_tokens"] == 4  # MockChatGenerator counts words: Paris, unknown, paris., Lyon

    def test_candidates_and_runner_up_answers(self):
        result = voter_with(["Lyon", "Paris", "paris", "Nice"]).run(query=QUERY, documents=DOCUMENTS)
        assert result["candidates"] == ["Paris", "Lyon", "Nice"]
        assert [answer.data for answer in result["answers"]] == ["Paris", "Lyon", "Nice"]
        assert result["answers"][1].meta == {"votes": 1}
        assert [document.id for document in result["answers"][1].documents] == ["d0"]
        assert [document.id for document in result["answers"][2].documents] == ["d3"]

    def test_documents_output_holds_only_answering_passages(self):
        result = voter_with(["unknown", "Paris", "I don't know", "Lyon"]).run(query=QUERY, documents=DOCUMENTS)
        assert [document.id for document in result["documents"]] == ["d1", "d3"]

    def test_all_unknown(self):
        result = voter_with(["unknown", "I don't know", "Unknown.", ""]).run(query=QUERY, documents=DOCUMENTS)
        assert result["answers"][0].data == "unknown"
        assert result["answers"][0].documents == []
        assert result["answers"][0].meta["votes"] == {}
        assert len(result["answers"]) == 1
        assert result["unknown"] == result["answers"]
        assert "candidates" not in result  # a distiller round connected to them must not run
        assert "documents" not in result

    def test_ties_go_to_better_ranked_passage(self):
        result = voter_with(["unknown", "Lyon", "Paris", "unknown"]).run(query=QUERY, documents=DOCUMENTS)
        assert result["answers"][0].data == "Lyon"

    def test_input_dependent_answers(self):
        voter = PostFusionVoter(chat_generator=MockChatGenerator(response_fn=answer_by_passage), max_concurrency=2)
        result = voter.run(query=QUERY, documents=DOCUMENTS)
        assert result["answers"][0].data == "Paris"
        assert result["candidates"] == ["Paris", "Lyon"]
        assert [document.id for document in result["documents"]] == ["d0", "d2", "d3"]

    def test_each_call_sees_one_passage_with_figure7_prompt(self):
        generator = recording_generator()
        PostFusionVoter(chat_generator=generator).run(query=QUERY, documents=DOCUMENTS)
        assert generator.calls == 4
        for prompt in generator.prompts:
            assert prompt.startswith("Given the relevant background contexts, answer the current question")
            assert prompt.endswith(f"Question: {QUERY}\nAnswer:")
            assert len(passages_in(prompt)) == 1
        assert sorted(passages_in(prompt)[0] for prompt in generator.prompts) == sorted(
            document.content for document in DOCUMENTS
        )

    def test_query_is_stripped(self):
        result = voter_with(["Paris"]).run(query=f"  {QUERY}\n", documents=DOCUMENTS[:1])
        assert result["answers"][0].query == QUERY

    @pytest.mark.parametrize("query", ["", "   ", "\n"])
    def test_empty_query_raises(self, query):
        generator = recording_generator()
        with pytest.raises(ValueError, match="`query`"):
            PostFusionVoter(chat_generator=generator).run(query=query, documents=DOCUMENTS)
        assert generator.calls == 0

    @pytest.mark.parametrize("documents", [[], None])
    def test_zero_documents_makes_no_call(self, documents):
        generator = recording_generator()
        result = PostFusionVoter(chat_generator=generator).run(query=QUERY, documents=documents)
        assert generator.calls == 0
        winner = result["answers"][0]
        assert winner.data == "unknown"
        assert winner.meta["votes"] == {}
        assert winner.meta["passage_answers"] == []
        assert winner.meta["failures"] == []
        assert winner.meta["usage"] == {
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "calls": 0,
            "failed_calls": 0,
            "rounds": 0,
        }
        assert result["unknown"] == [winner]
        assert "candidates" not in result
        assert "documents" not in result

    def test_failed_call_is_recorded_and_others_vote(self):
        generator = recording_generator(fail_on="Eiffel")
        result = PostFusionVoter(chat_generator=generator).run(query=QUERY, documents=DOCUMENTS)
        winner = result["answers"][0]
        assert winner.data == "Paris"
        assert winner.meta["votes"] == {"paris": 1, "lyon": 1}
        assert winner.meta["failures"] == [
            CallFailure("failing", "RuntimeError", "backend exploded", index=2).to_dict()
        ]
        assert winner.meta["passage_answers"][2] == {"rank": 2, "document_id": "d2", "answers": [None]}
        assert winner.meta["usage"]["calls"] == 4
        assert winner.meta["usage"]["failed_calls"] == 1
        assert [document.id for document in result["documents"]] == ["d0", "d3"]

    def test_raise_on_failure(self):
        voter = PostFusionVoter(chat_generator=recording_generator(fail_on="Eiffel"), raise_on_failure=True)
        with pytest.raises(RuntimeError, match="backend exploded"):
            voter.run(query=QUERY, documents=DOCUMENTS)

    def test_samples_per_passage(self):
        generator = recording_generator()
        voter = PostFusionVoter(chat_generator=generator, samples_per_passage=3)
        result = voter.run(query=QUERY, documents=DOCUMENTS)
        k = len(DOCUMENTS)
        assert generator.calls == 3 * k
        assert generator.kwargs == [{"temperature": 0.7}] * (3 * k)
        assert DEFAULT_SAMPLING_KWARGS == {"temperature": 0.7}
        meta = result["answers"][0].meta
        assert meta["usage"]["calls"] == 3 * k
        assert meta["votes"] == {"paris": 6, "lyon": 3}
        assert [entry["answers"] for entry in meta["passage_answers"]] == [
            ["Paris"] * 3,
            ["unknown"] * 3,
            ["paris."] * 3,
            ["Lyon"] * 3,
        ]

    def test_samples_failures_carry_their_passage_s_rank(self):
        generator = recording_generator(fail_on="Lyon")
        result = PostFusionVoter(chat_generator=generator, samples_per_passage=2).run(query=QUERY, documents=DOCUMENTS)
        assert (
            result["answers"][0].meta["failures"]
            == [CallFailure("failing", "RuntimeError", "backend exploded", index=3).to_dict()] * 2
        )

    @pytest.mark.parametrize("samples", [1, 2])
    def test_every_call_failed_raises_not_unknown(self, samples):
        voter = PostFusionVoter(chat_generator=recording_generator(fail_on=QUERY), samples_per_passage=samples)
        with pytest.raises(LLMCallsFailedError) as raised:
            voter.run(query=QUERY, documents=DOCUMENTS)
        ranks = [rank for rank in range(len(DOCUMENTS)) for _ in range(samples)]
        assert [failure.index for failure in raised.value.failures] == ranks
        assert str(raised.value) == (
            f"every LLM call of PostFusionVoter failed ({samples * len(DOCUMENTS)} failed calls): RuntimeError: "
            "backend exploded"
        )

    def test_custom_sampling_kwargs(self):
        generator = recording_generator()
        PostFusionVoter(
            chat_generator=generator, samples_per_passage=2, sampling_generation_kwargs={"temperature": 1.0}
        ).run(query=QUERY, documents=DOCUMENTS[:1])
        assert generator.kwargs == [{"temperature": 1.0}, {"temperature": 1.0}]

    def test_single_sample_uses_generator_settings(self):
        generator = recording_generator()
        PostFusionVoter(chat_generator=generator).run(query=QUERY, documents=DOCUMENTS[:2])
        assert generator.kwargs == [None, None]

    def test_max_passage_chars_trims_passages(self):
        generator = recording_generator()
        long_document = Document(id="long", content="Paris is the capital " + "word " * 500)
        PostFusionVoter(chat_generator=generator, max_passage_chars=40).run(query=QUERY, documents=[long_document])
        (passage,) = passages_in(generator.prompts[0])
        assert len(passage) <= 40 + len(" ...")

    def test_custom_unknown_patterns(self):
        voter = voter_with(["no idea", "unknown", "Paris"], unknown_patterns=[r"^no idea$"])
        result = voter.run(query=QUERY, documents=DOCUMENTS[:3])
        assert result["answers"][0].meta["votes"] == {"unknown": 1, "paris": 1}

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"max_concurrency": 0}, "max_concurrency"),
            ({"samples_per_passage": 0}, "samples_per_passage"),
            ({"max_passage_chars": 0}, "max_passage_chars"),
            ({"max_passage_chars": -1}, "max_passage_chars"),
            ({"unknown_patterns": ["(bad"]}, "invalid regular expression"),
        ],
    )
    def test_invalid_params(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            PostFusionVoter(chat_generator=MockChatGenerator(responses="x"), **kwargs)

    def test_to_dict(self):
        voter = voter_with(["Paris", "unknown"])
        assert voter.to_dict() == {
            "type": "haystack_fusion.components.post_fusion_voter.PostFusionVoter",
            "init_parameters": {
                "chat_generator": {
                    "type": "haystack.components.generators.chat.mock.MockChatGenerator",
                    "init_parameters": {
                        "responses": [
                            ChatMessage.from_assistant("Paris").to_dict(),
                            ChatMessage.from_assistant("unknown").to_dict(),
                        ],
                        "response_fn": None,
                        "model": "mock-model",
                        "meta": {},
                        "streaming_callback": None,
                    },
                },
                "max_concurrency": None,
                "samples_per_passage": 1,
                "sampling_generation_kwargs": None,
                "max_passage_chars": DEFAULT_MAX_PASSAGE_CHARS,
                "unknown_patterns": None,
                "raise_on_failure": False,
                "datamark": False,
                "prompt": None,
                "system_prompt": None,
            },
        }

    def test_to_dict_custom(self):
        voter = voter_with(
            ["Paris"],
            max_concurrency=2,
            samples_per_passage=3,
            sampling_generation_kwargs={"temperature": 0.9},
            max_passage_chars=None,
            unknown_patterns=["^no idea$"],
            raise_on_failure=True,
            datamark=True,
        )
        assert voter.to_dict()["init_parameters"] | {"chat_generator": None} == {
            "chat_generator": None,
            "max_concurrency": 2,
            "samples_per_passage": 3,
            "sampling_generation_kwargs": {"temperature": 0.9},
            "max_passage_chars": None,
            "unknown_patterns": ["^no idea$"],
            "raise_on_failure": True,
            "datamark": True,
            "prompt": None,
            "system_prompt": None,
        }

    def test_from_dict_round_trip(self):
        voter = voter_with(["Paris", "Lyon"], max_concurrency=2, samples_per_passage=2, unknown_patterns=["^x$"])
        data = voter.to_dict()
        restored = PostFusionVoter.from_dict(voter.to_dict())
        assert restored.to_dict() == data
        assert isinstance(restored._chat_generator, MockChatGenerator)
        assert restored.samples_per_passage == 2
        result = restored.run(query=QUERY, documents=DOCUMENTS[:1])
        assert result["answers"][0].meta["passage_answers"][0]["answers"] == ["Paris", "Lyon"]

    async def test_run_async_same_output(self):
        documents = DOCUMENTS
        sync_result = voter_with(["Paris", "unknown", "paris.", "Lyon"]).run(query=QUERY, documents=documents)
        async_result = await voter_with(["Paris", "unknown", "paris.", "Lyon"]).run_async(
            query=QUERY, documents=documents
        )
        assert async_result == sync_result

    async def test_run_async_zero_documents_and_errors(self):
        generator = recording_generator()
        voter = PostFusionVoter(chat_generator=generator)
        result = await voter.run_async(query=QUERY, documents=[])
        assert result["answers"][0].data == "unknown"
        assert generator.calls == 0
        with pytest.raises(ValueError, match="`query`"):
            await voter.run_async(query=" ", documents=DOCUMENTS)

    async def test_run_async_with_failure(self):
        generator = recording_generator(fail_on="Eiffel")
        result = await PostFusionVoter(chat_generator=generator).run_async(query=QUERY, documents=DOCUMENTS)
        assert result["answers"][0].data == "Paris"
        assert result["answers"][0].meta["failures"][0]["index"] == 2

    def test_run_inside_pipeline(self):
        pipeline = Pipeline()
        pipeline.add_component("voter", voter_with(["Paris", "Lyon", "paris"]))
        result = pipeline.run({"voter": {"query": QUERY, "documents": DOCUMENTS[:3]}})
        assert result["voter"]["answers"][0].data == "Paris"

    def test_yaml_round_trip_in_pipeline(self):
        pipeline = Pipeline()
        pipeline.add_component("voter", voter_with(["Paris", "unknown"], samples_per_passage=2))
        restored = Pipeline.loads(pipeline.dumps())
        assert restored == pipeline
        assert restored.get_component("voter").samples_per_passage == 2

    def test_warm_up_and_close_are_forwarded(self):
        generator = MockChatGenerator(responses="x")
        PostFusionVoter(chat_generator=generator).warm_up()
        assert generator._is_warmed_up
        PostFusionVoter(chat_generator=recording_generator()).close()  # no close on the generator: no error

    def test_uses_figure7_pattern(self):
        # The first line of a reply is the answer.
        result = voter_with(["Paris\nQuestion: something else\nAnswer: Lyon"]).run(query=QUERY, documents=DOCUMENTS[:1])
        assert result["answers"][0].data == "Paris"
        assert PROMPTS["figure7"].answer_pattern


def _docs(n: int) -> list[Document]:
    return [Document(content=f"passage {i}") for i in range(n)]


class TestSplitVotes:
    def test_share_tie_and_confidence_in_meta(self):
        meta = {"logprobs": {"content": [{"token": "Paris", "logprob": -0.5}]}}
        replies = [ChatMessage.from_assistant("Paris", meta=meta), "Lyon", "Paris", "unknown"]
        result = PostFusionVoter(chat_generator=MockChatGenerator(responses=replies), max_concurrency=1).run(
            query="Q?", documents=_docs(4)
        )
        winner = result["answers"][0].meta
        assert winner["vote_share"] == pytest.approx(2 / 3)
        assert winner["tie"] is False
        assert winner["confidence"] == pytest.approx(math.exp(-0.5))  # the only vote with log-probabilities


def routed(voter: PostFusionVoter, documents: list[Document], min_vote_share: float, **kwargs: Any) -> dict[str, Any]:
    """The voter's answers through a SplitVoteRouter, as `cascade` wires them."""
    answers = voter.run(query="Q?", documents=documents)["answers"]
    return SplitVoteRouter(min_vote_share=min_vote_share, **kwargs).run(query="Q?", answers=answers)


class TestSplitVoteRouter:
    def test_clear_vote_answers(self):
        result = routed(voter_with(["Paris", "Paris", "Lyon"], max_concurrency=1), _docs(3), 0.5)
        assert result["answers"][0].data == "Paris"
        assert "split_reason" not in result

    def test_tie_is_split_with_each_candidates_passages(self):
        documents = _docs(4)
        result = routed(voter_with(["Lyon", "Paris", "paris", "Lyon"], max_concurrency=1), documents, 0.3)
        assert "answers" not in result
        assert result["split_query"] == "Q?"
        assert result["split_candidates"] == ["Lyon", "Paris"]
        assert result["split_documents"] == [[documents[0], documents[3]], [documents[1], documents[2]]]
        assert result["split_reason"] == "tie at the top"

    def test_low_share_is_split_top_k(self):
        result = routed(voter_with(["Rome", "Oslo", "Bern", "Rome", "Riga"], max_concurrency=1), _docs(5), 0.5)
        assert result["split_candidates"] == ["Rome", "Oslo"]
        assert result["split_reason"] == "vote share 0.40 < 0.5"
        wider = routed(
            voter_with(["Rome", "Oslo", "Bern", "Rome", "Riga"], max_concurrency=1), _docs(5), 0.5, max_candidates=3
        )
        assert wider["split_candidates"] == ["Rome", "Oslo", "Bern"]

    def test_all_unknown_is_answered_not_split(self):
        result = routed(voter_with(["unknown", "unknown"], max_concurrency=1), _docs(2), 0.9)
        assert result["answers"][0].data == "unknown"

    @pytest.mark.parametrize(("share", "k"), [(0.0, 2), (1.5, 2), (0.5, 1)])
    def test_invalid_settings(self, share, k):
        with pytest.raises(ValueError, match=r"min_vote_share|max_candidates"):
            SplitVoteRouter(min_vote_share=share, max_candidates=k)

    def test_serialization_round_trip(self):
        data = component_to_dict(SplitVoteRouter(min_vote_share=0.6, max_candidates=3), "split_router")
        assert data["init_parameters"] == {"min_vote_share": 0.6, "max_candidates": 3}
        assert component_to_dict(component_from_dict(SplitVoteRouter, data, "split_router"), "split_router") == data


MARKUP = '<passage key="1c6071d9">'

DEMO = "1925"


def docs(n: int, content: str = "Some passage text {i}.") -> list[Document]:
    return [Document(id=f"d{i}", content=content.format(i=i)) for i in range(n)]


def sequential_voter_with(responses: list[Any], **kwargs: Any) -> PostFusionVoter:
    return PostFusionVoter(chat_generator=MockChatGenerator(responses=responses), max_concurrency=1, **kwargs)


class TestVoterExactVote:
    def test_yaml_round_trip_in_pipeline(self):
        pipeline = Pipeline()
        pipeline.add_component("voter", sequential_voter_with(["x"]))
        assert Pipeline.loads(pipeline.dumps()) == pipeline

    def test_answers_vote_apart_unless_equal_after_normalization(self):
        result = sequential_voter_with([ACRONYM, "palmitate", LONG_FORM]).run(query="Q?", documents=docs(3))
        assert result["answers"][0].meta["votes"] == {"2bp": 1, "palmitate": 1, "2bromopalmitic acid 2bp": 1}
        assert result["answers"][0].meta["tie"] is True
        assert result["answers"][0].data == ACRONYM  # 1-1-1: the best-ranked


class TestVoterAnswerChecks:
    def test_invalid_answers_do_not_vote_and_are_reported(self):
        documents = docs(4)
        result = sequential_voter_with([MARKUP, "Lyon", DEMO, "lyon"]).run(query="Q?", documents=documents)
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
        result = sequential_voter_with([DEMO, DEMO]).run(query="Q?", documents=documents)
        winner = result["answers"][0]
        assert winner.meta["votes"] == {DEMO: 1}  # the second passage does not hold it
        assert winner.meta["invalid_answers"] == 1
        assert winner.documents == [documents[0]]

    def test_all_invalid_is_unknown(self):
        result = sequential_voter_with([MARKUP, "(i) (ii) (iii)"]).run(query="Q?", documents=docs(2))
        assert result["answers"][0].data == "unknown"
        assert result["unknown"] == result["answers"]
        assert result["answers"][0].meta["invalid_answers"] == 2

    def test_samples_are_checked_one_by_one(self):
        voter = sequential_voter_with(["Lyon", MARKUP, "Oslo", "Oslo"], samples_per_passage=2)
        meta = voter.run(query="Q?", documents=docs(2))["answers"][0].meta
        assert meta["passage_answers"][0]["invalid"] == [None, PASSAGE_MARKUP]
        assert meta["votes"] == {"oslo": 2, "lyon": 1}

    def test_valid_answers_are_all_counted(self):
        result = sequential_voter_with(["Paris", "unknown", "paris.", "Lyon"]).run(query="Q?", documents=docs(4))
        winner = result["answers"][0]
        assert winner.data == "Paris"
        assert winner.meta["votes"] == {"paris": 2, "lyon": 1}
        assert winner.meta["invalid_answers"] == 0
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
            "invalid_answers",
        }
        assert all("invalid" not in entry for entry in winner.meta["passage_answers"])


ACRONYM = "2BP"

LONG_FORM = "2-bromopalmitic acid (2-BP)"

LOCAL_STOPS = ["\n\n", "\nQuestion:", "\nContext:"]


class TestPerCall:
    def test_voter(self):
        generator = kwargs_recording_generator({"stop": LOCAL_STOPS})
        voter = PostFusionVoter(chat_generator=generator, max_concurrency=1)
        voter.run(query="Capital?", documents=[Document(content="Paris."), Document(content="Lyon.")])
        assert generator.kwargs == [{"stop": ["\n"]}, {"stop": ["\n"]}]

    def test_voter_sampling_keeps_its_temperature(self):
        generator = kwargs_recording_generator()
        voter = PostFusionVoter(chat_generator=generator, max_concurrency=1, samples_per_passage=2)
        voter.run(query="Capital?", documents=[Document(content="Paris.")])
        assert generator.kwargs == [{"temperature": 0.7, "stop": ["\n"]}] * 2

    def test_note_synthesis_stops_the_notes_do_not(self):
        generator = kwargs_recording_generator({"stop": LOCAL_STOPS})
        taker = NoteTaker(chat_generator=generator, mode="per_document", generation_kwargs={"max_tokens": 400})
        taker.run(query="Capital?", documents=[Document(content="Paris is the capital.")])
        assert generator.kwargs[0] == {"max_tokens": 400}
        assert generator.kwargs[-1] == {"max_tokens": 400, "stop": ["\n"]}
