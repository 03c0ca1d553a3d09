"""What a strategy is: its settings (`StrategyConfig`), its registry entry (`Strategy`, `Stage`) and its sources."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from haystack.components.generators.chat.types import ChatGenerator

from haystack_fusion.components.summary_verifier import Scoring
from haystack_fusion.components.unknown_router import CONFIDENCES, Confidence
from haystack_fusion.prompts import DEFAULT_MAX_PASSAGE_CHARS

RETRIEVER = "retriever"
"""The name of the retriever component of a full pipeline (`build_pipeline(..., retriever=...)`)."""

SPLIT_ROUTER = "split_router"
"""The name of `cascade`'s `SplitVoteRouter`, which sends a split post-fusion vote on to SuRe's verification."""

DOCUMENTS = "documents"
"""The sender that stands for the passages in `Parts`: the retriever's `documents`, or the pipeline's input."""

Parts = tuple[dict[str, Any], list[tuple[str, str]]]
"""A strategy's pipeline under construction: components by name, and (sender, receiver) connections."""

StageKind = Literal["answer", "concatenation", "post_fusion", "summaries", "verification", "notes"]
"""What a round does: `answer` (one prompt's reply is the answer), `concatenation` (the concatenation answer, routed
on by an `UnknownRouter`, Liu et al., section 3.3), `post_fusion` (a `PostFusionVoter`, Eq. 2), `summaries` (a
`CandidateSummarizer`, Kim et al., section 3.2), `verification` (a `SummaryVerifier`, section 3.3) or `notes` (a
`NoteTaker`, Yu et al., section 2.3)."""


@dataclass(frozen=True)
class Stage:
    """
    One round of a strategy.

    :param kind: What the round does (`StageKind`).
    :param component: The name of the pipeline component that runs it.
    """

    kind: StageKind
    component: str


@dataclass(frozen=True)
class StrategyConfig:
    """
    What every strategy builder takes.

    :param chat_generator: The LLM. Components of one pipeline share this instance.
    :param max_concurrency: Largest number of LLM calls of one round under way at once (an integer >= 1); None
        (default): all of the round's calls at once.
    :param samples_per_passage: p for post-fusion self-consistency (Liu et al., section 4.4).
    :param max_passage_chars: Per-passage context budget in characters (None: no limit).
    :param unknown_patterns: The unknown detector's patterns for the router and the voter (None: the defaults).
    :param num_candidates: K, SuRe's answer candidates (Kim et al., section 4.1: K = 2).
    :param verifier_chat_generator: The LLM for SuRe's validity and ranking calls (Kim et al., Table 10); None uses
        `fallback_chat_generator` in `cascade`, else `chat_generator`.
    :param fallback_chat_generator: The LLM of every round after the first in `concat_pf`, `pf_concat` and `cascade`
        (post-fusion, the distiller, SuRe's summaries and verification), so a small model answers first and a strong
        one only the questions passed on; None: `chat_generator`. Other strategies raise ValueError when it is set.
    :param document_ranker: A Haystack ranker that reorders SuRe's passages by the winning summary (Kim et al.,
        Table 4), e.g. `haystack_fusion.embeddings.summary_reranker()`; None keeps retrieval order.
    :param few_shot: SuRe's candidates from the few-shot Listing 13 instead of Listing 6 (for base models).
    :param allow_parametric_knowledge: Chain-of-Note answers from the model's own knowledge when no passage is
        relevant (Yu et al., Appendix A.5 step 5); False answers "unknown" then.
    :param note_generation_kwargs: `generation_kwargs` of Chain-of-Note's calls (the notes of k passages need a
        larger completion budget than a short answer); None keeps the generator's own.
    :param min_confidence: tau, a probability: the concatenation answer of `concat_pf` and `cascade` falls back to
        post-fusion when its confidence (`answers.answer_confidence`) is below it, as well as when it says unknown.
        None: off for `concat_pf` (Liu et al.'s behaviour), `CASCADE_MIN_CONFIDENCE` for `cascade`.
    :param confidence: What tau is compared with: "logprobs" (the reply's token log-probabilities,
        `answers.answer_confidence`; none returned: no check), "agreement" (the share of `agreement_samples` sampled
        concatenation answers equal to the greedy one, self-consistency; for backends without log-probabilities) or
        "none" (only an unknown or invalid answer falls back). `concat_pf` and `cascade` only.
    :param agreement_samples: m, the sampled concatenation calls of `confidence="agreement"` (m extra calls per
        question, each as long as the first); an integer >= 1.
    :param agreement_temperature: The sampling temperature of those calls (> 0).
    :param min_vote_share: s: `cascade` verifies a post-fusion vote whose winner has a smaller share of the votes
        (or that ties at the top); None: `CASCADE_MIN_VOTE_SHARE`.
    :param verifier_scoring: SuRe's validity and ranking read from the reply's words ("text", Kim et al.) or from
        token probabilities ("probability"); None: "text" for the SuRe strategies, "probability" for `cascade`.
    :param datamark: Datamark the passage text of every prompt (`prompts.format_passages`), a defence against
        instructions written in passages ("spotlighting", Hines et al., 2024). Supported by Liu et al.'s strategies;
        the others raise ValueError when it is set. Off by default.
    :param prompts: Templates that replace the papers' prompts, keyed by the `PROMPTS` names the strategy renders
        (`Strategy.prompts`, e.g. `{"figure7": "..."}`): Jinja strings as Haystack's `ChatPromptBuilder(template=...)`
        takes them, each with the variables of the prompt it replaces (the components' docstrings list them; a
        one-prompt chain's template uses exactly those of the paper's). The answer pattern, stop sequences and
        demonstrations of the paper's prompt stay. `build_pipeline` raises ValueError for a name it does not render.
    :param system_prompt: A system message sent before every prompt of the strategy (for chat models); None: none.
    :param speculative: `concat_pf` and `cascade` start post-fusion's calls beside concatenation's and cancel them
        when its answer holds (`PostFusionSpeculator`; docs/fallback.md); sequential, with a warning, when post-fusion's
        LLM is the embedded model. Other strategies raise ValueError when it is set.
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
        if isinstance(self.agreement_samples, bool) or not isinstance(self.agreement_samples, int):
            raise ValueError(f"`agreement_samples` must be an integer >= 1, got {self.agreement_samples!r}")
        if self.agreement_samples < 1:
            raise ValueError(f"`agreement_samples` must be an integer >= 1, got {self.agreement_samples}")
        if not self.agreement_temperature > 0:
            raise ValueError(f"`agreement_temperature` must be above 0, got {self.agreement_temperature}")


@dataclass(frozen=True)
class Strategy:
    """
    A registered strategy.

    :param name: Registry name.
    :param summary: One line for `haystack-fusion strategies`.
    :param source: Paper location it implements.
    :param rounds: Dependent LLM rounds on the critical path (at most).
    :param answer_component: The component whose `answers` output is the strategy's answer list.
    :param build: Builds the pipeline's components and connections from a `StrategyConfig`.
    :param stages: Its rounds in the order they can run: the one place the run's evidence, the stage trace, the
        serving stream and the CLI learn which component does what.
    :param prompts: Names of the `PROMPTS` its pipeline can render (the report reads their demonstration answers).
    :param calls: LLM calls per question, in k (top-k passages) and K (SuRe's answer candidates), e.g. "1 or 1+k".
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
        """One line that tells this strategy from the others, with its LLM calls, rounds and sources (`cite`): the
        tool description of its served wrapper (MCP, OpenAPI)."""
        rounds = "1 round" if self.rounds == "1" else f"{self.rounds} rounds"
        legend = [
            text
            for symbol, text in (("k", "k = top-k passages"), ("K", "K = answer candidates"))
            if symbol in self.calls
        ]
        calls = f"{self.calls} in {rounds}" + (f" ({', '.join(legend)})" if legend else "")
        return (
            f"Answer a question from the retrieved passages with {self.name}: {self.summary}. "
            f"LLM calls per question: {calls}. Source: {cite(self.source)}."
        )


PAPERS: dict[str, str] = {
    "Liu et al.": "2308.12574",  # Modeling Uncertainty and Using Post-fusion as Fallback ..., KnowLLM 2024
    "Kim et al.": "2404.13081",  # SuRe: Summarizing Retrievals using Answer Candidates ..., ICLR 2024
    "Yu et al.": "2311.09210",  # Chain-of-Note: Enhancing Robustness in Retrieval-Augmented Language Models, 2023
}
"""The arXiv identifier of each paper, by the short citation `Strategy.source` names it with."""


def cite(source: str) -> str:
    """
    A `Strategy.source` with each paper's short citation followed by its arXiv id.

    >>> cite("Liu et al., section 3.3")
    'Liu et al. (arXiv:2308.12574), section 3.3'
    """
    names = "|".join(re.escape(name) for name in PAPERS)
    return re.sub(f"({names})", lambda match: f"{match[1]} (arXiv:{PAPERS[match[1]]})", source)
