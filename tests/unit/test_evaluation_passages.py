"""
Which passages each question is answered from (retrieved, gold, noise settings) and the retriever that hands them over.
"""

from __future__ import annotations

import pytest
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.evaluation.passages import EvalRetriever, PassageSetting, arrange_passages
from tests.unit.capitals_dataset import DOCUMENTS


class TestArrangePassages:
    retrieved = DOCUMENTS[1:4]  # berlin, madrid, rome: the gold "paris" is missed

    def test_none_keeps_retrieval(self):
        got = arrange_passages(self.retrieved, top_k=2, setting=PassageSetting(), question_id="q", gold=DOCUMENTS[0])
        assert [d.id for d in got] == ["berlin", "madrid"]

    def test_random_inserts_the_missed_gold_and_keeps_k(self):
        setting = PassageSetting(gold_passage="random", seed=3)
        got = arrange_passages(self.retrieved, top_k=3, setting=setting, question_id="q", gold=DOCUMENTS[0])
        assert len(got) == 3
        assert "paris" in [d.id for d in got]
        again = arrange_passages(self.retrieved, top_k=3, setting=setting, question_id="q", gold=DOCUMENTS[0])
        assert got == again  # seeded per question

    def test_random_leaves_a_retrieved_gold_alone(self):
        setting = PassageSetting(gold_passage="random")
        got = arrange_passages(self.retrieved, top_k=3, setting=setting, question_id="q", gold=DOCUMENTS[2])
        assert [d.id for d in got] == ["berlin", "madrid", "rome"]

    @pytest.mark.parametrize(("position", "index"), [("first", 0), ("last", -1)])
    def test_first_and_last_move_the_gold(self, position, index):
        setting = PassageSetting(gold_passage=position)
        got = arrange_passages(self.retrieved, top_k=3, setting=setting, question_id="q", gold=DOCUMENTS[2])
        assert got[index].id == "madrid"
        assert len(got) == 3

    def test_noise_ratio_mixes_relevant_and_irrelevant(self):
        retrieved = [DOCUMENTS[0], DOCUMENTS[5], DOCUMENTS[1], DOCUMENTS[2]]
        setting = PassageSetting(noise_ratio=0.5)
        got = arrange_passages(
            retrieved, top_k=2, setting=setting, question_id="q", answers=["Paris"], gold=None, corpus=DOCUMENTS
        )
        assert [d.id for d in got] == ["paris", "danube"]

    def test_full_noise_draws_from_the_corpus_when_retrieval_is_short(self):
        setting = PassageSetting(noise_ratio=1.0)
        got = arrange_passages(
            [DOCUMENTS[0]], top_k=3, setting=setting, question_id="q", answers=["Paris"], corpus=DOCUMENTS
        )
        assert len(got) == 3
        assert all("Paris" not in (d.content or "") for d in got)

    def test_closed_book_has_no_passages(self):
        setting = PassageSetting(closed_book=True)
        assert arrange_passages(self.retrieved, top_k=3, setting=setting, question_id="q") == []

    @pytest.mark.parametrize("kwargs", [{"gold_passage": "middle"}, {"noise_ratio": 1.5}])
    def test_invalid_settings(self, kwargs):
        with pytest.raises(ValueError, match="must be"):
            PassageSetting(**kwargs)


class TestEvalRetriever:
    def test_wraps_a_retriever(self):
        store = InMemoryDocumentStore()
        store.write_documents(DOCUMENTS)
        retriever = EvalRetriever(InMemoryBM25Retriever(store), setting=PassageSetting(gold_passage="first"), top_k=2)
        got = retriever.run(query="capital of Germany", question_id="q", answers=["Lisbon"], gold=DOCUMENTS[4])
        assert got["documents"][0].id == "lisbon"
        assert len(got["documents"]) == 2
