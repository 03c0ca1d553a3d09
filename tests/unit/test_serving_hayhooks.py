"""The Hayhooks wrappers' base: backend checks at setup, streamed rounds, answer, sources and evidence."""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest
from haystack import Document, component
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.dataclasses import ChatMessage, StreamingChunk
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.backends.config import BackendConfig
from haystack_fusion.breaker import CircuitBreaker
from haystack_fusion.components.note_taker import NoteTaker
from haystack_fusion.failures import CallFailure
from haystack_fusion.llm import CallLimitedChatGenerator
from haystack_fusion.strategies import build_pipeline

pytest.importorskip("hayhooks", reason="the `serve` extra")

from fastapi import HTTPException
from fastapi_openai_compat import ChatCompletion
from hayhooks.server.utils.request_headers import accepts_request_headers
from starlette.datastructures import Headers

from haystack_fusion.serving.hayhooks import (
    CHAINLIT_ELEMENTS_DIR,
    EVIDENCE_ELEMENT,
    AdmissionLimit,
    ServingLimits,
    StrategyPipelineWrapper,
    chat_events,
    stream_strategy,
)
from haystack_fusion.serving.presentation import streamed_component
from haystack_fusion.serving.protocol import CHAT_UI_CLIENT, CHAT_UI_HEADER
from tests.unit.scripted_calls import DOCUMENTS, fake_llm

QUERY = "What is the capital of France?"
OPEN_WEBUI = Headers({"User-Agent": "Python/3.11 aiohttp/3.12.15", "Content-Type": "application/json"})
"""What Open WebUI's requests carry (tests/fixtures/open_webui)."""


def pipeline_for(strategy: str, llm: MockChatGenerator):
    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    return build_pipeline(strategy, retriever=InMemoryBM25Retriever(store, top_k=2), chat_generator=llm)


async def collect(iterator) -> list:
    return [item async for item in iterator]


def wrapper_for(strategy: str, llm, *, limits: ServingLimits | None = None) -> StrategyPipelineWrapper:
    """A wrapper of `strategy` set up as `setup` does, on `llm` over `DOCUMENTS` (no backend check, no model)."""
    wrapper_class = type("Wrapper", (StrategyPipelineWrapper,), {"strategy": strategy})
    wrapper = wrapper_class()
    wrapper.config = BackendConfig(llm="openai", api_base_url="http://127.0.0.1:9/v1")
    wrapper.generator = wrapper.llm = llm
    wrapper.pipeline = pipeline_for(strategy, llm)
    wrapper.limits = limits or ServingLimits()
    wrapper.admission = AdmissionLimit(
        max_requests=wrapper.limits.max_requests,
        max_waiting=wrapper.limits.max_waiting,
        queue_timeout=wrapper.limits.queue_timeout,
    )
    return wrapper


class TestStreamStrategy:
    def test_concat_pf_falls_back_with_a_status_and_streams_no_replaced_tokens(self):
        pipeline = pipeline_for("concat_pf", fake_llm("unknown"))
        items = asyncio.run(collect(stream_strategy(pipeline, QUERY)))
        statuses = [(item.text, item.done) for item in items if item.kind == "status"]
        assert ("Retrieved 2 passages", True) in statuses
        assert ("Concatenation: reading the 2 passages together", False) in statuses
        assert ("Concatenation answered unknown: reading the 2 passages one by one", False) in statuses
        assert ("Post-fusion: Paris won 2 of 2 votes", True) in statuses
        assert not [item for item in items if item.kind == "token"], "concatenation's reply may be replaced"
        assert items[-1].kind == "result"
        run = items[-1].run
        assert run.answer.data == "Paris"
        assert run.evidence.fallback is True
        assert [stage["stage"] for stage in run.evidence.to_dict()["stages"]] == ["concatenation", "post_fusion"]
        assert run.usage.calls == 3

    def test_a_failed_concatenation_call_falls_back_with_a_status(self):
        def reply(messages: list[ChatMessage]) -> str:
            if all(d.content in messages[-1].text for d in DOCUMENTS):
                raise TimeoutError("Request timed out.")
            return "Paris"

        pipeline = pipeline_for("concat_pf", MockChatGenerator(response_fn=reply))
        items = asyncio.run(collect(stream_strategy(pipeline, QUERY)))
        statuses = [(item.text, item.done) for item in items if item.kind == "status"]
        assert ("Concatenation failed: reading the 2 passages one by one", False) in statuses
        run = items[-1].run
        assert run.answer.data == "Paris"
        assert run.failures == [CallFailure("timeout", "TimeoutError", "Request timed out.", component="llm")]
        assert run.usage.calls == 3
        assert run.usage.failed_calls == 1

    def test_the_result_is_what_run_strategy_gathers(self):
        from haystack_fusion.strategies import run_strategy

        pipeline = pipeline_for("concat_pf", fake_llm("unknown"))
        streamed = asyncio.run(collect(stream_strategy(pipeline, QUERY)))[-1].run
        direct = run_strategy(pipeline_for("concat_pf", fake_llm("unknown")), QUERY)
        assert streamed.answer.data == direct.answer.data
        assert streamed.evidence == direct.evidence
        assert streamed.usage == direct.usage

    def test_concatenation_streams_its_answer_token_by_token(self):
        pipeline = pipeline_for("concatenation", fake_llm("Paris is the capital"))
        assert streamed_component(pipeline) == "llm"
        items = asyncio.run(collect(stream_strategy(pipeline, QUERY)))
        tokens = [item.text for item in items if item.kind == "token"]
        assert tokens == ["Paris ", "is ", "the ", "capital"]
        kinds = [item.kind for item in items]
        assert kinds.index("token") > kinds.index("status")
        assert items[-1].run.answer.data == "Paris is the capital"

    def test_no_token_streaming_where_the_answer_is_a_vote_or_a_selection(self):
        assert streamed_component(pipeline_for("post_fusion", fake_llm())) is None
        assert streamed_component(pipeline_for("cascade", fake_llm())) is None
        assert streamed_component(pipeline_for("pf_concat", fake_llm())) == "llm"

    def test_empty_question_is_a_400_before_anything_runs(self):
        wrapper = wrapper_for("concat_pf", FailingGenerator(AssertionError("no call expected")))
        with pytest.raises(HTTPException, match="non-empty question") as refused:
            asyncio.run(wrapper.run_api_async("  "))
        assert refused.value.status_code == 400


class TestChatEvents:
    def test_order_status_answer_sources_details(self):
        pipeline = pipeline_for("concat_pf", fake_llm("unknown"))
        events = asyncio.run(collect(chat_events(pipeline, QUERY)))
        kinds = [
            getattr(event, "type", None) or ("details" if "<details" in event.content else "text") for event in events
        ]
        assert kinds[0] == "status"
        first_text = kinds.index("text")
        assert set(kinds[:first_text]) == {"status"}
        assert events[first_text].content == "Paris"
        sources = [event for event in events if getattr(event, "type", None) == "source"]
        assert [event.data["source"]["name"] for event in sources] == ["Paris", "France"]  # Open WebUI numbers them
        assert sources[0].data["document"] == [DOCUMENTS[0].content]
        assert kinds[-1] == "details"
        details = events[-1].content
        assert '<details type="evidence" done="true">' in details
        assert "**Stages**" in details
        assert "concatenation: passed on (unknown answer)" in details
        assert "**Votes**: paris 2" in details

    def test_a_streamed_reply_that_differs_from_the_extracted_answer_is_followed_by_it(self):
        pipeline = pipeline_for("concatenation", fake_llm("Paris\nQuestion: what else?"))
        events = asyncio.run(collect(chat_events(pipeline, QUERY)))
        text = "".join(event.content for event in events if isinstance(event, StreamingChunk))
        assert text.startswith("Paris\nQuestion: what else?\n\nAnswer: Paris\n\n<details")


class TestChatUiEvents:
    """The embedded Chainlit chat UI: its message is the answer, its sources and evidence one custom element."""

    def test_the_message_is_the_answer_and_the_evidence_one_custom_element(self):
        pipeline = pipeline_for("concat_pf", fake_llm("unknown"))
        events = asyncio.run(collect(chat_events(pipeline, QUERY, dialect="chainlit")))
        text = "".join(event.content for event in events if isinstance(event, StreamingChunk))
        assert text == "Paris"
        types = [event.type for event in events if not isinstance(event, StreamingChunk)]
        assert "source" not in types
        assert types[-1] == "custom_element"
        element = events[-1]
        assert element.data["name"] == EVIDENCE_ELEMENT
        assert (CHAINLIT_ELEMENTS_DIR / f"{EVIDENCE_ELEMENT}.jsx").is_file()
        props = element.data["props"]
        assert props["summary"] == "Sources and evidence (3 LLM calls)"
        assert [(s["index"], s["title"], s["supporting"]) for s in props["sources"]] == [
            (1, "Paris", True),
            (2, "France", True),
        ]
        assert props["sources"][0]["excerpt"] == DOCUMENTS[0].content
        assert props["stages"] == ["concatenation: passed on (unknown answer)", "post_fusion: answered"]
        assert "votes: {'paris': 2}" in props["evidence"]
        assert props["usage"].startswith("3 LLM calls in 2 rounds, ")
        assert json.loads(json.dumps(props)) == props

    def test_a_passage_that_neither_voted_for_the_answer_nor_holds_it_is_listed_as_retrieved(self):
        documents = [
            *DOCUMENTS,
            Document(content="Lyon is a city in France, known for its food.", meta={"title": "Lyon"}),
        ]

        def reply(messages: list[ChatMessage]) -> str:
            return "unknown" if "Lyon" in (messages[-1].text or "") else "Paris"

        store = InMemoryDocumentStore()
        store.write_documents(documents)
        retriever = InMemoryBM25Retriever(store, top_k=3)
        llm = MockChatGenerator(response_fn=reply)
        pipeline = build_pipeline("post_fusion", retriever=retriever, chat_generator=llm)
        events = asyncio.run(collect(chat_events(pipeline, "Which city in France?", dialect="chainlit")))
        sources = {s["title"]: s["supporting"] for s in events[-1].data["props"]["sources"]}
        assert sources == {"Paris": True, "France": True, "Lyon": False}
        assert events[-1].data["props"]["stages"] == []

    def test_open_webui_gets_no_custom_element(self):
        pipeline = pipeline_for("concat_pf", fake_llm("unknown"))
        events = asyncio.run(collect(chat_events(pipeline, QUERY)))
        assert "custom_element" not in [getattr(event, "type", None) for event in events]

    def test_the_wrapper_takes_the_request_headers_and_tells_the_chat_ui_by_its_header(self):
        class Wrapper(StrategyPipelineWrapper):
            strategy = "concat_pf"

        assert accepts_request_headers(Wrapper().run_chat_completion_async)

        def reply_for(headers: Headers | None) -> list:
            wrapper = wrapper_for("concat_pf", fake_llm("unknown"))

            async def ask() -> list:
                messages = [{"role": "user", "content": QUERY}]
                stream = await wrapper.run_chat_completion_async("concat_pf", messages, {"stream": True}, headers)
                return await collect(stream)

            return asyncio.run(ask())

        chat_ui = reply_for(Headers({CHAT_UI_HEADER: CHAT_UI_CLIENT}))
        assert chat_ui[-1].type == "custom_element"
        for headers in (OPEN_WEBUI, Headers({"X-OpenWebUI-Chat-Id": "1"})):
            assert "<details" in reply_for(headers)[-1].content
        for headers in (None, Headers({"User-Agent": "OpenAI/Python 2.8.1"})):
            assert all(isinstance(chunk, ChatCompletion) for chunk in reply_for(headers))


class TestNoteTakerStreaming:
    def test_per_document_streams_only_the_synthesis_call(self):
        def reply(messages: list[ChatMessage]) -> str:
            text = messages[-1].text or ""
            return "The passage says Paris is the capital. Relevant: direct" if "Document" in text else "Paris"

        chunks: list[str] = []
        taker = NoteTaker(chat_generator=MockChatGenerator(response_fn=reply), mode="per_document")
        result = taker.run(query=QUERY, documents=DOCUMENTS, streaming_callback=lambda c: chunks.append(c.content))
        calls = result["answers"][0].meta["usage"]["calls"]
        assert calls == 3
        assert "".join(chunks) == "Paris"
        assert result["answers"][0].data == "Paris"

    def test_init_callback_and_serialization(self):
        taker = NoteTaker(chat_generator=MockChatGenerator(responses=["x"]), streaming_callback=print)
        data = taker.to_dict()
        assert data["init_parameters"]["streaming_callback"] == "builtins.print"
        assert NoteTaker.from_dict(data).streaming_callback is print

    def test_chain_of_note_per_document_streams_through_the_pipeline(self):
        pipeline = pipeline_for("chain_of_note_per_document", fake_llm())
        assert streamed_component(pipeline) == "note_taker"
        assert streamed_component(pipeline_for("chain_of_note", fake_llm())) is None
        items = asyncio.run(collect(stream_strategy(pipeline, QUERY)))
        assert [item.text for item in items if item.kind == "token"] == ["Paris"]


@component
class FailingGenerator:
    """A chat generator whose every call fails with `error`."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], generation_kwargs: dict | None = None) -> dict:
        raise self.error

    @component.output_types(replies=list[ChatMessage])
    async def run_async(self, messages: list[ChatMessage], generation_kwargs: dict | None = None) -> dict:
        raise self.error


class UpstreamError(RuntimeError):
    """What an HTTP client raises for an error status (as `openai.BadRequestError` carries `status_code`)."""

    status_code = 400


def stream(wrapper: StrategyPipelineWrapper, messages: list[dict], headers=OPEN_WEBUI) -> list:
    async def ask() -> list:
        events = await wrapper.run_chat_completion_async(wrapper.strategy, messages, {"stream": True}, headers)
        return await collect(events)

    return asyncio.run(ask())


def statuses(events: list) -> list[str]:
    return [event.data.description for event in events if getattr(event, "type", None) == "status"]


def text_of(events: list) -> str:
    return "".join(event.content for event in events if isinstance(event, StreamingChunk))


class TestChatCompletions:
    def test_a_background_task_is_one_plain_call_outside_the_admission_limit(self):
        prompts: list[str] = []

        def reply(messages: list[ChatMessage]) -> str:
            prompts.append(messages[-1].text or "")
            return '{"title": "Capitals"}'

        wrapper = wrapper_for("cascade", MockChatGenerator(response_fn=reply), limits=ServingLimits(max_requests=1))
        task = "### Task:\nGenerate a concise title.\n<chat_history>\nUSER: What is the capital of France?"

        async def ask() -> str:
            async with wrapper.admission.slot():  # another question holds the one slot
                return await wrapper.run_chat_completion_async("cascade", [{"role": "user", "content": task}], {})

        reply = asyncio.run(ask())
        assert reply.choices[0].message.content == '{"title": "Capitals"}'
        assert reply.usage["total_tokens"] == reply.usage["prompt_tokens"] + reply.usage["completion_tokens"] > 0
        assert prompts == [task]  # no retrieval, no strategy prompt

    def test_a_follow_up_is_read_as_a_standalone_question(self):
        prompts: list[str] = []

        def reply(messages: list[ChatMessage]) -> str:
            text = messages[-1].text or ""
            prompts.append(text)
            if text.endswith("Standalone question:"):
                return " What is the capital of France?"
            return "Paris"

        wrapper = wrapper_for("concatenation", MockChatGenerator(response_fn=reply))
        messages = [
            {"role": "user", "content": "Tell me about France."},
            {"role": "assistant", "content": "A country in Western Europe."},
            {"role": "user", "content": [{"type": "text", "text": "And its capital?"}]},
        ]
        events = stream(wrapper, messages)
        assert "Standalone question: What is the capital of France?" in statuses(events)
        assert text_of(events).startswith("Paris")
        assert "**Question** (from the chat): What is the capital of France?" in text_of(events)
        assert "2 LLM calls in 2 rounds" in text_of(events)  # the rewrite is counted
        assert "Question: What is the capital of France?" in prompts[-1]

        plain = asyncio.run(wrapper.run_chat_completion_async("concatenation", messages, {}))
        assert plain.choices[0].message.content.startswith("Paris\n\nSources:\n[1] Paris: ")

    def test_the_answer_time_includes_the_rewrite(self):
        def reply(messages: list[ChatMessage]) -> str:
            if (messages[-1].text or "").endswith("Standalone question:"):
                time.sleep(0.3)
                return " What is the capital of France?"
            return "Paris"

        wrapper = wrapper_for("concatenation", MockChatGenerator(response_fn=reply))
        messages = [
            {"role": "user", "content": "Tell me about France."},
            {"role": "assistant", "content": "A country in Western Europe."},
            {"role": "user", "content": "And its capital?"},
        ]
        answered = next(status for status in statuses(stream(wrapper, messages)) if status.startswith("Answered in"))
        assert float(answered.split()[2]) >= 0.3, answered

    def test_no_rewrite_for_the_first_turn(self):
        prompts: list[str] = []

        def reply(messages: list[ChatMessage]) -> str:
            prompts.append(messages[-1].text or "")
            return "Paris"

        events = stream(
            wrapper_for("concatenation", MockChatGenerator(response_fn=reply)), [{"role": "user", "content": QUERY}]
        )
        assert len(prompts) == 1
        assert not [status for status in statuses(events) if status.startswith("Standalone")]

    def test_when_every_call_fails_the_stream_ends_in_an_error_not_an_answer(self, caplog):
        openai = pytest.importorskip("openai")
        httpx = pytest.importorskip("httpx")
        refused = openai.APIConnectionError(request=httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions"))
        wrapper = wrapper_for("cascade", FailingGenerator(refused))
        events = stream(wrapper, [{"role": "user", "content": QUERY}])
        assert "unknown" not in text_of(events).lower()
        assert statuses(events)[-1].startswith("Failed: ")
        chunk = events[-1]
        assert chunk.choices == []
        error = chunk.model_dump()["error"]
        assert (error["type"], error["code"]) == ("server_error", "backend_unavailable")
        assert error["message"] == "The language model server cannot be reached; try again later"
        with pytest.raises(HTTPException) as unstreamed:
            asyncio.run(wrapper.run_chat_completion_async("cascade", [{"role": "user", "content": QUERY}], {}))
        assert unstreamed.value.status_code == 503
        assert unstreamed.value.detail == error["message"]  # the same failure, streamed or not
        assert unstreamed.value.headers == {"x-should-retry": "false"}  # no breaker open: no Retry-After
        assert unstreamed.value.logged == (  # the app's one line for the request (serving.logs)
            "The language model server cannot be reached; try again later (cause: cannot connect to the "
            "OpenAI-compatible server at http://127.0.0.1:9/v1: check --api-base-url or $OPENAI_BASE_URL, and that the "
            "server is running)"
        )
        streamed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Ended a streamed reply")]
        assert streamed == [f"Ended a streamed reply with HTTP 503 backend_unavailable: {unstreamed.value.logged}"]

    def test_a_failing_llm_server_opens_its_breaker_and_the_next_questions_fail_at_once(self):
        calls: list[int] = []

        class ServerError(RuntimeError):
            status_code = 500

        def reply(_messages: list[ChatMessage]) -> str:
            calls.append(1)
            raise ServerError("Error code: 500 - upstream trouble")

        breaker = CircuitBreaker("test failing server", failure_threshold=3, cooldown=60)
        llm = CallLimitedChatGenerator(chat_generator=MockChatGenerator(response_fn=reply), breaker=breaker)
        wrapper = wrapper_for("concat_pf", llm)
        wrapper.breakers = (breaker,)
        question = [{"role": "user", "content": QUERY}]
        events = stream(wrapper, question)  # concatenation's call, then post-fusion's 2: all fail, the breaker opens
        assert len(calls) == 3
        assert breaker.state == "open"
        failing = r"The language model server is failing: HTTP 500 Internal Server Error; try again in (5\d|60) s"
        assert statuses(events)[-2] == "Concatenation failed: reading the 2 passages one by one"
        assert re.fullmatch(f"Failed: {failing}", statuses(events)[-1])
        events = stream(wrapper, question)  # refused by the breaker: never sent
        assert re.fullmatch(failing, events[-1].model_dump()["error"]["message"])
        with pytest.raises(HTTPException) as refused:
            asyncio.run(wrapper.run_chat_completion_async("concat_pf", question, {}))
        assert refused.value.status_code == 503
        assert re.fullmatch(failing, refused.value.detail)
        assert refused.value.headers["x-should-retry"] == "false"
        assert 50 <= int(refused.value.headers["Retry-After"]) <= 60
        assert len(calls) == 3

    def test_an_error_the_backend_answered_with_a_status_is_a_502_streamed_or_not(self):
        wrapper = wrapper_for("concatenation", FailingGenerator(UpstreamError("context length exceeded")))
        events = stream(wrapper, [{"role": "user", "content": QUERY}])
        error = events[-1].model_dump()["error"]
        assert error["code"] == "llm_error"
        assert "UpstreamError (HTTP 400)" in error["message"]
        assert "context length" not in error["message"]  # the server's text stays in the log
        with pytest.raises(HTTPException) as refused:
            asyncio.run(wrapper.run_chat_completion_async("concatenation", [{"role": "user", "content": QUERY}], {}))
        assert (refused.value.status_code, refused.value.detail) == (502, error["message"])

    @pytest.mark.parametrize(
        ("content", "message"),
        [
            ("Who is \ud800?", "not valid Unicode text"),
            ([{"type": "image_url", "image_url": {"url": "data:,"}}], "content parts of type image_url"),
            ("x" * 2001, "this server answers questions of at most 2000 characters"),
        ],
    )
    def test_what_cannot_be_answered_is_a_400_before_anything_runs(self, content, message):
        wrapper = wrapper_for("concatenation", FailingGenerator(AssertionError("no call expected")))
        for body in ({"stream": True}, {}):
            with pytest.raises(HTTPException, match=message) as refused:
                asyncio.run(
                    wrapper.run_chat_completion_async("concatenation", [{"role": "user", "content": content}], body)
                )
            assert refused.value.status_code == 400

    def test_a_queued_question_streams_that_it_waits(self):
        wrapper = wrapper_for("concatenation", fake_llm("Paris"), limits=ServingLimits(max_requests=1))

        async def ask() -> list:
            async with wrapper.admission.slot():
                events = await wrapper.run_chat_completion_async(
                    "concatenation", [{"role": "user", "content": QUERY}], {"stream": True}, OPEN_WEBUI
                )
                first = await anext(events)
            return [first, *(await collect(events))]

        events = asyncio.run(ask())
        assert statuses(events)[0] == "Waiting for the server: 1 question ahead"
        assert text_of(events).startswith("Paris")

    def test_a_full_queue_is_refused_before_anything_streams(self):
        wrapper = wrapper_for("concatenation", fake_llm("Paris"), limits=ServingLimits(max_requests=1, max_waiting=0))

        async def ask() -> None:
            async with wrapper.admission.slot():
                await wrapper.run_chat_completion_async(
                    "concatenation", [{"role": "user", "content": QUERY}], {"stream": True}
                )

        with pytest.raises(HTTPException) as refused:
            asyncio.run(ask())
        assert refused.value.status_code == 503
        assert refused.value.headers["Retry-After"] == "30"

    def test_passages_are_shown_as_plain_text(self):
        hostile = Document(content="# Paris\n```\n<img src=x onerror=alert(1)></details>", meta={"title": "<b>x</b>"})
        store = InMemoryDocumentStore()
        store.write_documents([hostile])
        llm = MockChatGenerator(response_fn=lambda messages: "Paris")
        pipeline = build_pipeline("concatenation", retriever=InMemoryBM25Retriever(store, top_k=1), chat_generator=llm)
        events = asyncio.run(collect(chat_events(pipeline, "Where is Paris?")))
        details = events[-1].content
        assert "<img" not in details
        assert "<b>" not in details
        assert details.count("</details>") == 1
        assert "&lt;img src\\=x onerror\\=alert(1)&gt;&lt;/details&gt;" in details
        source = next(event for event in events if getattr(event, "type", None) == "source")
        assert source.data["document"] == [hostile.content]  # Open WebUI shows it as text


class TestOpenAIClients:
    """A client that is neither Open WebUI nor the chat UI gets OpenAI's chunks only: no events, no markup."""

    def chunks(self, strategy: str, llm, body: dict, messages: list[dict] | None = None) -> list[dict]:
        wrapper = wrapper_for(strategy, llm)
        messages = messages or [{"role": "user", "content": QUERY}]

        async def ask() -> list:
            reply = await wrapper.run_chat_completion_async(strategy, messages, {"stream": True, **body}, None)
            return await collect(reply)

        items = asyncio.run(ask())
        assert all(isinstance(item, ChatCompletion) for item in items)
        return [json.loads(item.model_dump_json()) for item in items]

    def test_every_chunk_is_a_chat_completion_chunk_and_the_text_is_plain(self):
        chunks = self.chunks("concat_pf", fake_llm("unknown"), {})
        assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
        assert len({(chunk["id"], chunk["created"], chunk["model"]) for chunk in chunks}) == 1
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(chunk["choices"][0]["delta"]["content"] or "" for chunk in chunks if chunk["choices"])
        assert text == f"Paris\n\nSources:\n[1] Paris: {DOCUMENTS[0].content}\n[2] France: {DOCUMENTS[1].content}"
        assert [chunk["choices"][0]["finish_reason"] for chunk in chunks].count("stop") == 1
        last = chunks[-1]
        assert last["choices"][0]["finish_reason"] == "stop"
        assert [(s["index"], s["title"], s["supporting"]) for s in last["sources"]] == [
            (1, "Paris", True),
            (2, "France", True),
        ]
        assert last["usage"] is None  # not asked for

    def test_usage_comes_last_when_asked_for(self):
        counted = MockChatGenerator(
            response_fn=lambda messages: "Paris", meta={"usage": {"prompt_tokens": 10, "completion_tokens": 2}}
        )
        chunks = self.chunks("concatenation", counted, {"stream_options": {"include_usage": True}})
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
        assert all(chunk["usage"] is None for chunk in chunks[:-1])

    def test_a_follow_up_with_no_passages_has_no_bare_sources_line(self):
        wrapper = wrapper_for("concatenation", fake_llm("Paris"))
        empty = InMemoryBM25Retriever(InMemoryDocumentStore(), top_k=2)
        wrapper.pipeline = build_pipeline("concatenation", retriever=empty, chat_generator=fake_llm("Paris"))
        reply = asyncio.run(
            wrapper.run_chat_completion_async("concatenation", [{"role": "user", "content": QUERY}], {})
        )
        assert "Sources:" not in reply.choices[0].message.content
        assert reply.model_dump()["sources"] == []

    def test_a_failure_ends_the_stream_with_an_error_chunk_only(self):
        chunks = self.chunks("concatenation", FailingGenerator(UpstreamError("context length exceeded")), {})
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["error"]["code"] == "llm_error"
        text = "".join(chunk["choices"][0]["delta"]["content"] or "" for chunk in chunks if chunk["choices"])
        assert text == ""

    def test_unstreamed_reply_has_usage_and_sources(self):
        wrapper = wrapper_for("concat_pf", fake_llm("unknown"))
        reply = asyncio.run(wrapper.run_chat_completion_async("concat_pf", [{"role": "user", "content": QUERY}], {}))
        body = json.loads(reply.model_dump_json())
        assert body["object"] == "chat.completion"
        assert body["id"].startswith("chatcmpl-")
        assert set(body["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
        assert body["choices"][0]["message"]["content"].startswith("Paris\n\nSources:\n[1] Paris: ")
        assert "<details" not in body["choices"][0]["message"]["content"]
        assert [source["title"] for source in body["sources"]] == ["Paris", "France"]

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("n", 3),
            ("tool_choice", "required"),
            ("tool_choice", {"type": "function", "function": {"name": "lookup"}}),
            ("response_format", {"type": "json_object"}),
            ("logprobs", True),
        ],
    )
    def test_what_no_strategy_can_do_is_a_400_naming_the_field(self, field, value):
        wrapper = wrapper_for("concatenation", FailingGenerator(AssertionError("no call expected")))
        for stream_flag in (True, False):
            body = {"stream": stream_flag, field: value}
            with pytest.raises(HTTPException) as refused:
                asyncio.run(
                    wrapper.run_chat_completion_async("concatenation", [{"role": "user", "content": QUERY}], body)
                )
            assert (refused.value.status_code, refused.value.param) == (400, field)
