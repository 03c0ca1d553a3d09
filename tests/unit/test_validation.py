"""The answer checks (`check_answer`) and the strategies that apply them to every answer they read from a reply."""

import pytest
from haystack import Document
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage
from hypothesis import given
from hypothesis import strategies as st

from haystack_fusion.answers import (
    DEMONSTRATION,
    EMPTY_ENUMERATION,
    INVALID,
    PASSAGE_MARKUP,
    REASONS,
    REPEATS_QUESTION,
    check_answer,
    is_empty_enumeration,
    is_passage_markup,
    repeats_question,
)
from haystack_fusion.prompts import PROMPTS, format_passages
from haystack_fusion.strategies import build_pipeline, run_strategy
from haystack_fusion.testing import ScriptedChatGenerator

WORD = st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True).filter(lambda word: word not in {"a", "an", "the", "or"})
"""A word the SQuAD normalization leaves as it is (no article), other than "or"."""

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

    @pytest.mark.parametrize(
        ("answer", "question"),
        [
            ("post-fusion answer with", "What does post-fusion answer with?"),
            ("Post-Fusion answer with.", "What does post-fusion answer with?"),
            ("answer with post-fusion", "What does post-fusion answer with?"),
            ("What does post-fusion answer with?", "What does post-fusion answer with?"),
            ("Barack Obama", "Who is Barack Obama?"),
            ("Paris or Lyon", "Is the capital Paris or Lyon?"),
            ("post-fusion answer with", "Does post-fusion answer with a vote or a summary?"),
        ],
    )
    def test_repeats_the_question(self, answer, question):
        assert check_answer(answer, question=question) == REPEATS_QUESTION

    @pytest.mark.parametrize(
        ("answer", "question"),
        [
            ("answers with the majority vote", "What does post-fusion answer with?"),
            ("yes", "Is post-fusion a voting strategy?"),
            ("unknown", "Is the cause unknown?"),
            ("post-fusion", "What does post-fusion answer with?"),
            ("Paris", "Is the capital Paris or Lyon?"),
            ("the capital is Paris", "Is the capital Paris or Lyon?"),
            ("Jane Austen", "Was it written by Jane Austen or Charlotte Bronte?"),
            ("Charlotte Bronte", "Was it written by Jane Austen or Charlotte Bronte?"),
            ("a vote", "Does post-fusion answer with a vote or a summary?"),
            ("Barack Obama", "Who was president in 2010?"),
        ],
    )
    def test_does_not_repeat_the_question(self, answer, question):
        assert not repeats_question(answer, question)
        assert check_answer(answer, question=question) is None

    def test_no_question_no_repeat_rule(self):
        assert check_answer("post-fusion answer with") is None
        assert check_answer("post-fusion answer with", question="") is None

    @given(st.text(max_size=200), st.text(max_size=200))
    def test_any_text_gives_a_reason_or_none(self, text, question):
        assert check_answer(text, question=question, demonstrations=["1925"], passages=[text[:50]]) in (None, *REASONS)

    @given(st.lists(WORD, min_size=1, max_size=12), st.data())
    def test_words_of_a_question_without_or_repeat_it(self, asked, data):
        answer = data.draw(st.lists(st.sampled_from(asked), min_size=2, max_size=6))
        assert check_answer(" ".join(answer), question=" ".join(asked) + "?") == REPEATS_QUESTION

    @given(st.lists(WORD | st.just("or"), max_size=12), st.lists(WORD | st.just("or"), min_size=1, max_size=6))
    def test_a_new_word_or_a_single_word_never_repeats(self, asked, answer):
        new_word = not set(answer) <= set(asked)
        if new_word or len(answer) == 1:
            assert not repeats_question(" ".join(answer), " ".join(asked))

    def test_linear_on_a_long_answer(self):
        assert check_answer("(i) " * 50_000 + "x", demonstrations=["1925"], passages=["y " * 50_000]) is None


class TestStrategies:
    def retriever(self, documents=DOCUMENTS):
        from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
        from haystack.document_stores.in_memory import InMemoryDocumentStore

        store = InMemoryDocumentStore()
        store.write_documents(documents)
        return InMemoryBM25Retriever(document_store=store, top_k=len(documents))

    def test_concatenation_records_an_invalid_answer(self):
        pipe = build_pipeline(
            "concatenation", retriever=self.retriever(), chat_generator=MockChatGenerator(responses=["Butch Vig"])
        )
        run = run_strategy(pipe, "Who was born in Dayton?")
        assert run.answer.data == ""
        assert run.evidence.to_dict()["answer_source"] == INVALID
        assert run.evidence.to_dict()["invalid_reason"] == DEMONSTRATION
        assert run.evidence.to_dict()["rejected_answer"] == "Butch Vig"

    def test_the_answer_replys_finish_reason_is_evidence(self):
        reply = ChatMessage.from_assistant("Tom Hale", meta={"finish_reason": "length"})
        pipe = build_pipeline("concatenation", retriever=self.retriever(), chat_generator=MockChatGenerator([reply]))
        run = run_strategy(pipe, "Who was born in Dayton?")
        assert run.evidence.finish_reason == "length"
        assert run.answer.meta["truncated"] is True

    def test_concat_pf_falls_back_on_an_invalid_answer(self):
        llm = MockChatGenerator(responses=['<passage key="0a1b2c3d">', "Tom Hale", "unknown"])
        pipe = build_pipeline("concat_pf", retriever=self.retriever(), chat_generator=llm, max_concurrency=1)
        run = run_strategy(pipe, "Who was born in Dayton?")
        assert run.evidence.fallback is True
        assert run.evidence.stages[0].reason == "invalid answer (passage markup)"
        assert run.answer.data == "Tom Hale"

    def test_concat_pf_falls_back_on_an_answer_that_repeats_the_question(self):
        documents = [
            Document(content="Post-fusion asks the LLM once per passage and answers with the majority vote."),
            Document(content="Concatenation, unlike post-fusion, puts all passages into one prompt."),
        ]

        def reply(prompt: str) -> str:
            if prompt.count("<passage ") > 1:  # the concatenation prompt
                return "post-fusion answer with"
            return "the majority vote" if "majority vote" in prompt else "unknown"

        llm = ScriptedChatGenerator(reply=reply)
        pipe = build_pipeline("concat_pf", retriever=self.retriever(documents), chat_generator=llm, max_concurrency=1)
        run = run_strategy(pipe, "What does post-fusion answer with?")
        assert run.evidence.fallback is True
        assert run.evidence.stages[0].reason == f"invalid answer ({REPEATS_QUESTION})"
        assert run.answer.data == "the majority vote"
        assert llm.calls == 3

    def test_a_repeat_of_the_question_does_not_vote(self):
        llm = MockChatGenerator(responses=["Tom Hale", "born in Dayton", "born in Dayton"])
        documents = [*DOCUMENTS, Document(content="Dayton is in Ohio.")]
        pipe = build_pipeline("post_fusion", retriever=self.retriever(documents), chat_generator=llm, max_concurrency=1)
        run = run_strategy(pipe, "Who was born in Dayton?")
        assert run.answer.data == "Tom Hale"
        assert run.answer.meta["votes"] == {"tom hale": 1}
        assert run.answer.meta["invalid_answers"] == 2

    def test_concatenation_rejects_a_repeat_of_the_question(self):
        llm = MockChatGenerator(responses=["born in Dayton"])
        pipe = build_pipeline("concatenation", retriever=self.retriever(), chat_generator=llm)
        run = run_strategy(pipe, "Who was born in Dayton?")
        assert run.answer.data == ""
        assert run.evidence.to_dict()["invalid_reason"] == REPEATS_QUESTION
        assert run.evidence.to_dict()["rejected_answer"] == "born in Dayton"
