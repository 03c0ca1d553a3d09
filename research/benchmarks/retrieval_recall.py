"""
Measurement: recall@k of BM25, dense and hybrid in-memory retrieval on the SQuAD 2.0 dev subset.

Dense retrieval embeds passages and questions with the packaged all-MiniLM-L6-v2 model (`dense` extra); hybrid
fuses BM25 and dense rankings by reciprocal rank fusion (`haystack_fusion.retrieval`). Over the answerable
questions it prints two recalls per retriever: the question's own paragraph is in the top k (gold passage), and a
gold answer string occurs in the top k (answer recall, the harness's recall@k). Figures, not a test.
Run: `.venv/bin/python -m research.benchmarks.retrieval_recall [--k 5]`.
"""

from __future__ import annotations

import argparse
import time

from haystack.components.retrievers.in_memory import InMemoryBM25Retriever, InMemoryEmbeddingRetriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

from haystack_fusion.embeddings import PackagedDocumentEmbedder, PackagedTextEmbedder
from haystack_fusion.evaluation.datasets import load_dataset
from haystack_fusion.evaluation.metrics import retrieval_hit
from haystack_fusion.retrieval import DenseRetriever, HybridRetriever

DATASET = "../shared/data/squad2-dev-subset/squad2_dev_subset.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--dataset", default=DATASET)
    args = parser.parse_args()
    dataset = load_dataset(args.dataset)
    start = time.perf_counter()
    document_embedder = PackagedDocumentEmbedder(progress_bar=False)
    document_embedder.warm_up()
    store = InMemoryDocumentStore()
    store.write_documents(document_embedder.run(documents=dataset.documents)["documents"])
    print(f"{len(dataset.documents)} passages embedded in {time.perf_counter() - start:.1f} s")
    retrievers = {
        "bm25": InMemoryBM25Retriever(store),
        "dense": DenseRetriever(
            text_embedder=PackagedTextEmbedder(progress_bar=False),
            embedding_retriever=InMemoryEmbeddingRetriever(store),
        ),
        "hybrid": HybridRetriever(
            bm25_retriever=InMemoryBM25Retriever(store),
            text_embedder=PackagedTextEmbedder(progress_bar=False),
            embedding_retriever=InMemoryEmbeddingRetriever(store),
        ),
    }
    questions = [q for q in dataset.questions if q.answers]
    print(f"{len(questions)} answerable questions, k = {args.k}")
    for name, retriever in retrievers.items():
        if hasattr(retriever, "warm_up"):
            retriever.warm_up()
        start = time.perf_counter()
        gold = answer = 0
        for question in questions:
            documents = retriever.run(query=question.question, top_k=args.k)["documents"]
            gold += any(d.id == question.gold_document_id for d in documents)
            answer += retrieval_hit([d.content or "" for d in documents], list(question.answers))
        seconds = time.perf_counter() - start
        print(
            f"{name:>6}: gold passage recall@{args.k} {100 * gold / len(questions):.1f}%, "
            f"answer recall@{args.k} {100 * answer / len(questions):.1f}% ({1000 * seconds / len(questions):.0f} ms/q)"
        )


if __name__ == "__main__":
    main()
