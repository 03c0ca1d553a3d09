"""SplitVoteRouter: sends a split post-fusion vote on to verification (the `cascade` strategy's stage 3)."""

from __future__ import annotations

from typing import Any

from haystack import Document, component
from haystack.dataclasses import GeneratedAnswer


@component
class SplitVoteRouter:
    """
    Routes a post-fusion vote to `answers` when it is decided, or its top K candidates on to SuRe's verification
    (Kim et al., section 3.3) when it is split: the winner's `vote_share` is below s, or the top two tie.

    ### Usage example
    ```python
    from haystack.dataclasses import GeneratedAnswer
    from haystack_fusion.components.split_vote_router import SplitVoteRouter

    vote = [
        GeneratedAnswer(data="Paris", query="q", documents=[], meta={"votes": {"paris": 1, "lyon": 1}, "tie": True}),
        GeneratedAnswer(data="Lyon", query="q", documents=[], meta={"votes": 1}),
    ]
    print(SplitVoteRouter(min_vote_share=0.5).run(query="q", answers=vote)["split_candidates"])  # ['Paris', 'Lyon']
    ```
    """

    def __init__(self, *, min_vote_share: float, max_candidates: int = 2) -> None:
        """
        :param min_vote_share: s in (0, 1]: a vote whose winner has a smaller share of the votes is split.
        :param max_candidates: K, the candidates a split vote passes on, most votes first (>= 2).
        :raises ValueError: If `min_vote_share` is outside (0, 1] or `max_candidates` is below 2.
        """
        if not 0 < min_vote_share <= 1:
            raise ValueError(f"`min_vote_share` must be in (0, 1], got {min_vote_share}")
        if max_candidates < 2:
            raise ValueError(f"`max_candidates` must be at least 2, got {max_candidates}")
        self.min_vote_share = min_vote_share
        self.max_candidates = max_candidates

    @component.output_types(
        answers=list[GeneratedAnswer],
        split_reason=str,
        split_query=str,
        split_candidates=list[str],
        split_documents=list[list[Document]],
    )
    def run(self, query: str, answers: list[GeneratedAnswer]) -> dict[str, Any]:
        """
        :param answers: `PostFusionVoter`'s answers, the winner first.
        :returns: Either `answers` (a decided vote), or `split_reason` ("tie at the top", "vote share 0.40 < 0.5"),
            `split_query`, `split_candidates` (the top K) and `split_documents` (the passages that gave each).
        """
        meta = answers[0].meta if answers else {}
        share, tie = meta.get("vote_share", 0.0), bool(meta.get("tie"))
        if not meta.get("votes") or not (tie or share < self.min_vote_share):
            return {"answers": answers}
        top = answers[: self.max_candidates]
        return {
            "split_reason": "tie at the top" if tie else f"vote share {share:.2f} < {self.min_vote_share}",
            "split_query": query,
            "split_candidates": [answer.data or "" for answer in top],
            "split_documents": [list(answer.documents or []) for answer in top],
        }
