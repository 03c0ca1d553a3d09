"""The Hayhooks wrappers' base: backend checks at setup, streamed rounds, answer, sources and evidence."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading

import pytest
from haystack import Document
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.dataclasses import ChatMessage, StreamingChunk
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.backends import save_store
from haystack_fusion.components.note_taker import NoteTaker
from haystack_fusion.llm import CallLimitedChatGenerator
from haystack_fusion.strategies import build_pipeline

pytest.importorskip("hayhooks", reason="the `serve` extra")

from haystack_fusion.backends.checks import BackendSetupError, check_backend
from haystack_fusion.serving.hayhooks import StrategyPipelineWrapper, chat_events, stream_strategy
from haystack_fusion.strategies.presentation import streamed_component

DOCUMENTS = [
    Document(content="Paris is the capital and largest city of France.", meta={"title": "Paris"}),
    Document(content="France is a country in Western Europe; its capital is Paris.", meta={"title": "France"}),
]
QUERY = "What is the capital of France?"
VARIABLES = (
    "HAYSTACK_FUSION_LLM",
    "HAYSTACK_FUSION_DOCUMENT_STORE",
    "HAYSTACK_FUSION_STORE",
    "HAYSTACK_FUSION_RETRIEVER",
    "HAYSTACK_FUSION_MODEL",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OLLAMA_HOST",
    "ELASTICSEARCH_URL",
)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)


def fake_llm(concatenation_reply: str = "unknown") -> MockChatGenerator:
    """Replies `concatenation_reply` to a prompt showing both passages, "Paris" to one showing a single passage."""

    def reply(messages: list[ChatMessage]) -> str:
        text = " ".join(message.text or "" for message in messages)
        return concatenation_reply if all(d.content in text for d in DOCUMENTS) else "Paris"

    return MockChatGenerator(response_fn=reply)


def pipeline_for(strategy: str, llm: MockChatGenerator):
    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    return build_pipeline(strategy, retriever=InMemoryBM25Retriever(store, top_k=2), chat_generator=llm)


async def collect(iterator) -> list:
    return [item async for item in iterator]


class TestCheckBackend:
    def test_nothing_set_names_both_choices(self):
        with pytest.raises(BackendSetupError) as error:
            check_backend()
        assert "HAYSTACK_FUSION_LLM is not set" in str(error.value)
        assert "HAYSTACK_FUSION_DOCUMENT_STORE is not set" in str(error.value)

    def test_the_old_production_recipe_is_refused_not_served_on_the_embedded_model(self, monkeypatch):
        monkeypatch.setenv("ELASTICSEARCH_URL", "http://localhost:9200")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        with pytest.raises(BackendSetupError, match="HAYSTACK_FUSION_LLM is not set"):
            check_backend()

    def test_openai_without_key_and_memory_without_index(self, monkeypatch):
        monkeypatch.setenv("HAYSTACK_FUSION_LLM", "openai")
        monkeypatch.setenv("HAYSTACK_FUSION_DOCUMENT_STORE", "memory")
        with pytest.raises(BackendSetupError) as error:
            check_backend()
        assert "needs OPENAI_API_KEY" in str(error.value)
        assert "needs HAYSTACK_FUSION_STORE" in str(error.value)

    def test_missing_index_file(self, monkeypatch, tmp_path):
        monkeypatch.setenv("HAYSTACK_FUSION_LLM", "local")
        monkeypatch.setenv("HAYSTACK_FUSION_DOCUMENT_STORE", "memory")
        monkeypatch.setenv("HAYSTACK_FUSION_STORE", str(tmp_path / "missing.json"))
        with pytest.raises(BackendSetupError, match="no saved index there"):
            check_backend()

    def test_unknown_kind_is_a_setup_error(self, monkeypatch):
        monkeypatch.setenv("HAYSTACK_FUSION_LLM", "gpt")
        monkeypatch.setenv("HAYSTACK_FUSION_DOCUMENT_STORE", "memory")
        with pytest.raises(BackendSetupError, match="`llm` must be one of local, openai, ollama"):
            check_backend()

    def test_embedded_backend_passes(self, monkeypatch, tmp_path):
        pytest.importorskip("llama_cpp", reason="the `local` extra")
        index = tmp_path / "index.json"
        save_store(DOCUMENTS, index)
        monkeypatch.setenv("HAYSTACK_FUSION_LLM", "local")
        monkeypatch.setenv("HAYSTACK_FUSION_DOCUMENT_STORE", "memory")
        monkeypatch.setenv("HAYSTACK_FUSION_STORE", str(index))
        config = check_backend()
        assert (config.llm, config.store, config.index_path) == ("local", "memory", str(index))

    def test_elasticsearch_needs_its_url_and_a_server_that_answers(self, monkeypatch, tmp_path):
        pytest.importorskip("haystack_integrations.document_stores.elasticsearch", reason="the `elasticsearch` extra")
        monkeypatch.setenv("HAYSTACK_FUSION_LLM", "openai")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        monkeypatch.setenv("HAYSTACK_FUSION_DOCUMENT_STORE", "elasticsearch")
        with pytest.raises(BackendSetupError, match="needs ELASTICSEARCH_URL"):
            check_backend()
        monkeypatch.setenv("ELASTICSEARCH_URL", f"http://127.0.0.1:{free_port()}")
        with pytest.raises(BackendSetupError, match="Elasticsearch is not reachable at ELASTICSEARCH_URL"):
            check_backend()
        assert check_backend(probe=False).store == "elasticsearch"

    def test_ollama_needs_its_host_and_the_model_pulled(self, monkeypatch):
        pytest.importorskip("haystack_integrations.components.generators.ollama", reason="the `ollama` extra")
        index_dir = pytest.importorskip("tempfile").mkdtemp()
        index = f"{index_dir}/index.json"
        save_store(DOCUMENTS, index)
        monkeypatch.setenv("HAYSTACK_FUSION_LLM", "ollama")
        monkeypatch.setenv("HAYSTACK_FUSION_DOCUMENT_STORE", "memory")
        monkeypatch.setenv("HAYSTACK_FUSION_STORE", index)
        with pytest.raises(BackendSetupError, match="needs OLLAMA_HOST"):
            check_backend()
        with fake_ollama(["llama3.2:1b"]) as url:
            monkeypatch.setenv("OLLAMA_HOST", url)
            with pytest.raises(BackendSetupError, match=r"has no model 'qwen3:0\.6b'"):
                check_backend()
            monkeypatch.setenv("HAYSTACK_FUSION_MODEL", "llama3.2:1b")
            assert check_backend().model == "llama3.2:1b"

    @pytest.mark.parametrize("strategy", ["concatenation", "concat_pf", "sure"])
    def test_every_llm_call_of_a_served_pipeline_holds_a_call_slot(self, monkeypatch, tmp_path, strategy):
        """HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT bounds a server's direct generator calls, not only its fan-outs'."""
        index = tmp_path / "index.json"
        save_store(DOCUMENTS, index)
        monkeypatch.setenv("HAYSTACK_FUSION_LLM", "openai")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{free_port()}/v1")  # never called here
        monkeypatch.setenv("HAYSTACK_FUSION_DOCUMENT_STORE", "memory")
        monkeypatch.setenv("HAYSTACK_FUSION_STORE", str(index))

        wrapper = type("Wrapper", (StrategyPipelineWrapper,), {"strategy": strategy})()
        wrapper.setup()
        generators = [
            getattr(component, "_chat_generator", component)
            for _, component in wrapper.pipeline.walk()
            if hasattr(component, "_chat_generator") or "ChatGenerator" in type(component).__name__
        ]
        assert generators
        assert all(isinstance(g, CallLimitedChatGenerator) for g in generators), generators

    def test_a_wrapper_refuses_to_set_up(self):
        class Wrapper(StrategyPipelineWrapper):
            strategy = "concat_pf"

        with pytest.raises(BackendSetupError, match="does not pick one for you"):
            Wrapper().setup()


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class fake_ollama:  # noqa: N801
    """A real HTTP server on 127.0.0.1 answering Ollama's `GET /api/tags` with the given model names."""

    def __init__(self, models: list[str]) -> None:
        body = json.dumps({"models": [{"name": name} for name in models]}).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200 if self.path == "/api/tags" else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)

    def __enter__(self) -> str:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class TestStreamStrategy:
    def test_concat_pf_falls_back_with_a_status_and_streams_no_replaced_tokens(self):
        pipeline = pipeline_for("concat_pf", fake_llm("unknown"))
        items = asyncio.run(collect(stream_strategy("concat_pf", pipeline, QUERY)))
        statuses = [(item.text, item.done) for item in items if item.kind == "status"]
        assert ("Retrieved 2 passages", True) in statuses
        assert ("Concatenation: reading the 2 passages together", False) in statuses
        assert ("Concatenation answered unknown: reading the 2 passages one by one", False) in statuses
        assert ("Post-fusion: Paris won 2 of 2 votes", True) in statuses
        assert not [item for item in items if item.kind == "token"], "concatenation's reply may be replaced"
        assert items[-1].kind == "result"
        run = items[-1].run
        assert run.answer.data == "Paris"
        assert run.evidence["fallback"] is True
        assert [stage["stage"] for stage in run.evidence["stages"]] == ["concatenation", "post_fusion"]
        assert run.usage["calls"] == 3

    def test_a_failed_concatenation_call_falls_back_with_a_status(self):
        def reply(messages: list[ChatMessage]) -> str:
            if all(d.content in messages[-1].text for d in DOCUMENTS):
                raise TimeoutError("Request timed out.")
            return "Paris"

        pipeline = pipeline_for("concat_pf", MockChatGenerator(response_fn=reply))
        items = asyncio.run(collect(stream_strategy("concat_pf", pipeline, QUERY)))
        statuses = [(item.text, item.done) for item in items if item.kind == "status"]
        assert ("Concatenation failed: reading the 2 passages one by one", False) in statuses
        run = items[-1].run
        assert run.answer.data == "Paris"
        assert run.evidence["failures"] == [{"component": "llm", "error": "TimeoutError: Request timed out."}]
        assert run.usage["calls"] == 3
        assert run.usage["failed_calls"] == 1

    def test_the_result_is_what_run_strategy_gathers(self):
        from haystack_fusion.strategies import run_strategy

        pipeline = pipeline_for("concat_pf", fake_llm("unknown"))
        streamed = asyncio.run(collect(stream_strategy("concat_pf", pipeline, QUERY)))[-1].run
        direct = run_strategy("concat_pf", pipeline_for("concat_pf", fake_llm("unknown")), QUERY)
        assert streamed.answer.data == direct.answer.data
        assert streamed.evidence == direct.evidence
        assert streamed.usage == direct.usage

    def test_concatenation_streams_its_answer_token_by_token(self):
        pipeline = pipeline_for("concatenation", fake_llm("Paris is the capital"))
        assert streamed_component("concatenation", pipeline) == "llm"
        items = asyncio.run(collect(stream_strategy("concatenation", pipeline, QUERY)))
        tokens = [item.text for item in items if item.kind == "token"]
        assert tokens == ["Paris ", "is ", "the ", "capital"]
        kinds = [item.kind for item in items]
        assert kinds.index("token") > kinds.index("status")
        assert items[-1].run.answer.data == "Paris is the capital"

    def test_no_token_streaming_where_the_answer_is_a_vote_or_a_selection(self):
        assert streamed_component("post_fusion", pipeline_for("post_fusion", fake_llm())) is None
        assert streamed_component("cascade", pipeline_for("cascade", fake_llm())) is None
        assert streamed_component("pf_concat", pipeline_for("pf_concat", fake_llm())) == "llm"

    def test_empty_question_is_refused_before_anything_runs(self):
        pipeline = pipeline_for("concat_pf", fake_llm())
        with pytest.raises(ValueError, match="non-empty question"):
            asyncio.run(collect(stream_strategy("concat_pf", pipeline, "  ")))


class TestChatEvents:
    def test_order_status_answer_sources_details(self):
        pipeline = pipeline_for("concat_pf", fake_llm("unknown"))
        events = asyncio.run(collect(chat_events("concat_pf", pipeline, QUERY)))
        kinds = [
            getattr(event, "type", None) or ("details" if "<details" in event.content else "text") for event in events
        ]
        assert kinds[0] == "status"
        first_text = kinds.index("text")
        assert set(kinds[:first_text]) == {"status"}
        assert events[first_text].content == "Paris"
        sources = [event for event in events if getattr(event, "type", None) == "source"]
        assert [event.data["source"]["name"] for event in sources] == ["[1] Paris", "[2] France"]
        assert sources[0].data["document"] == [DOCUMENTS[0].content]
        assert kinds[-1] == "details"
        details = events[-1].content
        assert '<details type="evidence" done="true">' in details
        assert "**Stages**" in details
        assert "concatenation: passed on (unknown answer)" in details
        assert "**Votes**: paris 2" in details

    def test_a_streamed_reply_that_differs_from_the_extracted_answer_is_followed_by_it(self):
        pipeline = pipeline_for("concatenation", fake_llm("Paris\nQuestion: what else?"))
        events = asyncio.run(collect(chat_events("concatenation", pipeline, QUERY)))
        text = "".join(event.content for event in events if isinstance(event, StreamingChunk))
        assert text.startswith("Paris\nQuestion: what else?\n\nAnswer: Paris\n\n<details")


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
        assert streamed_component("chain_of_note_per_document", pipeline) == "note_taker"
        assert streamed_component("chain_of_note", pipeline_for("chain_of_note", fake_llm())) is None
        items = asyncio.run(collect(stream_strategy("chain_of_note_per_document", pipeline, QUERY)))
        assert [item.text for item in items if item.kind == "token"] == ["Paris"]
