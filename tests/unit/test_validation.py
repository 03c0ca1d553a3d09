"""The answer validator (issue 16, item 1) and every place that reads an answer from a reply."""

import pytest
from haystack import Document, Pipeline
from haystack.components.builders import AnswerBuilder
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage
from hypothesis import given
from hypothesis import strategies as st

from haystack_fusion import CandidateSummarizer, NoteTaker, UnknownRouter
from haystack_fusion.components.checked_answer_builder import CheckedAnswerBuilder
from haystack_fusion.prompts import PROMPTS, format_passages
from haystack_fusion.strategies import build_pipeline, run_strategy
from haystack_fusion.validation import (
    DEMONSTRATION,
    EMPTY_ENUMERATION,
    INVALID,
    PASSAGE_MARKUP,
    check_answer,
    is_empty_enumeration,
    is_passage_markup,
)

DOCUMENTS = [Document(content="Tom Hale was born in 1931 in Dayton."), Document(content="He died in 1999.")]


class TestCheckAnswer:
    @pytest.mark.parametrize(
        "answer",
        [
            '<passage key="1c6071d9">',
            '</passage key="1c6071d9">',
            "1005dbc6",
            "  1005DBC6. ",
            'key="1c6071d9"',
            "[2]",
            "Passage #2 Text:",
            "Paris </passage",
        ],
    )
    def test_passage_markup(self, answer):
        assert check_answer(answer) == PASSAGE_MARKUP

    @pytest.mark.parametrize("answer", ["12345678", "Paris", "[2] Paris", "passage of time", "a key figure", "1925"])
    def test_not_markup(self, answer):
        assert not is_passage_markup(answer)

    def test_markup_is_what_format_passages_writes(self):
        for line in format_passages(DOCUMENTS).splitlines():
            if "passage" in line:
                assert check_answer(line.split("]")[-1]) == PASSAGE_MARKUP, line

    def test_demonstration_answer_not_in_passages(self):
        demos = PROMPTS["figure7"].demonstrations
        assert check_answer("1925", demonstrations=demos, passages=[d.content for d in DOCUMENTS]) == DEMONSTRATION
        assert check_answer(" butch vig.", demonstrations=demos, passages=[]) == DEMONSTRATION

    def test_demonstration_answer_in_passages_is_valid(self):
        passages = ["The film was released in 1925."]
        assert check_answer("1925", demonstrations=PROMPTS["figure7"].demonstrations, passages=passages) is None

    def test_demonstration_answer_must_match_whole_words(self):
        passages = ["It was 19250 metres long."]
        assert check_answer("1925", demonstrations=["1925"], passages=passages) == DEMONSTRATION

    def test_no_demonstrations_no_demonstration_rule(self):
        assert check_answer("1925") is None

    @pytest.mark.parametrize("answer", ["(i) (ii) (iii)", "(i) (ii) (iii) … (xxi)", "(a) (b)", "(1), (2)", "i) ii)"])
    def test_empty_enumeration(self, answer):
        assert check_answer(answer) == EMPTY_ENUMERATION

    @pytest.mark.parametrize("answer", ["(a) Paris", "Louis (XIV)", "1.", "(i) the river", "civil"])
    def test_enumeration_with_content(self, answer):
        assert not is_empty_enumeration(answer)

    @pytest.mark.parametrize("answer", [None, "", "   "])
    def test_no_answer_is_not_checked(self, answer):
        assert check_answer(answer, demonstrations=["1925"]) is None

    @given(st.text(max_size=200))
    def test_any_text_gives_a_reason_or_none(self, text):
        assert check_answer(text, demonstrations=["1925"], passages=[text[:50]]) in (
            None,
            PASSAGE_MARKUP,
            DEMONSTRATION,
            EMPTY_ENUMERATION,
        )

    def test_linear_on_a_long_answer(self):
        assert check_answer("(i) " * 50_000 + "x", demonstrations=["1925"], passages=["y " * 50_000]) is None


class TestCheckedAnswerBuilder:
    def run(self, text: str, **init):
        builder = CheckedAnswerBuilder(pattern=PROMPTS["figure7"].answer_pattern, **init)
        return builder.run(query="When was he born?", replies=[ChatMessage.from_assistant(text)], documents=DOCUMENTS)

    def test_valid_answer_is_answer_builders(self):
        ours = self.run("1931\nQuestion: next")["answers"][0]
        theirs = AnswerBuilder(pattern=PROMPTS["figure7"].answer_pattern).run(
            query="When was he born?", replies=[ChatMessage.from_assistant("1931\nQuestion: next")], documents=DOCUMENTS
        )["answers"][0]
        assert (ours.data, ours.documents) == (theirs.data, theirs.documents)
        assert "answer_source" not in ours.meta

    def test_rejected_answer_is_empty_and_says_why(self):
        answer = self.run("1925", demonstrations=["1925"])["answers"][0]
        assert answer.data == ""
        assert answer.meta["answer_source"] == INVALID
        assert answer.meta["invalid_reason"] == DEMONSTRATION
        assert answer.meta["rejected_answer"] == "1925"
        assert answer.documents  # the passages stay attached

    @pytest.mark.parametrize(("finish_reason", "truncated"), [("length", True), ("stop", False)])
    def test_truncated_flag(self, finish_reason, truncated):
        reply = ChatMessage.from_assistant("A long answer that", meta={"finish_reason": finish_reason})
        builder = CheckedAnswerBuilder(pattern="(.*)")
        assert builder.run(query="q", replies=[reply])["answers"][0].meta["truncated"] is truncated

    def test_no_finish_reason_no_flag(self):
        builder = CheckedAnswerBuilder(pattern="(.*)")
        assert "truncated" not in builder.run(query="q", replies=["Paris"])["answers"][0].meta

    def test_round_trip(self):
        builder = CheckedAnswerBuilder(pattern="(.*)", demonstrations=["1925"])
        again = CheckedAnswerBuilder.from_dict(builder.to_dict())
        assert again.to_dict() == builder.to_dict()
        assert again.demonstrations == ["1925"]

    def test_in_a_pipeline(self):
        pipe = Pipeline()
        pipe.add_component("answer_builder", CheckedAnswerBuilder(pattern="(.*)"))
        loaded = Pipeline.loads(pipe.dumps())
        result = loaded.run({"answer_builder": {"query": "q", "replies": ['<passage key="00ab12cd">']}})
        assert result["answer_builder"]["answers"][0].meta["invalid_reason"] == PASSAGE_MARKUP


class TestRouter:
    def test_invalid_answer_falls_back(self):
        router = UnknownRouter(demonstrations=list(PROMPTS["figure7"].demonstrations))
        result = router.run(replies=[ChatMessage.from_assistant("1925")], query="When?", documents=DOCUMENTS)
        assert result["reason"] == "invalid answer (demonstration answer)"
        assert result["fallback_documents"] == DOCUMENTS

    def test_checks_off_keeps_the_answer(self):
        router = UnknownRouter(answer_checks=False)
        replies = [ChatMessage.from_assistant("1005dbc6")]
        assert router.run(replies=replies, query="When?", documents=DOCUMENTS) == {"known": replies}

    def test_serializes_every_setting(self):
        assert set(UnknownRouter().to_dict()["init_parameters"]) == {
            "answer_pattern",
            "unknown_patterns",
            "min_confidence",
            "answer_checks",
            "demonstrations",
        }
        router = UnknownRouter(answer_checks=False, demonstrations=["x"])
        assert UnknownRouter.from_dict(router.to_dict()).to_dict() == router.to_dict()


class TestNoteTaker:
    def test_demonstration_answer_is_invalid(self):
        reply = "Passage #1 says nothing about it. Based on the information given in above passages, the answer is 1996"
        taker = NoteTaker(chat_generator=MockChatGenerator(responses=[reply]))
        answer = taker.run(query="When did he die?", documents=DOCUMENTS[:1])["answers"][0]
        assert answer.data == ""
        assert answer.meta["answer_source"] == INVALID
        assert answer.meta["rejected_answer"] == "1996"

    def test_checks_off(self):
        reply = "Passage #1 says nothing. Based on the information given in above passages, the answer is 1996"
        taker = NoteTaker(chat_generator=MockChatGenerator(responses=[reply]), answer_checks=False)
        assert taker.run(query="When did he die?", documents=DOCUMENTS[:1])["answers"][0].data == "1996"
        assert taker.to_dict()["init_parameters"]["answer_checks"] is False
        assert NoteTaker(chat_generator=MockChatGenerator()).to_dict()["init_parameters"]["answer_checks"] is True


class TestCandidates:
    def test_invalid_candidates_are_dropped_and_listed(self):
        llm = MockChatGenerator(responses=["(a) 1925, (b) 1931", "1931 is his birth year. [DONE]"])
        summarizer = CandidateSummarizer(chat_generator=llm, few_shot=True, max_concurrency=1)
        result = summarizer.run(query="When was he born?", documents=DOCUMENTS)
        assert result["candidates"] == ["1931"]
        assert result["meta"]["invalid_candidates"] == [{"candidate": "1925", "reason": DEMONSTRATION}]

    def test_checks_off(self):
        llm = MockChatGenerator(responses=["(a) 1925, (b) 1931", "a. [DONE]", "b. [DONE]"])
        summarizer = CandidateSummarizer(chat_generator=llm, few_shot=True, max_concurrency=1, answer_checks=False)
        assert summarizer.run(query="When was he born?", documents=DOCUMENTS)["candidates"] == ["1925", "1931"]


class TestStrategies:
    def retriever(self):
        from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
        from haystack.document_stores.in_memory import InMemoryDocumentStore

        store = InMemoryDocumentStore()
        store.write_documents(DOCUMENTS)
        return InMemoryBM25Retriever(document_store=store, top_k=2)

    def test_concatenation_records_an_invalid_answer(self):
        pipe = build_pipeline(
            "concatenation", retriever=self.retriever(), chat_generator=MockChatGenerator(responses=["Butch Vig"])
        )
        run = run_strategy("concatenation", pipe, "Who was born in Dayton?")
        assert run.answer.data == ""
        assert run.evidence["answer_source"] == INVALID
        assert run.evidence["invalid_reason"] == DEMONSTRATION
        assert run.evidence["rejected_answer"] == "Butch Vig"

    def test_the_answer_replys_finish_reason_is_evidence(self):
        reply = ChatMessage.from_assistant("Tom Hale", meta={"finish_reason": "length"})
        pipe = build_pipeline("concatenation", retriever=self.retriever(), chat_generator=MockChatGenerator([reply]))
        run = run_strategy("concatenation", pipe, "Who was born in Dayton?")
        assert run.evidence["finish_reason"] == "length"
        assert run.answer.meta["truncated"] is True

    def test_concatenation_without_checks_uses_haystacks_answer_builder(self):
        pipe = build_pipeline(
            "concatenation",
            retriever=self.retriever(),
            chat_generator=MockChatGenerator(responses=["Butch Vig"]),
            answer_checks=False,
        )
        assert type(pipe.get_component("answer_builder")) is AnswerBuilder
        assert run_strategy("concatenation", pipe, "Who was born in Dayton?").answer.data == "Butch Vig"

    def test_concat_pf_falls_back_on_an_invalid_answer(self):
        llm = MockChatGenerator(responses=['<passage key="0a1b2c3d">', "Tom Hale", "unknown"])
        pipe = build_pipeline("concat_pf", retriever=self.retriever(), chat_generator=llm, max_concurrency=1)
        run = run_strategy("concat_pf", pipe, "Who was born in Dayton?")
        assert run.evidence["fallback"] is True
        assert run.evidence["stages"][0]["reason"] == "invalid answer (passage markup)"
        assert run.answer.data == "Tom Hale"
