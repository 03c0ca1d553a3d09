"""The papers' passage settings, gold passage inserted (Liu et al.), noise ratio (Yu et al.), closed book, applied by
`EvalRetriever` around a strategy pipeline's retriever, so the strategies run unchanged under each."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from haystack import Document, component, default_to_dict
from haystack.core.serialization import component_to_dict

from haystack_fusion.evaluation.metrics import retrieval_hit

GoldPosition = Literal["none", "random", "first", "last"]
NOISE_POOL_FACTOR = 10
"""With a noise ratio, the retriever is asked for this many times k passages (Yu et al. section 3.1.1)."""


@dataclass(frozen=True)
class PassageSetting:
    """How the top-k passages of a question are put together for evaluation.
    :param gold_passage: "none": retrieval as it is (Liu et al. Table 2); "random": the gold passage inserted at a
        random position when retrieval missed it, dropping the last passage (Liu et al. Table 1); "first" / "last":
        the gold passage always at the start / end (Liu et al. section 4.5, Figure 6).
    :param noise_ratio: r in [0, 1]: k*r irrelevant and k*(1-r) relevant passages (holding a gold answer, or the gold
        passage; Yu et al. section 3.1.1); None: no noise setting.
    :param closed_book: No passages at all (Liu et al. section 4 "Dataset Filter").
    :param seed: Seed of the per-question random choices.
    :raises ValueError: For an unknown `gold_passage` value or a `noise_ratio` outside [0, 1]."""

    gold_passage: GoldPosition = "none"
    noise_ratio: float | None = None
    closed_book: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.gold_passage not in ("none", "random", "first", "last"):
            raise ValueError(f"`gold_passage` must be none, random, first or last, got {self.gold_passage!r}")
        if self.noise_ratio is not None and not 0 <= self.noise_ratio <= 1:
            raise ValueError(f"`noise_ratio` must be in [0, 1], got {self.noise_ratio}")

    def label(self) -> str:
        """A short name for reports, e.g. "gold passage random, noise ratio 0.2"."""
        if self.closed_book:
            return "closed book"
        parts = [f"gold passage {self.gold_passage}"] if self.gold_passage != "none" else ["retrieved"]
        if self.noise_ratio is not None:
            parts.append(f"noise ratio {self.noise_ratio:g}")
        return ", ".join(parts)


def _relevant(document: Document, answers: Sequence[str], gold_id: str | None) -> bool:
    return document.id == gold_id or (bool(answers) and retrieval_hit([document.content or ""], answers))


def arrange_passages(retrieved: list[Document], *, top_k: int, setting: PassageSetting, question_id: str,
                     answers: Sequence[str] = (), gold: Document | None = None,
                     corpus: Sequence[Document] = ()) -> list[Document]:  # fmt: skip
    """At most k passages of one question under a setting, from the retrieved ones (best first), the gold `answers`
    and `gold` passage, and the `corpus` (more noise); `question_id` and `setting.seed` seed the choices."""
    if setting.closed_book:
        return []
    rng = random.Random(f"{setting.seed}:{question_id}")
    gold_id = gold.id if gold is not None else None
    if setting.noise_ratio is not None:
        n_noise = round(top_k * setting.noise_ratio)
        relevant = [d for d in retrieved if _relevant(d, answers, gold_id)][: top_k - n_noise]
        noise = [d for d in retrieved if not _relevant(d, answers, gold_id)][:n_noise]
        if len(noise) < n_noise:  # draw the rest from the corpus
            taken = {d.id for d in retrieved}
            pool = [d for d in corpus if d.id not in taken and not _relevant(d, answers, gold_id)]
            noise += rng.sample(pool, min(n_noise - len(noise), len(pool)))
        order = {d.id: i for i, d in enumerate(retrieved)}
        passages = sorted(relevant + noise, key=lambda d: order.get(d.id, len(order)))
    else:
        passages = list(retrieved[:top_k])
    if gold is None or setting.gold_passage == "none":
        return passages
    if setting.gold_passage == "random":
        if any(d.id == gold_id for d in passages):
            return passages
        passages = passages[: top_k - 1]
        passages.insert(rng.randint(0, len(passages)), gold)
        return passages
    others = [d for d in passages if d.id != gold_id][: top_k - 1]
    return [gold, *others] if setting.gold_passage == "first" else [*others, gold]


@component
class EvalRetriever:
    """
    The wrapped retriever's passages rearranged by a `PassageSetting` (`arrange_passages`), with the per-question gold
    data as run inputs, so one strategy pipeline serves every question.

    ### Usage example
    ```python
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
    from haystack_fusion.evaluation.passages import EvalRetriever, PassageSetting

    retriever = EvalRetriever(InMemoryBM25Retriever(store), setting=PassageSetting(gold_passage="random"))
    ```
    """

    def __init__(self, retriever: Any, *, setting: PassageSetting | None = None, corpus: Sequence[Document] = (),
                 top_k: int = 5) -> None:  # fmt: skip
        """Wrap any retriever with `query` and `top_k` inputs; `corpus` gives the noise ratio's irrelevant passages."""
        self.retriever, self.setting, self.top_k = retriever, setting or PassageSetting(), top_k
        self.corpus = list(corpus)

    def to_dict(self) -> dict[str, Any]:
        """Serialize (for logs: the corpus is not serialized)."""
        retriever = component_to_dict(obj=self.retriever, name="retriever")
        return default_to_dict(self, retriever=retriever, setting=self.setting.__dict__, top_k=self.top_k)

    @component.output_types(documents=list[Document])
    def run(self, query: str, top_k: int | None = None, question_id: str = "", answers: list[str] | None = None,
            gold: Document | None = None) -> dict[str, Any]:  # fmt: skip
        """Retrieve (k x `NOISE_POOL_FACTOR` with a noise ratio) and rearrange. :returns: `documents`: at most k."""
        k = top_k or self.top_k
        if self.setting.closed_book:
            return {"documents": []}
        depth = k * NOISE_POOL_FACTOR if self.setting.noise_ratio is not None else k
        retrieved = self.retriever.run(query=query, top_k=depth)["documents"]
        return {"documents": arrange_passages(retrieved, top_k=k, setting=self.setting, question_id=question_id,
                                              answers=answers or (), gold=gold, corpus=self.corpus)}  # fmt: skip
