"""`strategy_tool`: a strategy over a retriever as one tool of a Haystack Agent, and the text the agent reads."""

from __future__ import annotations

import asyncio
import copy

import pytest
from haystack import Document
from haystack.components.agents import Agent
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.core.errors import PipelineError
from haystack.dataclasses import ChatMessage, ChatRole, GeneratedAnswer
from haystack.document_stores.in_memory import InMemoryDocumentStore
from haystack.tools import ComponentTool, PipelineTool

from haystack_fusion.answers import invalid_meta
from haystack_fusion.strategies import get_strategy, strategy_tool, tool_text
from haystack_fusion.testing import (
    AsyncScriptedChatGenerator,
    PromptAwareChatGenerator,
    PromptReplies,
    ScriptedChatGenerator,
    call_first_tool,
)

QUESTION = "What is the capital of France?"
DOCUMENTS = [
    Document(content="Paris is the capital of France.", meta={"title": "France"}),
    Document(content="The capital of France, Paris, lies on the Seine."),
    Document(content="Rome is the capital of Italy."),
]


@pytest.fixture
def retriever() -> InMemoryBM25Retriever:
    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    return InMemoryBM25Retriever(document_store=store, top_k=3)


def paris_if_told(prompt: str) -> str:
    return "Paris" if "Paris" in prompt else "unknown"


def ask(tool: PipelineTool) -> list[ChatMessage]:
    agent = Agent(chat_generator=MockChatGenerator(response_fn=call_first_tool), tools=[tool])
    return agent.run([ChatMessage.from_user(QUESTION)])["messages"]


class TestStrategyTool:
    def test_the_llm_fills_only_the_question(self, retriever):
        tool = strategy_tool("sure", retriever=retriever, chat_generator=ScriptedChatGenerator())
        assert isinstance(tool, ComponentTool)
        assert tool.parameters["properties"].keys() == {"query"}
        assert tool.parameters["required"] == ["query"]
        assert tool.name == "answer_with_sure"
        assert tool.description == get_strategy("sure").description

    def test_name_and_description_can_be_given(self, retriever):
        tool = strategy_tool(
            "concatenation",
            retriever=retriever,
            chat_generator=ScriptedChatGenerator(),
            name="manuals",
            description="Answers questions about our manuals.",
        )
        assert (tool.name, tool.description) == ("manuals", "Answers questions about our manuals.")

    def test_an_agent_reads_answer_sources_and_votes(self, retriever):
        llm = PromptAwareChatGenerator(PromptReplies(concatenation_unknown=1.0, choose=paris_if_told))
        messages = ask(strategy_tool("concat_pf", retriever=retriever, chat_generator=llm))
        assert [m.role for m in messages] == [ChatRole.USER, ChatRole.ASSISTANT, ChatRole.TOOL, ChatRole.ASSISTANT]
        assert messages[1].tool_call.tool_name == "answer_with_concat_pf"
        assert messages[1].tool_call.arguments == {"query": QUESTION}
        result = messages[2].tool_call_result.result
        assert result == (
            "Paris\n\nSources:\n"
            "[1] France: Paris is the capital of France.\n"
            "[2] The capital of France, Paris, lies on the Seine.\n\n"
            "Evidence: votes: {'paris': 2}"
        )
        assert messages[3].text == f"Based on the tool: {result}"
        assert llm.calls == 4  # concatenation said unknown, then one post-fusion call per passage

    def test_sure_and_chain_of_note_evidence(self, retriever):
        llm = PromptAwareChatGenerator(PromptReplies(["Paris", "Rome"]))
        sure = ask(strategy_tool("sure", retriever=retriever, chat_generator=llm))[2].tool_call_result.result
        assert sure == (  # the replies are drawn from a hash of each prompt: the same on every run
            "Rome\n\nSources:\n[1] Rome is the capital of Italy.\n\n"
            "Evidence: SuRe scores: 'Rome': v=1.0 r=1.0, 'Paris': v=0.0 r=0.0"
        )
        retriever = InMemoryBM25Retriever(document_store=retriever.document_store, top_k=3)
        notes = ask(strategy_tool("chain_of_note", retriever=retriever, chat_generator=llm))[2].tool_call_result.result
        assert "\n\nEvidence: notes: [1] " in notes
        assert notes.rstrip().endswith("answer from passages")

    def test_an_async_agent_runs_the_strategy_on_its_event_loop(self, retriever):
        llm = AsyncScriptedChatGenerator(reply="Paris")
        tool = strategy_tool("post_fusion", retriever=retriever, chat_generator=llm)
        assert tool.async_function is not None
        agent = Agent(chat_generator=MockChatGenerator(response_fn=call_first_tool), tools=[tool])
        messages = asyncio.run(agent.run_async([ChatMessage.from_user(QUESTION)]))["messages"]
        assert messages[2].tool_call_result.result.endswith("\n\nEvidence: votes: {'paris': 3}")
        assert llm.calls == 3

    def test_the_tool_and_its_agent_round_trip(self, retriever):
        tool = strategy_tool(
            "concat_pf",
            retriever=retriever,
            chat_generator=ScriptedChatGenerator("Paris"),
            settings={"max_concurrency": 2},
        )
        data = tool.to_dict()
        assert data["data"]["outputs_to_string"] == {"handler": "haystack_fusion.strategies.tool.tool_text"}
        assert PipelineTool.from_dict(copy.deepcopy(data)).to_dict() == data
        agent = Agent(chat_generator=MockChatGenerator(response_fn=call_first_tool), tools=[tool])
        saved = agent.to_dict()
        loaded = Agent.from_dict(copy.deepcopy(saved))
        assert loaded.to_dict() == saved
        result = loaded.run([ChatMessage.from_user(QUESTION)])["messages"][2].tool_call_result.result
        assert result.startswith("Paris\n\nSources:\n[1] France: Paris is the capital of France.")

    def test_errors(self, retriever):
        with pytest.raises(ValueError, match="Unknown strategy 'nope'"):
            strategy_tool("nope", retriever=retriever, chat_generator=ScriptedChatGenerator())
        with pytest.raises(ValueError, match="no field"):
            strategy_tool("sure", retriever=retriever, chat_generator=ScriptedChatGenerator(), settings={"k": 1})
        strategy_tool("sure", retriever=retriever, chat_generator=ScriptedChatGenerator())
        with pytest.raises(PipelineError):  # a component belongs to one pipeline
            strategy_tool("sure", retriever=retriever, chat_generator=ScriptedChatGenerator())


class TestToolText:
    def test_no_answer_is_unknown_with_every_passage(self):
        assert tool_text({"answers": [], "documents": DOCUMENTS[2:]}) == (
            "unknown\n\nSources:\n[1] Rome is the capital of Italy."
        )

    def test_a_rejected_answer_says_why(self):
        answer = GeneratedAnswer(data="", query=QUESTION, documents=[], meta=invalid_meta("<p", "passage markup"))
        text = tool_text({"answers": [answer], "documents": DOCUMENTS[:1]})
        assert text.startswith("(no valid answer: passage markup: '<p')\n\nSources:\n[1] France: ")


def test_call_first_tool_without_tools_says_so():
    assert call_first_tool([ChatMessage.from_user("Hi")], None).text == "No tool to call."
