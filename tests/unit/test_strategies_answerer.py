"""FusionAnswerer: every registered strategy as one SuperComponent after one's own retriever."""

import pytest
from haystack import Document, Pipeline
from haystack.components.generators.chat import MockChatGenerator
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion import FusionAnswerer
from haystack_fusion.strategies import STRATEGIES, build_pipeline, get_strategy, run_strategy

QUERY = "What is the capital of France?"
DOCUMENTS = [
    Document(id="paris", content="Paris is the capital of France."),
    Document(id="lyon", content="Lyon is a city in France."),
]


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_answers_as_the_strategy_pipeline_does(strategy):
    answerer = FusionAnswerer(strategy=strategy, chat_generator=MockChatGenerator(responses=["Paris"]))
    got = answerer.run(query=QUERY, documents=DOCUMENTS)["answers"]

    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    pipeline = build_pipeline(
        strategy,
        retriever=InMemoryBM25Retriever(document_store=store, top_k=2),
        chat_generator=MockChatGenerator(responses=["Paris"]),
    )
    expected = run_strategy(pipeline, QUERY).answers
    assert [answer.data for answer in got] == [answer.data for answer in expected]
    assert set(answerer.output_mapping.values()) == {"answers"}
    assert answerer.output_mapping == {f"{get_strategy(strategy).answer_component}.answers": "answers"}


def test_round_trips_through_yaml_inside_a_pipeline():
    pipeline = Pipeline()
    pipeline.add_component(
        "answerer",
        FusionAnswerer(
            strategy="concat_pf",
            chat_generator=MockChatGenerator(responses=["Paris"]),
            settings={"max_concurrency": 8, "min_confidence": 0.25},
        ),
    )
    loaded = Pipeline.loads(pipeline.dumps())
    assert loaded.dumps() == pipeline.dumps()
    answerer = loaded.get_component("answerer")
    assert answerer.settings == {"max_concurrency": 8, "min_confidence": 0.25}
    assert isinstance(answerer.chat_generator, MockChatGenerator)


def test_follows_ones_own_retriever():
    store = InMemoryDocumentStore()
    store.write_documents(DOCUMENTS)
    pipeline = Pipeline()
    pipeline.add_component("retriever", InMemoryBM25Retriever(document_store=store, top_k=2))
    pipeline.add_component(
        "answerer", FusionAnswerer(strategy="post_fusion", chat_generator=MockChatGenerator(responses=["Paris"]))
    )
    pipeline.connect("retriever.documents", "answerer.documents")
    result = pipeline.run({"retriever": {"query": QUERY}, "answerer": {"query": QUERY}})
    answer = result["answerer"]["answers"][0]
    assert answer.data == "Paris"
    assert answer.meta["votes"] == {"paris": 2}


async def test_run_async_gives_the_same_answers():
    answerer = FusionAnswerer(strategy="concat_pf", chat_generator=MockChatGenerator(responses=["Paris"]))
    result = await answerer.run_async(query=QUERY, documents=DOCUMENTS)
    assert result["answers"][0].data == "Paris"


def test_passages_keep_the_order_given():
    answerer = FusionAnswerer(strategy="concatenation", chat_generator=MockChatGenerator(responses=["Paris"]))
    reversed_documents = [
        Document(id=d.id, content=d.content, score=s) for d, s in zip(DOCUMENTS, (0.1, 0.9), strict=True)
    ]
    answers = answerer.run(query=QUERY, documents=reversed_documents)["answers"]
    assert [d.id for d in answers[0].documents] == ["paris", "lyon"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"strategy": "nope"}, "nope"),
        ({"strategy": "concat_pf", "settings": {"retriever": None}}, "no field"),
        ({"strategy": "concat_pf", "settings": {"temperature": 0}}, "no field"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FusionAnswerer(chat_generator=MockChatGenerator(responses=["x"]), **kwargs)


def test_an_empty_question_is_refused():
    answerer = FusionAnswerer(strategy="concatenation", chat_generator=MockChatGenerator(responses=["Paris"]))
    with pytest.raises(Exception, match="empty"):
        answerer.run(query="  ", documents=DOCUMENTS)
