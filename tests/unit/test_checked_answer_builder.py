"""
CheckedAnswerBuilder: Haystack's AnswerBuilder with the answer checks of `haystack_fusion.answers`.
"""

import pytest
from haystack import Document, Pipeline
from haystack.components.builders import AnswerBuilder
from haystack.core.serialization import component_from_dict, component_to_dict
from haystack.dataclasses import ChatMessage

from haystack_fusion.answers import (
    DEMONSTRATION,
    INVALID,
    PASSAGE_MARKUP,
)
from haystack_fusion.components import CheckedAnswerBuilder
from haystack_fusion.prompts import PROMPTS


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
        data = component_to_dict(builder, "answer_builder")
        again = component_from_dict(CheckedAnswerBuilder, data, "answer_builder")
        assert component_to_dict(again, "answer_builder") == data
        assert again.demonstrations == ["1925"]

    def test_in_a_pipeline(self):
        pipe = Pipeline()
        pipe.add_component("answer_builder", CheckedAnswerBuilder(pattern="(.*)"))
        loaded = Pipeline.loads(pipe.dumps())
        result = loaded.run({"answer_builder": {"query": "q", "replies": ['<passage key="00ab12cd">']}})
        assert result["answer_builder"]["answers"][0].meta["invalid_reason"] == PASSAGE_MARKUP


DOCUMENTS = [Document(content="Tom Hale was born in 1931 in Dayton."), Document(content="He died in 1999.")]
