"""
An Agent with one `strategy_tool` per strategy, its LLM and the strategies' an `OpenAIChatGenerator` on the local
OpenAI-compatible test server (`tests.support.openai_server`: tool calls by `agent_turn`, answers by `PromptReplies`).

The run's transcript (every message of the Agent's result) is printed (`-s` shows it) and written to the file
$HAYSTACK_FUSION_TRANSCRIPT names, when set:

    HAYSTACK_FUSION_TRANSCRIPT=/work/measure/agent_transcript.txt pytest -s tests/integration/test_agent_tool.py
"""

from __future__ import annotations

import os
from pathlib import Path

from haystack import Document
from haystack.components.agents import Agent
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.dataclasses import ChatMessage
from haystack.document_stores.in_memory import InMemoryDocumentStore
from haystack.utils import Secret

from haystack_fusion.strategies import strategy_tool
from haystack_fusion.testing import PromptReplies
from tests.support.openai_server import OpenAIServer

QUESTION = "What is the capital of France?"
DOCUMENTS = [
    Document(content="Paris is the capital of France.", meta={"title": "France"}),
    Document(content="The capital of France, Paris, lies on the Seine.", meta={"title": "Seine"}),
    Document(content="Rome is the capital of Italy.", meta={"title": "Italy"}),
]


def paris_if_told(prompt: str) -> str:
    return "Paris" if "Paris" in prompt else "unknown"


def transcript(messages: list[ChatMessage]) -> str:
    """Every message: its role, then its text, tool calls (name and arguments) and tool results."""
    lines = []
    for index, message in enumerate(messages, start=1):
        lines.append(f"--- [{index}] {message.role.value}")
        if message.text:
            lines.append(message.text)
        lines += [f"tool call: {call.tool_name}({call.arguments})" for call in message.tool_calls]
        for result in message.tool_call_results:
            lines += [f"tool result of {result.origin.tool_name}:", str(result.result)]
    return "\n".join(lines) + "\n"


def test_an_agent_answers_with_a_strategy_tool_on_the_server(tmp_path):
    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    replies = PromptReplies(concatenation_unknown=1.0, choose=paris_if_told)
    with OpenAIServer(reply=replies) as server:

        def llm() -> OpenAIChatGenerator:
            return OpenAIChatGenerator(api_base_url=server.base_url, api_key=Secret.from_token("x"), model="test")

        tools = [
            strategy_tool(name, retriever=InMemoryBM25Retriever(document_store=store, top_k=3), chat_generator=llm())
            for name in ("concat_pf", "sure")
        ]
        agent = Agent(chat_generator=llm(), tools=tools)
        messages = agent.run([ChatMessage.from_user(QUESTION)])["messages"]
        requests = server.stats.requests

    text = transcript(messages)
    print(text)
    (Path(os.environ.get("HAYSTACK_FUSION_TRANSCRIPT") or tmp_path / "transcript.txt")).write_text(text)
    assert [message.role.value for message in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1].tool_calls[0].tool_name == "answer_with_concat_pf"
    assert messages[1].tool_calls[0].arguments == {"query": QUESTION}
    result = messages[2].tool_call_result.result
    assert result == (
        "Paris\n\nSources:\n"
        "[1] France: Paris is the capital of France.\n"
        "[2] Seine: The capital of France, Paris, lies on the Seine.\n\n"
        "Evidence: votes: {'paris': 2}"
    )
    assert messages[3].text == f"Based on the tool: {result}"
    assert requests == 2 + 1 + 3  # the agent's two turns; concatenation said unknown, then post-fusion per passage
