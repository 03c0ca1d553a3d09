"""A strategy's settings (`StrategyConfig`), its registry entry (`Strategy`, `Stage`) and its sources."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from haystack.components.generators.chat.types import ChatGenerator

from haystack_fusion.components.summary_verifier import Scoring
from haystack_fusion.components.unknown_router import CONFIDENCES, Confidence
from haystack_fusion.prompts import DEFAULT_MAX_PASSAGE_CHARS

RETRIEVER = "retriever"  # the retriever component's name in `build_pipeline(..., retriever=...)`
SPLIT_ROUTER = "split_router"  # `cascade`'s `SplitVoteRouter`, which sends a split vote on to SuRe's verification
DOCUMENTS = "documents"  # the sender of the passages in `Parts`: the retriever's `documents`, or the pipeline's input

Parts = tuple[dict[str, Any], list[tuple[str, str]]]
"""A strategy's pipeline under construction: components by name, and (sender, receiver) connections."""

StageKind = Literal["answer", "concatenation", "post_fusion", "summaries", "verification", "notes"]
"""What a round does: `answer` (one prompt's reply is the answer), `concatenation` (routed on by an `UnknownRouter`,
Liu et al., section 3.3), `post_fusion` (Eq. 2), `summaries` (Kim et al., section 3.2), `verification` (section 3.3)
or `notes` (Yu et al., section 2.3)."""


@dataclass(frozen=True)
class Stage:
    """One round of a strategy: what it does (`kind`) and the name of the component that runs it."""

    kind: StageKind
    component: str


@dataclass(frozen=True)
class StrategyConfig:
    """
    What every strategy builder takes (`build_pipeline` raises ValueError for a setting a strategy does not take).

    :param max_concurrency: Most LLM calls of one round under way at once (>= 1); None: all of them.
    :param samples_per_passage: p for post-fusion self-consistency (Liu et al., section 4.4).
    :param max_passage_chars: Per-passage context budget in characters (None: no limit).
    :param unknown_patterns: The unknown detector's patterns (None: the defaults).
    :param num_candidates: K, SuRe's answer candidates (Kim et al., section 4.1: K = 2).
    :param verifier_chat_generator: The LLM of SuRe's validity and ranking calls (Kim et al., Table 10); None:
        `fallback_chat_generator` in `cascade`, else `chat_generator`.
    :param fallback_chat_generator: The LLM of every round after the first in `concat_pf`, `pf_concat` and `cascade`
        (a strong model for the questions a small one passes on); None: `chat_generator`.
    :param document_ranker: A ranker reordering SuRe's passages by the winning summary (Kim et al., Table 4).
    :param few_shot: SuRe's candidates from the few-shot Listing 13 instead of Listing 6 (for base models).
    :param allow_parametric_knowledge: Chain-of-Note answers from the model's own knowledge when no passage is
        relevant (Yu et al., Appendix A.5 step 5); False: "unknown".
    :param note_generation_kwargs: `generation_kwargs` of Chain-of-Note's calls (k notes need a larger budget).
    :param min_confidence: tau: `concat_pf` and `cascade` fall back to post-fusion when the concatenation answer's
        confidence is below it, as when it is unknown; None: off in `concat_pf`, `CASCADE_MIN_CONFIDENCE` in `cascade`.
    :param confidence: What tau is compared with: "logprobs" (`answers.answer_confidence`), "agreement" (the share of
        `agreement_samples` sampled answers equal to the greedy one, at `agreement_temperature`) or "none".
    :param min_vote_share: s: `cascade` verifies a post-fusion vote whose winner has a smaller share (or ties at the
        top); None: `CASCADE_MIN_VOTE_SHARE`.
    :param verifier_scoring: SuRe's validity and ranking read from the reply's words ("text", Kim et al.) or token
        probabilities ("probability"); None: "text" for the SuRe strategies, "probability" for `cascade`.
    :param datamark: Datamark the passages of every prompt against instructions written in them ("spotlighting", Hines
        et al., 2024); Liu et al.'s strategies only.
    :param prompts: Jinja templates replacing the papers' prompts, by the `PROMPTS` names the strategy renders (e.g.
        `{"figure7": "..."}`), each with the variables of the prompt it replaces; the answer pattern, stop sequences and
        demonstrations stay the paper's.
    :param speculative: `concat_pf` and `cascade` start post-fusion's calls beside concatenation's, cancelled when its
        answer holds (`PostFusionSpeculator`, docs/fallback.md); off, with a warning, on the embedded model.
    """

    chat_generator: ChatGenerator
    max_concurrency: int | None = None
    samples_per_passage: int = 1
    max_passage_chars: int | None = DEFAULT_MAX_PASSAGE_CHARS
    unknown_patterns: list[str] | None = None
    num_candidates: int = 2
    verifier_chat_generator: ChatGenerator | None = None
    fallback_chat_generator: ChatGenerator | None = None
    document_ranker: Any | None = None
    few_shot: bool = False
    allow_parametric_knowledge: bool = True
    note_generation_kwargs: dict[str, Any] | None = None
    min_confidence: float | None = None
    confidence: Confidence = "logprobs"
    agreement_samples: int = 4
    agreement_temperature: float = 0.7
    min_vote_share: float | None = None
    verifier_scoring: Scoring | None = None
    datamark: bool = False
    prompts: dict[str, str] | None = None
    system_prompt: str | None = None
    speculative: bool = False

    def __post_init__(self) -> None:
        if self.confidence not in CONFIDENCES:
            raise ValueError(f"`confidence` must be one of {', '.join(CONFIDENCES)}, got {self.confidence!r}")
        samples = self.agreement_samples
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ValueError(f"`agreement_samples` must be an integer >= 1, got {samples!r}")
        if not self.agreement_temperature > 0:
            raise ValueError(f"`agreement_temperature` must be above 0, got {self.agreement_temperature}")


@dataclass(frozen=True)
class Strategy:
    """
    A registered strategy: a line for `haystack-fusion strategies` (`summary`), the paper location it implements
    (`source`), its dependent LLM rounds on the critical path (`rounds`), the component whose `answers` are its own, its
    rounds in the order they can run (`stages`), the `PROMPTS` it can render, and its LLM calls per question in k (top-k
    passages) and K (SuRe's answer candidates), e.g. "1 or 1+k".
    """

    name: str
    summary: str
    source: str
    rounds: str
    answer_component: str
    build: Callable[[StrategyConfig], Parts] = field(repr=False)
    stages: tuple[Stage, ...] = ()
    prompts: tuple[str, ...] = ()
    calls: str = "1"

    @property
    def description(self) -> str:
        """One line with its LLM calls, rounds and sources (`cite`): its served tool's description (MCP, OpenAPI)."""
        rounds = "1 round" if self.rounds == "1" else f"{self.rounds} rounds"
        legend = [text for s, text in (("k", "k = top-k passages"), ("K", "K = answer candidates")) if s in self.calls]
        calls = f"{self.calls} in {rounds}" + (f" ({', '.join(legend)})" if legend else "")
        return (
            f"Answer a question from the retrieved passages with {self.name}: {self.summary}. "
            f"LLM calls per question: {calls}. Source: {cite(self.source)}."
        )


PAPERS: dict[str, str] = {  # each paper's arXiv id, by its short citation in `Strategy.source`
    "Liu et al.": "2308.12574",  # Modeling Uncertainty and Using Post-fusion as Fallback ..., KnowLLM 2024
    "Kim et al.": "2404.13081",  # SuRe: Summarizing Retrievals using Answer Candidates ..., ICLR 2024
    "Yu et al.": "2311.09210",  # Chain-of-Note: Enhancing Robustness in Retrieval-Augmented Language Models, 2023
}


def cite(source: str) -> str:
    """A `Strategy.source` with each paper's short citation followed by its arXiv id: "Liu et al. (arXiv:2308.12574),
    section 3.3"."""
    names = "|".join(re.escape(name) for name in PAPERS)
    return re.sub(f"({names})", lambda match: f"{match[1]} (arXiv:{PAPERS[match[1]]})", source)
