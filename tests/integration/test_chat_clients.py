"""
`haystack-fusion serve` as OpenAI's clients meet it: the server in a child process on 127.0.0.1 serving `concat_pf`
and `concatenation`, its LLM the package's OpenAI-compatible test server, asked by real client libraries, streamed and
not: the `openai` SDK, LangChain's `ChatOpenAI` (an agent framework's chat model), pydantic-ai's `Agent`, and the
`llm` command-line client in a child process. None of them is Open WebUI, so each gets OpenAI's chunks only: the answer
and its sources as plain text, no status events, no HTML, no Markdown escapes; usage where it asks; a 400 naming the
field for what no strategy can do (a forced tool call, several choices).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from haystack import Document

from haystack_fusion.backends import save_store
from tests.support.openai_server import OpenAIServer
from tests.support.serve_process import HayhooksProcess

pytest.importorskip("hayhooks", reason="the `serve` extra (pip install 'haystack-fusion[serve]')")
openai = pytest.importorskip("openai")

QUESTION = "What does post-fusion answer with?"
ANSWER = "the majority vote"
PASSAGES = [
    Document(
        content="Post-fusion answers with the majority vote of the replies (multi-tape, Computational_complexity).",
        meta={"title": "post_fusion.md"},
    ),
    Document(content="Chain-of-Note writes a reading note per passage.", meta={"title": "chain-of-note.md"}),
]
MARKUP = ("<details", "</summary>", "\\-", "\\_", '"event"')


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    index = tmp_path_factory.mktemp("clients") / "index.json"
    save_store(PASSAGES, index)
    env = {
        "HAYSTACK_FUSION_LLM": "openai",
        "HAYSTACK_FUSION_DOCUMENT_STORE": "memory",
        "HAYSTACK_FUSION_STORE": str(index),
        "HAYSTACK_FUSION_MAX_RETRIES": "0",
        "OPENAI_API_KEY": "x",
    }
    with OpenAIServer(reply=ANSWER) as llm:
        env["OPENAI_BASE_URL"] = llm.base_url
        workdir = tmp_path_factory.mktemp("server")
        with HayhooksProcess(["concat_pf", "concatenation"], env=env, workdir=workdir) as process:
            yield process


def check_plain(text: str) -> None:
    assert text.startswith(ANSWER), text
    assert "Sources:\n[1] post_fusion.md: Post-fusion answers with the majority vote" in text, text
    assert "multi-tape, Computational_complexity" in text
    for markup in MARKUP:
        assert markup not in text, (markup, text)


class TestOpenAISDK:
    def client(self, served):
        return openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused")

    def test_streamed_with_usage(self, served):
        stream = self.client(served).chat.completions.create(
            model="concat_pf",
            messages=[{"role": "user", "content": QUESTION}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert {chunk.object for chunk in chunks} == {"chat.completion.chunk"}
        check_plain("".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices))
        assert [c.choices[0].finish_reason for c in chunks if c.choices].count("stop") == 1
        assert chunks[-1].choices == []
        assert chunks[-1].usage.total_tokens == chunks[-1].usage.prompt_tokens + chunks[-1].usage.completion_tokens > 0
        sources = next(chunk for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason).model_extra
        assert sources["sources"][0]["title"] == "post_fusion.md"

    def test_unstreamed_with_usage_and_sources(self, served):
        reply = self.client(served).chat.completions.create(
            model="concat_pf",
            messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTION}],
        )
        check_plain(reply.choices[0].message.content)
        assert reply.usage.total_tokens > 0
        assert reply.model_extra["sources"][0]["content"] == PASSAGES[0].content

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("n", 3),
            ("tool_choice", "required"),
        ],
    )
    def test_what_no_strategy_can_do_is_a_400_naming_the_field(self, served, field, value):
        tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
        extra = {"tools": tools} if field == "tool_choice" else {}
        with pytest.raises(openai.BadRequestError) as refused:
            self.client(served).chat.completions.create(
                model="concatenation", messages=[{"role": "user", "content": QUESTION}], **{field: value}, **extra
            )
        assert refused.value.status_code == 400
        assert refused.value.body["param"] == field


def test_langchain_chat_openai(served):
    langchain_openai = pytest.importorskip("langchain_openai")
    chat = langchain_openai.ChatOpenAI(
        model="concat_pf", base_url=f"{served.url}/v1", api_key="unused", max_retries=0, stream_usage=True
    )
    reply = chat.invoke(QUESTION)
    check_plain(reply.content)
    assert reply.usage_metadata["total_tokens"] > 0
    chunks = list(chat.stream(QUESTION))
    check_plain("".join(chunk.content for chunk in chunks))
    assert sum((chunk.usage_metadata or {}).get("total_tokens", 0) for chunk in chunks) > 0

    def lookup(term: str) -> str:
        """Look a term up."""
        return term

    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        chat.bind_tools([lookup], tool_choice="required").invoke(QUESTION)


def test_pydantic_ai_agent(served):
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=f"{served.url}/v1", api_key="unused")
    agent = Agent(OpenAIChatModel("concat_pf", provider=provider), instructions="Answer from the sources.")
    result = agent.run_sync(QUESTION)
    check_plain(result.output)
    assert result.usage.total_tokens > 0

    async def streamed() -> str:
        async with agent.run_stream(QUESTION) as run:
            return await run.get_output()

    check_plain(asyncio.run(streamed()))


def test_the_llm_command_line_client(served, tmp_path):
    executable = shutil.which("llm", path=str(Path(sys.executable).parent))
    if executable is None:
        pytest.skip("the `llm` command-line client (the `dev` extra)")
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: fusion\n  model_name: concat_pf\n  api_base: {served.url}/v1\n", encoding="utf-8"
    )
    env = {**os.environ, "LLM_USER_PATH": str(tmp_path), "OPENAI_API_KEY": "unused"}
    for args in ((), ("--no-stream",)):
        done = subprocess.run(
            [executable, "-m", "fusion", *args, QUESTION], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        check_plain(done.stdout.strip())
