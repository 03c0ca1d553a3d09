"""A German prompt and a system prompt through `OpenAIChatGenerator` on the local OpenAI-compatible test server."""

from __future__ import annotations

from typing import Any

import pytest
from haystack import Document, Pipeline
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion import FusionAnswerer, PostFusionVoter
from tests.support.openai_server import OpenAIServer

GERMAN = """Beantworte die Frage mit einer kurzen Phrase aus dem Kontext. Antworte auf Deutsch.
Frage: Wer produzierte das Album mit einer Neuaufnahme von "Lithium"?
Antwort: Butch Vig
Frage: In welchem Jahr wurde der Star von "To Hell and Back" geboren?
Antwort: 1925
Wenn du die Antwort nicht weisst, antworte nur: unbekannt
Kontext: {{ passages }}
Frage: {{ query }}
Antwort:"""

SYSTEM = "Du beantwortest Fragen zu unseren Reisefuehrern."
QUESTION = "Welcher Fluss fliesst durch Paris?"
PASSAGES = [
    Document(content="Die Seine fliesst durch Paris und muendet in den Aermelkanal."),
    Document(content="Der Rhein fliesst durch Koeln und Duesseldorf."),
]


def test_a_german_prompt_reaches_the_server_and_answers_in_german(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "not-needed-by-the-test-server")
    bodies: list[dict[str, Any]] = []

    def reply(body: dict[str, Any]) -> str:
        bodies.append(body)
        prompt = body["messages"][-1]["content"]
        return "Die Seine\n" if "Antworte auf Deutsch" in prompt and "Seine" in prompt else "unbekannt\n"

    store = InMemoryDocumentStore()
    store.write_documents(PASSAGES)
    with OpenAIServer(reply=reply, max_requests=20, lifetime=120) as server:
        llm = OpenAIChatGenerator(api_base_url=server.base_url, model="test", generation_kwargs={})
        settings = {"prompts": {"figure7": GERMAN}, "system_prompt": SYSTEM, "unknown_patterns": [r"^unbekannt$"]}
        pipe = Pipeline()
        pipe.add_component("retriever", InMemoryBM25Retriever(document_store=store, top_k=2))
        pipe.add_component("answerer", FusionAnswerer(strategy="concat_pf", chat_generator=llm, settings=settings))
        pipe.connect("retriever.documents", "answerer.documents")
        result = pipe.run({"retriever": {"query": QUESTION}, "answerer": {"query": QUESTION}})
        assert Pipeline.loads(pipe.dumps()).dumps() == pipe.dumps()

    answer = result["answerer"]["answers"][0]
    assert answer.data == "Die Seine"
    (body,) = bodies  # concatenation answered: no post-fusion fallback
    system, user = body["messages"]
    assert system == {"role": "system", "content": SYSTEM}
    assert user["role"] == "user"
    assert user["content"].startswith("Beantworte die Frage mit einer kurzen Phrase aus dem Kontext. Antworte auf")
    assert user["content"].endswith(f"Frage: {QUESTION}\nAntwort:")
    assert body["stop"] == ["\n"]  # Figure 7's stop sequence stays in force

    with pytest.raises(ValueError, match="does not use") as error:
        PostFusionVoter(chat_generator=llm, prompt=GERMAN.replace("{{ query }}", "(keine Frage)"))
    print(f"question: {QUESTION}")
    print(f"system message: {system['content']}")
    print(f"prompt received by the server (first 300 characters):\n{user['content'][:300]}")
    print(f"answer: {answer.data}")
    print(f"template without {{{{ query }}}}: ValueError: {error.value}")


def test_unbekannt_falls_back_to_post_fusion_when_the_patterns_say_so(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "not-needed-by-the-test-server")
    with OpenAIServer(reply="unbekannt\n", max_requests=20, lifetime=120) as server:
        llm = OpenAIChatGenerator(api_base_url=server.base_url, model="test", generation_kwargs={})
        settings = {"prompts": {"figure7": GERMAN}, "unknown_patterns": [r"^unbekannt$"]}
        answerer = FusionAnswerer(strategy="concat_pf", chat_generator=llm, settings=settings)
        answers = answerer.run(query="Welcher Fluss fliesst durch Berlin?", documents=PASSAGES)["answers"]
        assert server.stats.requests == 1 + len(PASSAGES)  # concatenation, then one post-fusion call per passage
    assert answers[0].data == "unknown"
