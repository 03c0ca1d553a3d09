"""
ScriptedChatGenerator and its async twin: scripted replies, recorded prompts and kwargs, and failures on request.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from haystack import Document
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.dataclasses import ChatMessage
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.strategies import build_pipeline, run_strategy
from haystack_fusion.testing import (
    AsyncScriptedChatGenerator,
    ScriptedChatGenerator,
    identify_prompt,
)


class TestScriptedChatGenerator:
    def test_a_fixed_reply_and_the_calls_recorded(self):
        llm = ScriptedChatGenerator("Paris")
        result = llm.run([ChatMessage.from_user("hi")], generation_kwargs={"temperature": 0})
        assert result["replies"][0].text == "Paris"
        assert llm.prompts == ["hi"]
        assert llm.kwargs == [{"temperature": 0}]
        assert llm.calls == 1
        assert [m.text for m in llm.messages[0]] == ["hi"]

    def test_a_reply_function_of_the_prompt(self):
        llm = ScriptedChatGenerator(lambda prompt: prompt.upper())
        assert llm.run([ChatMessage.from_user("hi")])["replies"][0].text == "HI"

    def test_a_list_of_replies_in_call_order(self):
        llm = ScriptedChatGenerator(["one", "two"])
        assert [llm.run([ChatMessage.from_user("x")])["replies"][0].text for _ in range(2)] == ["one", "two"]
        with pytest.raises(RuntimeError, match="no scripted reply left for call 3"):
            llm.run([ChatMessage.from_user("x")])

    @pytest.mark.parametrize("fail_on", ["boom", lambda prompt: prompt.endswith("boom")])
    def test_failures_are_raised_and_recorded(self, fail_on):
        llm = ScriptedChatGenerator("ok", fail_on=fail_on, error="backend down")
        assert llm.run([ChatMessage.from_user("fine")])["replies"][0].text == "ok"
        with pytest.raises(RuntimeError, match="backend down"):
            llm.run([ChatMessage.from_user("it goes boom")])
        assert llm.calls == 2

    def test_async_run_waits_its_latency_on_the_loop(self):
        llm = AsyncScriptedChatGenerator("Paris", latency=0.05)

        async def three() -> list[dict[str, Any]]:
            return await asyncio.gather(*(llm.run_async([ChatMessage.from_user(str(i))]) for i in range(3)))

        results = asyncio.run(three())
        assert [r["replies"][0].text for r in results] == ["Paris"] * 3
        assert sorted(llm.prompts) == ["0", "1", "2"]

    def test_to_dict_round_trip_with_an_importable_reply_function(self):
        llm = ScriptedChatGenerator(identify_prompt, fail_on="boom", generation_kwargs={"stop": ["\n"]})
        data = llm.to_dict()
        assert data["init_parameters"]["reply"] == {"callable": "haystack_fusion.testing.identify_prompt"}
        copy = ScriptedChatGenerator.from_dict(data)
        assert (copy.reply, copy.fail_on, copy.generation_kwargs) == (identify_prompt, "boom", {"stop": ["\n"]})

    def test_negative_latency_is_refused(self):
        with pytest.raises(ValueError, match="latency"):
            ScriptedChatGenerator(latency=-1)

    def test_a_generator_with_settings_is_copied_with_stop_sequences(self):
        """A strategy's one-prompt chain rebuilds the generator from `to_dict`: a scripted one survives it."""
        store = InMemoryDocumentStore()
        store.write_documents(DOCUMENTS)
        llm = ScriptedChatGenerator("Paris", generation_kwargs={})
        pipeline = build_pipeline("concatenation", retriever=InMemoryBM25Retriever(store), chat_generator=llm)
        assert run_strategy(pipeline, QUERY).answer.data == "Paris"


QUERY = "Which city is the capital of France?"

DOCUMENTS = [
    Document(id="paris", content="Paris is the capital of France.", meta={"title": "Paris"}),
    Document(id="lyon", content="Lyon is the third-largest city of France.", meta={"title": "Lyon"}),
    Document(id="bread", content="Baguettes are long loaves of bread.", meta={"title": "Bread"}),
]
