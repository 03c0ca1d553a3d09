"""
The strategy registry: strategy name -> Haystack pipeline builder, the single source of truth.

Every strategy is a `Pipeline` from a retriever (component `retriever`) to one list of `GeneratedAnswer` (the output
of the component named by `Strategy.answer_component`). Every question socket is named `query`, so
`pipeline.run({"query": ...})` style inputs reach the retriever, the prompt builders and the answer builders alike.
Strategies that need no component of their own are this package's PassageFormatter plus Haystack's
ChatPromptBuilder, the ChatGenerator and AnswerBuilder.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from haystack import Document, Pipeline, logging
from haystack.components.builders import AnswerBuilder
from haystack.components.generators.chat.types import ChatGenerator
from haystack.components.joiners import AnswerJoiner
from haystack.core.serialization import component_from_dict, component_to_dict
from haystack.dataclasses import GeneratedAnswer

from haystack_fusion.answers import DEFAULT_OVERLAP_THRESHOLD, UNKNOWN, VoteMode, answer_confidence
from haystack_fusion.components.abstaining_chat_generator import AbstainingChatGenerator
from haystack_fusion.components.candidate_summarizer import CandidateSummarizer, SummaryMode
from haystack_fusion.components.checked_answer_builder import CheckedAnswerBuilder
from haystack_fusion.components.note_taker import NoteMode, NoteTaker
from haystack_fusion.components.passage_formatter import PassageFormatter
from haystack_fusion.components.post_fusion_voter import PostFusionVoter
from haystack_fusion.components.summary_verifier import Scoring, SummaryVerifier
from haystack_fusion.components.unknown_router import UnknownRouter
from haystack_fusion.llm_calls import limit_calls, reply_usage, stop_kwargs, sum_usage
from haystack_fusion.prompts import DEFAULT_MAX_PASSAGE_CHARS, PROMPTS, PromptTemplate, validate_query
from haystack_fusion.prompts.passages import PassageLayout
from haystack_fusion.sure import summary_is_label
from haystack_fusion.validation import is_invalid

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StrategyConfig:
    """
    What every strategy builder takes.

    :param retriever: The retriever component (any Haystack retriever with `query` and `top_k` inputs).
    :param chat_generator: The LLM. Components of one pipeline share this instance.
    :param max_concurrency: Largest number of LLM calls of one round under way at once (an integer >= 1); None
        (default): all of the round's calls at once, up to the process-wide ceiling (`llm_calls.concurrency_ceiling`).
    :param samples_per_passage: p for post-fusion self-consistency (paper 000, section 4.4).
    :param max_passage_chars: Per-passage context budget in characters (None: no limit).
    :param unknown_patterns: The unknown detector's patterns for the router and the voter (None: the defaults).
    :param num_candidates: K, SuRe's answer candidates (paper 002, section 4.1: K = 2).
    :param verifier_chat_generator: The LLM for SuRe's validity and ranking calls (paper 002, Table 10); None uses
        `chat_generator`.
    :param document_ranker: A Haystack ranker that reorders SuRe's passages by the winning summary (paper 002,
        Table 4), e.g. `haystack_fusion.embeddings.summary_reranker()`; None keeps retrieval order.
    :param few_shot: SuRe's candidates from the few-shot Listing 13 instead of Listing 6 (for base models).
    :param allow_parametric_knowledge: Chain-of-Note answers from the model's own knowledge when no passage is
        relevant (paper 004, Appendix A.5 step 5); False answers "unknown" then.
    :param note_generation_kwargs: `generation_kwargs` of Chain-of-Note's calls (the notes of k passages need a
        larger completion budget than a short answer); None keeps the generator's own.
    :param min_confidence: tau, a probability: the first (concatenation) answer of `concat_pf` and `cascade` falls
        back to post-fusion when its confidence (`answers.answer_confidence`) is below it, as well as when it says
        unknown. None: off for `concat_pf` (paper 000's behaviour), `CASCADE_MIN_CONFIDENCE` for `cascade`.
    :param min_vote_share: s: `cascade` verifies a post-fusion vote whose winner has a smaller share of the votes
        (or that ties at the top); None: `CASCADE_MIN_VOTE_SHARE`.
    :param verifier_scoring: SuRe's validity and ranking read from the reply's words ("text", paper 002) or from
        token probabilities ("probability"); None: "text" for the SuRe strategies, "probability" for `cascade`.
    :param datamark: Datamark the passage text of every prompt (`prompts.passages.format_passages`), a defence
        against instructions written in passages (docs/reliability.md, "Poisoned passages"). Supported by the
        strategies whose passages go through PassageFormatter and PostFusionVoter (paper 000's); the others raise
        ValueError when it is set. Off by default.
    :param answer_checks: Validate every answer read from a reply (`validation.check_answer`: passage markup, copied
        demonstration answers, empty enumerations); a rejected answer becomes an empty answer with
        `meta["answer_source"] == "invalid"`, and concat_pf / cascade fall back on it as on "unknown". On by default;
        off gives the answers of the package before the validator existed (issue 16).
    :param stop_sequences: End the replies of short-answer prompts at their answer line (`PromptTemplate.stop`,
        added to the generator's own stop sequences by `llm_calls.stop_kwargs`): the one-prompt chains get their own
        copy of `chat_generator` with those stops in its `generation_kwargs` (`chain_generator`), and the voter and
        Chain-of-Note's synthesis pass them per call. On by default; off gives the replies of earlier versions.
    :param vote: The post-fusion vote (`PostFusionVoter(vote=...)`): "exact" (paper 000, Eq. 2, the default) or
        "overlap" (answers that agree by token F1 >= `overlap_threshold` or containment vote together).
    :param overlap_threshold: Token F1 in (0, 1] at which two answers agree in overlap voting.
    """

    retriever: Any
    chat_generator: ChatGenerator
    max_concurrency: int | None = None
    samples_per_passage: int = 1
    max_passage_chars: int | None = DEFAULT_MAX_PASSAGE_CHARS
    unknown_patterns: list[str] | None = None
    num_candidates: int = 2
    verifier_chat_generator: ChatGenerator | None = None
    document_ranker: Any | None = None
    few_shot: bool = False
    allow_parametric_knowledge: bool = True
    note_generation_kwargs: dict[str, Any] | None = None
    min_confidence: float | None = None
    min_vote_share: float | None = None
    verifier_scoring: Scoring | None = None
    datamark: bool = False
    answer_checks: bool = True
    stop_sequences: bool = True
    vote: VoteMode = "exact"
    overlap_threshold: float = DEFAULT_OVERLAP_THRESHOLD


@dataclass(frozen=True)
class Strategy:
    """
    A registered strategy.

    :param name: Registry name.
    :param summary: One line for `haystack-fusion strategies`.
    :param source: Paper location it implements.
    :param rounds: Dependent LLM rounds on the critical path (at most).
    :param answer_component: The component whose `answers` output is the strategy's answer list.
    :param build: Builds the pipeline from a `StrategyConfig`.
    :param prompts: Names of the `PROMPTS` its pipeline can render (an evaluation record's fingerprint hashes their
        texts, so a changed prompt never mixes with records made before the change).
    :param defaults: The values its builder uses for `StrategyConfig` fields left at None (fingerprinted too).
    :param calls: LLM calls per question, in k (top-k passages) and K (SuRe's answer candidates), e.g. "1 or 1+k"
        for a fallback that runs only when the first answer abstains.
    """

    name: str
    summary: str
    source: str
    rounds: str
    answer_component: str
    build: Callable[[StrategyConfig], Pipeline] = field(repr=False)
    prompts: tuple[str, ...] = ()
    defaults: dict[str, Any] = field(default_factory=dict)
    calls: str = "1"

    @property
    def description(self) -> str:
        """
        One line that tells this strategy from the others: what it does, its LLM calls and rounds, and its source
        with each paper's authors and arXiv id (`cite`). The tool description of its served wrapper (MCP, OpenAPI).
        """
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


@dataclass(frozen=True)
class Paper:
    """
    A paper a strategy implements.

    :param title: Its title.
    :param authors: The first author's surname and "et al.".
    :param venue: Where and when it appeared.
    :param arxiv: Its arXiv identifier.
    """

    title: str
    authors: str
    venue: str
    arxiv: str

    @property
    def url(self) -> str:
        """The paper's arXiv page."""
        return f"https://arxiv.org/abs/{self.arxiv}"


PAPERS: dict[str, Paper] = {
    "000": Paper(
        "Modeling Uncertainty and Using Post-fusion as Fallback Improves Retrieval Augmented Generation with LLMs",
        "Liu et al.",
        "KnowLLM 2024",
        "2308.12574",
    ),
    "002": Paper(
        "SuRe: Summarizing Retrievals using Answer Candidates for Open-domain QA of LLMs",
        "Kim et al.",
        "ICLR 2024",
        "2404.13081",
    ),
    "004": Paper(
        "Chain-of-Note: Enhancing Robustness in Retrieval-Augmented Language Models",
        "Yu et al.",
        "arXiv 2023",
        "2311.09210",
    ),
}
"""The papers by the number `Strategy.source` cites them with ("paper 000, section 3.3")."""


def cite(source: str) -> str:
    """
    A `Strategy.source` with each "paper NNN" spelled out as authors and arXiv id.

    >>> cite("paper 000, section 3.3")
    'Liu et al. (arXiv:2308.12574), section 3.3'
    """
    return re.sub(
        r"paper (\d{3})",
        lambda match: f"{PAPERS[match[1]].authors} (arXiv:{PAPERS[match[1]].arxiv})",
        source,
    )


Parts = tuple[dict[str, Any], list[tuple[str, str]]]
"""A pipeline under construction: components by name, and (sender, receiver) connections."""


def _assemble(parts: Parts) -> Pipeline:
    """
    Build the Pipeline with components added by name and connections grouped by sender in that order.

    This is the order `Pipeline.loads(pipeline.dumps())` rebuilds a pipeline in, so the round trip gives an equal
    pipeline (Haystack compares pipelines by their serialized form, connection order included).
    """
    components, connections = parts
    pipe = Pipeline()
    for name in sorted(components):
        pipe.add_component(name, components[name])
    for sender, receiver in sorted(connections, key=lambda connection: connection[0].split(".")[0]):
        pipe.connect(sender, receiver)
    return pipe


def _prompt_chain(
    config: StrategyConfig, prompt_name: str, documents_from: str, layout: PassageLayout | None = "numbered"
) -> Parts:
    """
    passages -> prompt_builder -> llm -> answer_builder for one prompt, fed with passages from a socket; with
    `layout` None the prompt shows no passages (no PassageFormatter), the answer still cites them.
    """
    prompt = PROMPTS[prompt_name]
    components: dict[str, Any] = {
        "prompt_builder": prompt.builder(),
        "llm": chain_generator(config.chat_generator, prompt.stop if config.stop_sequences else ()),
        "answer_builder": _answer_builder(config, prompt),
    }
    connections = [("prompt_builder.prompt", "llm.messages"), (documents_from, "answer_builder.documents")]
    if layout is not None:
        components["passages"] = PassageFormatter(
            max_passage_chars=config.max_passage_chars, layout=layout, datamark=config.datamark
        )
        connections = [
            (documents_from, "passages.documents"),
            ("passages.passages", "prompt_builder.passages"),
            *connections,
        ]
    return components, connections


def chain_generator(chat_generator: ChatGenerator, stop: tuple[str, ...]) -> ChatGenerator:
    """
    The generator of a one-prompt chain whose reply should end at `stop`: a copy of `chat_generator` (rebuilt from
    its `to_dict`, so it shares nothing but its settings; the embedded model's copies share the loaded model and its
    reply cache) whose `generation_kwargs` add `stop` to its own stop sequences (`llm_calls.stop_kwargs`), so the
    YAML of the pipeline shows them.

    :param chat_generator: The strategy's generator.
    :param stop: The prompt's stop sequences; empty returns `chat_generator` itself.
    :returns: The copy, or `chat_generator` itself when there is nothing to add, when it takes no
        `generation_kwargs` (a mock) or when it cannot be serialized (a secret given as a token): then the prompt's
        own answer pattern still reads the first line, the reply is only longer.
    """
    own = getattr(chat_generator, "generation_kwargs", None)
    kwargs = stop_kwargs(chat_generator, stop)
    if not kwargs or not isinstance(own, dict) or kwargs.get("stop") == own.get("stop"):
        return chat_generator
    try:
        data = component_to_dict(chat_generator, "llm")
    except Exception as error:  # e.g. Secret.from_token: not serializable, so not copied
        logger.warning(
            "Cannot copy {generator} to add stop sequences: {error}", generator=type(chat_generator), error=error
        )
        return chat_generator
    data["init_parameters"]["generation_kwargs"] = {**own, **kwargs}
    copy = component_from_dict(type(chat_generator), data, "llm")
    # a generator whose calls hold the process's call slots (`llm_calls.limit_calls`) gives a copy that does too
    return limit_calls(copy) if getattr(chat_generator, "_haystack_fusion_call_slots", False) else copy


def _answer_builder(config: StrategyConfig, prompt: PromptTemplate) -> AnswerBuilder:
    """The prompt's answer reader: Haystack's AnswerBuilder, with the answer validator unless `answer_checks` is off."""
    if not config.answer_checks:
        return AnswerBuilder(pattern=prompt.answer_pattern)
    return CheckedAnswerBuilder(pattern=prompt.answer_pattern, demonstrations=list(prompt.demonstrations) or None)


def _voter(config: StrategyConfig, min_vote_share: float | None = None) -> PostFusionVoter:
    return PostFusionVoter(
        chat_generator=config.chat_generator,
        max_concurrency=config.max_concurrency,
        samples_per_passage=config.samples_per_passage,
        max_passage_chars=config.max_passage_chars,
        unknown_patterns=config.unknown_patterns,
        min_vote_share=min_vote_share,
        split_candidates=max(2, config.num_candidates),
        datamark=config.datamark,
        answer_checks=config.answer_checks,
        stop_sequences=config.stop_sequences,
        vote=config.vote,
        overlap_threshold=config.overlap_threshold,
    )


def _single_prompt(prompt_name: str, layout: PassageLayout = "numbered") -> Callable[[StrategyConfig], Pipeline]:
    def build(config: StrategyConfig) -> Pipeline:
        components, connections = _prompt_chain(config, prompt_name, "retriever.documents", layout)
        components["retriever"] = config.retriever
        connections.append(("llm.replies", "answer_builder.replies"))
        return _assemble((components, connections))

    return build


def _post_fusion(config: StrategyConfig) -> Pipeline:
    return _assemble(
        ({"retriever": config.retriever, "voter": _voter(config)}, [("retriever.documents", "voter.documents")])
    )


def _fallback_chain(config: StrategyConfig, min_confidence: float | None, min_vote_share: float | None) -> Parts:
    """
    Concatenation, routed on its answer (unknown, or confidence below `min_confidence`) to post-fusion over the same
    passages; both answers go to the joiner. The confidence needs a generator that returns token log-probabilities
    (`llm_calls.supports_logprobs`); with one that does not, the text signal alone decides. A concatenation call that
    fails (after the generator's retries) gives no answer either, so it goes to post-fusion too ("no reply"): its
    generator is wrapped in an `AbstainingChatGenerator`, which reports the failure instead of raising it.
    """
    components, connections = _prompt_chain(config, "figure7", "retriever.documents")
    components.update(
        llm=AbstainingChatGenerator(chat_generator=components["llm"]),
        retriever=config.retriever,
        router=UnknownRouter(
            answer_pattern=PROMPTS["figure7"].answer_pattern,
            unknown_patterns=config.unknown_patterns,
            min_confidence=min_confidence,
            answer_checks=config.answer_checks,
            demonstrations=list(PROMPTS["figure7"].demonstrations),
        ),
        voter=_voter(config, min_vote_share),
        joiner=AnswerJoiner(),
    )
    connections += [
        ("llm.replies", "router.replies"),
        ("retriever.documents", "router.documents"),
        ("router.known", "answer_builder.replies"),
        ("router.fallback_query", "voter.query"),
        ("router.fallback_documents", "voter.documents"),
        ("answer_builder.answers", "joiner.answers"),
        ("voter.answers", "joiner.answers"),
    ]
    return components, connections


def _concat_pf(config: StrategyConfig) -> Pipeline:
    """
    Concatenation; when its answer is unknown (or, with `min_confidence`, less confident than tau), post-fusion over
    the same passages (paper 000, section 3.3).
    """
    return _assemble(_fallback_chain(config, config.min_confidence, None))


CASCADE_MIN_CONFIDENCE = 0.25
"""tau, the `cascade` strategy's default confidence floor for the concatenation answer: the replayed concat_pf sweep's
best SQuAD 2.0 EM on a development split kept apart from the reported sample (docs/evaluation.md, "Choosing tau and
s")."""

CASCADE_MIN_VOTE_SHARE = 0.5
"""s, the `cascade` strategy's default: a post-fusion winner with less than half of the votes (or a tie at the top)
is verified by SuRe. Not yet chosen on data (docs/evaluation.md, "Choosing tau and s")."""


def _cascade(config: StrategyConfig) -> Pipeline:
    """
    Concatenation -> post-fusion when it says unknown or is unsure -> SuRe's verification of the top-K post-fusion
    candidates when the vote is split, each candidate summarized from the passages that produced it.
    """
    tau = CASCADE_MIN_CONFIDENCE if config.min_confidence is None else config.min_confidence
    share = CASCADE_MIN_VOTE_SHARE if config.min_vote_share is None else config.min_vote_share
    components, connections = _fallback_chain(config, tau, share)
    components.update(
        summarizer=_summarizer(config, "conditional"),
        verifier=_verifier(config, use_validity=True, scoring=config.verifier_scoring or "probability"),
    )
    connections += [
        ("voter.split_query", "summarizer.query"),
        ("retriever.documents", "summarizer.documents"),
        ("voter.split_candidates", "summarizer.candidates"),
        ("voter.split_documents", "summarizer.candidate_documents"),
        ("voter.split_query", "verifier.query"),
        ("retriever.documents", "verifier.documents"),
        ("summarizer.candidates", "verifier.candidates"),
        ("summarizer.summaries", "verifier.summaries"),
        ("verifier.answers", "joiner.answers"),
    ]
    return _assemble((components, connections))


def _pf_concat(config: StrategyConfig) -> Pipeline:
    """
    Post-fusion candidates, then one concatenation over the passages that did not say unknown (section 3.3).

    When every passage said unknown the voter emits no candidates, the distiller round does not run, and the
    voter's "unknown" answer reaches the joiner instead.
    """
    components, connections = _prompt_chain(config, "distiller", "voter.documents")
    components.update(retriever=config.retriever, voter=_voter(config), joiner=AnswerJoiner())
    connections += [
        ("retriever.documents", "voter.documents"),
        ("voter.candidates", "prompt_builder.candidates"),
        ("llm.replies", "answer_builder.replies"),
        ("answer_builder.answers", "joiner.answers"),
        ("voter.unknown", "joiner.answers"),
    ]
    return _assemble((components, connections))


def _no_datamark(config: StrategyConfig, component: str) -> None:
    """Refuse `datamark` for a component that formats its passages itself without it."""
    if config.datamark:
        raise ValueError(f"`datamark` is not supported by strategies with a {component} (only paper 000's strategies)")


def _summarizer(config: StrategyConfig, mode: SummaryMode) -> CandidateSummarizer:
    _no_datamark(config, "CandidateSummarizer")
    return CandidateSummarizer(
        chat_generator=config.chat_generator,
        num_candidates=config.num_candidates,
        mode=mode,
        max_concurrency=config.max_concurrency,
        max_passage_chars=config.max_passage_chars,
        few_shot=config.few_shot,
        answer_checks=config.answer_checks,
    )


def _verifier(config: StrategyConfig, use_validity: bool, scoring: Scoring) -> SummaryVerifier:
    return SummaryVerifier(
        chat_generator=config.verifier_chat_generator or config.chat_generator,
        use_validity=use_validity,
        max_concurrency=config.max_concurrency,
        document_ranker=config.document_ranker,
        scoring=scoring,
    )


def _sure(use_validity: bool) -> Callable[[StrategyConfig], Pipeline]:
    """Candidates and conditional summaries, then verification (paper 002, Algorithm 1; Table 3 ablation)."""

    def build(config: StrategyConfig) -> Pipeline:
        verifier = _verifier(config, use_validity, config.verifier_scoring or "text")
        components = {
            "retriever": config.retriever,
            "summarizer": _summarizer(config, "conditional"),
            "verifier": verifier,
        }
        connections = [
            ("retriever.documents", "summarizer.documents"),
            ("retriever.documents", "verifier.documents"),
            ("summarizer.candidates", "verifier.candidates"),
            ("summarizer.summaries", "verifier.summaries"),
        ]
        return _assemble((components, connections))

    return build


def _summarize_then_answer(mode: SummaryMode, prompt_name: str, reads: str) -> Callable[[StrategyConfig], Pipeline]:
    """
    Paper 002's prompting baselines: a CandidateSummarizer round, then one answer prompt that reads its `reads`
    output (`summaries` or `candidates`), with the passages (titled layout) unless the generic summary replaces them.
    """

    def build(config: StrategyConfig) -> Pipeline:
        # Sum-and-pred (Gen): the generic summary stands in for the passages
        layout: PassageLayout | None = None if mode == "generic" else "titled"
        components, connections = _prompt_chain(config, prompt_name, "retriever.documents", layout=layout)
        components.update(retriever=config.retriever, summarizer=_summarizer(config, mode))
        connections += [
            ("retriever.documents", "summarizer.documents"),
            (f"summarizer.{reads}", f"prompt_builder.{reads}"),
            ("llm.replies", "answer_builder.replies"),
        ]
        return _assemble((components, connections))

    return build


def _chain_of_note(mode: NoteMode) -> Callable[[StrategyConfig], Pipeline]:
    """Reading notes per passage, then the answer (paper 004, section 2.3)."""

    def build(config: StrategyConfig) -> Pipeline:
        _no_datamark(config, "NoteTaker")
        note_taker = NoteTaker(
            chat_generator=config.chat_generator,
            mode=mode,
            allow_parametric_knowledge=config.allow_parametric_knowledge,
            max_concurrency=config.max_concurrency,
            max_passage_chars=config.max_passage_chars,
            generation_kwargs=config.note_generation_kwargs,
            unknown_patterns=config.unknown_patterns,
            answer_checks=config.answer_checks,
            stop_sequences=config.stop_sequences,
        )
        components = {"retriever": config.retriever, "note_taker": note_taker}
        return _assemble((components, [("retriever.documents", "note_taker.documents")]))

    return build


STRATEGIES: dict[str, Strategy] = {
    strategy.name: strategy
    for strategy in (
        Strategy(
            "concatenation",
            "all top-k passages in one prompt, one LLM call",
            "paper 000, section 3.2.1, Eq. 1, Figure 7",
            "1",
            "answer_builder",
            _single_prompt("figure7"),
            prompts=("figure7",),
        ),
        Strategy(
            "post_fusion",
            "one LLM call per passage, majority vote over the answers",
            "paper 000, section 3.2.1, Eq. 2, Figure 7",
            "1",
            "voter",
            _post_fusion,
            prompts=("figure7",),
            calls="k",
        ),
        Strategy(
            "pruning",
            "one-shot chain-of-thought prompt that prunes irrelevant passages",
            "paper 000, section 3.2.2, Figure 8",
            "1",
            "answer_builder",
            _single_prompt("pruning"),
            prompts=("pruning",),
        ),
        Strategy(
            "summary_cot",
            "one-shot chain-of-thought prompt that summarizes the relevant passages",
            "paper 000, section 3.2.2, Figure 9",
            "1",
            "answer_builder",
            _single_prompt("summary"),
            prompts=("summary",),
        ),
        Strategy(
            "concat_pf",
            "concatenation; post-fusion as the fallback when it answers unknown",
            "paper 000, section 3.3, Figure 2 (top)",
            "1-2",
            "joiner",
            _concat_pf,
            prompts=("figure7",),
            calls="1 or 1+k",
        ),
        Strategy(
            "pf_concat",
            "post-fusion candidates, then concatenation of the answering passages as the distiller",
            "paper 000, section 3.3, Figure 2 (bottom)",
            "1-2",
            "joiner",
            _pf_concat,
            prompts=("figure7", "distiller"),
            calls="k+1",
        ),
        Strategy(
            "cascade",
            "concatenation; post-fusion when unknown or unsure; SuRe's verification when the vote is split",
            "paper 000, section 3.3 + paper 002, section 3.3, Eq. 4-6 (this package's combination)",
            "1-4",
            "joiner",
            _cascade,
            prompts=("figure7", "sure_summary", "sure_few_shot_summary", "sure_validity", "sure_ranking"),
            defaults={
                "min_confidence": CASCADE_MIN_CONFIDENCE,
                "min_vote_share": CASCADE_MIN_VOTE_SHARE,
                "verifier_scoring": "probability",
            },
            calls="1, 1+k or 1+k+2K+K(K-1)",
        ),
        Strategy(
            "base",
            "all top-k passages in one prompt, one LLM call (paper 002's Base)",
            "paper 002, Appendix A.5, Listing 10, Table 3 (Base)",
            "1",
            "answer_builder",
            _single_prompt("sure_base", layout="titled"),
            prompts=("sure_base",),
        ),
        Strategy(
            "sure",
            "K answer candidates, a summary per candidate, pick by validity + pair-wise ranking",
            "paper 002, section 3, Algorithm 1, Eq. 2-6",
            "3",
            "verifier",
            _sure(use_validity=True),
            prompts=(
                "sure_candidates",
                "sure_few_shot_candidates",
                "sure_summary",
                "sure_few_shot_summary",
                "sure_validity",
                "sure_ranking",
            ),
            calls="1+2K+K(K-1)",
        ),
        Strategy(
            "sure_rank_only",
            "SuRe without instance-wise validity: pick by pair-wise ranking alone",
            "paper 002, section 4.3, Table 3 (+ Pair-wise ranking)",
            "3",
            "verifier",
            _sure(use_validity=False),
            prompts=(
                "sure_candidates",
                "sure_few_shot_candidates",
                "sure_summary",
                "sure_few_shot_summary",
                "sure_ranking",
            ),
            calls="1+K+K(K-1)",
        ),
        Strategy(
            "sure_sum_all",
            "all conditional summaries appended to the passages, one answer call",
            "paper 002, section 4.3, Table 3 (+ Conditional summarizations)",
            "3",
            "answer_builder",
            _summarize_then_answer("conditional", "sure_sum_all", "summaries"),
            prompts=(
                "sure_candidates",
                "sure_few_shot_candidates",
                "sure_summary",
                "sure_few_shot_summary",
                "sure_sum_all",
            ),
            calls="1+K+1",
        ),
        Strategy(
            "mcq",
            "the answer candidates as multiple choices next to the passages",
            "paper 002, Appendix A.7, Listing 12, Table 3 (MCQ prompt)",
            "2",
            "answer_builder",
            _summarize_then_answer("candidates", "sure_mcq", "candidates"),
            prompts=("sure_candidates", "sure_few_shot_candidates", "sure_mcq"),
            calls="2",
        ),
        Strategy(
            "generic_summary",
            "one generic summary of the passages, then the answer from the summary",
            "paper 002, Appendix A.6, Listing 11, Table 3 (Sum-and-pred (Gen))",
            "2",
            "answer_builder",
            _summarize_then_answer("generic", "sure_sum_and_pred", "summaries"),
            prompts=("sure_generic_summary", "sure_sum_and_pred"),
            calls="2",
        ),
        Strategy(
            "chain_of_note",
            "one prompt: a reading note per passage with its relevance, then the answer",
            "paper 004, section 2.3, Appendix A.5",
            "1",
            "note_taker",
            _chain_of_note("single_call"),
            prompts=("con_single_call", "con_synthesis"),
        ),
        Strategy(
            "chain_of_note_per_document",
            "a reading note per passage concurrently, then one synthesis call",
            "paper 004, section 2.3.1 (per-document notes)",
            "2",
            "note_taker",
            _chain_of_note("per_document"),
            prompts=("con_document_note", "con_synthesis"),
            calls="k+1",
        ),
    )
}
"""Every registered strategy, by name: paper 000's Table 1, paper 002's SuRe with its ablations and baselines, then
paper 004's Chain-of-Note."""


def get_strategy(name: str) -> Strategy:
    """
    Look a strategy up by name.

    :raises ValueError: If there is no such strategy; the message lists the registered names.
    """
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; registered strategies: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def build_pipeline(name: str, **config: Any) -> Pipeline:
    """
    Build the pipeline of a registered strategy.

    ### Usage example
    ```python
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
    from haystack_fusion.backends import load_store, local_chat_generator
    from haystack_fusion.strategies import build_pipeline, run_strategy

    # the index made by `haystack-fusion index passages.jsonl --store index.json`
    retriever = InMemoryBM25Retriever(load_store("index.json"), top_k=5)
    pipe = build_pipeline("concat_pf", retriever=retriever, chat_generator=local_chat_generator())
    print(run_strategy("concat_pf", pipe, "Which river flows through the capital?").answer.data)
    ```

    :param name: A registered strategy name.
    :param config: The fields of `StrategyConfig` (`retriever` and `chat_generator` are required).
    :returns: A new Pipeline.
    :raises ValueError: If the strategy is not registered.
    """
    return get_strategy(name).build(StrategyConfig(**config))


@dataclass
class StrategyRun:
    """
    The outcome of one question through one strategy pipeline.

    :param answer: The strategy's answer (the first of `answers`; "unknown" when there is none).
    :param answers: The full answer list of the strategy's answer component.
    :param documents: The retrieved passages (top-k, in rank order).
    :param evidence: What the strategy saw: `fallback` (concat_pf: did post-fusion run), `votes` (normalized answer
        -> count), `candidates` (the post-fusion pool, or SuRe's answer candidates), `summaries` (SuRe's summaries),
        `scores` (SuRe: per answer, best first, `candidate_index`, `validity`, `ranking`, `score`), `notes` and
        `answer_source` (Chain-of-Note), `label_summaries` (SuRe: how many summaries are only a candidate's label,
        `sure.summary_is_label`), `vote_share` (post-fusion's winner), `components_run` (names of the components that
        ran, sorted), `stages`
        (concat_pf, cascade: `stage_trace`), `confidence` (the answer's, in [0, 1], None when unavailable) and, only
        when an LLM call failed, `failures` (`pipeline_failures`: which component's call, and the error).
    :param usage: Summed usage of every LLM call: `prompt_tokens`, `completion_tokens`, `calls`, `failed_calls`,
        `http_requests` when every call's requests were counted, and `cached_tokens` when any call's provider
        reported them (`pipeline_usage`).
    :param seconds: Wall-clock time of the pipeline run, in seconds.
    """

    answer: GeneratedAnswer
    answers: list[GeneratedAnswer]
    documents: list[Document]
    evidence: dict[str, Any]
    usage: dict[str, int]
    seconds: float

    def answer_text(self) -> str:
        """
        The answer as a person should read it: the answer, or, when the answer checks rejected it
        (`evidence["answer_source"] == "invalid"`), what was rejected and why, e.g.
        `(no valid answer: passage markup: '<passage key="1c6071d9">')`.
        """
        if self.evidence.get("answer_source") == "invalid":
            reason, rejected = self.evidence.get("invalid_reason"), self.evidence.get("rejected_answer")
            return f"(no valid answer: {reason}: {rejected!r})"
        return self.answer.data or ""


def pipeline_usage(pipeline: Pipeline, outputs: dict[str, dict[str, Any]]) -> dict[str, int]:
    """
    Sum the usage of every LLM call in a pipeline run's outputs (run with every component in include_outputs_from).

    Counts each ChatGenerator reply in a `replies` output once (and each such generator run as one round), plus
    the usage that this package's LLM components (those wrapping a `chat_generator`) report in their `meta` output
    (CandidateSummarizer, AbstainingChatGenerator) or on their first answer's `meta` (PostFusionVoter,
    SummaryVerifier): that usage counts their calls, so the `replies` of such a component (AbstainingChatGenerator's)
    are not counted again. Answers passed on by joiners are not counted again either.

    :param pipeline: The pipeline that ran.
    :param outputs: `Pipeline.run(..., include_outputs_from=<all components>)` result.
    :returns: Summed `prompt_tokens`, `completion_tokens`, `calls`, `failed_calls` and `rounds` (dependent LLM
        rounds that ran), and `http_requests` (retries included) when every counted call reported its requests: a
        generator component's own calls (plain `replies`) do not, so a partial count is left out rather than shown.
        `cached_tokens` (prompt tokens served from the provider's prefix cache, `llm_calls.cached_prompt_tokens`) is
        the sum over the calls whose provider reported it, and absent when none did: not reported is not a miss.
    """
    usages: list[dict[str, Any] | None] = []
    for name, output in outputs.items():
        reported = (_own_meta(pipeline, name, output) or {}).get("usage")
        if reported is not None:
            usages.append(reported)
            continue
        replies = output.get("replies") or []
        usages.extend(reply_usage(reply) for reply in replies)
        if replies:
            usages.append({"rounds": 1})
    total = sum_usage(usages)
    counted = sum(int(usage.get("calls") or 0) for usage in usages if usage and "http_requests" in usage)
    if counted != total["calls"]:
        total.pop("http_requests", None)
    return total


def _own_meta(pipeline: Pipeline, name: str, output: dict[str, Any]) -> dict[str, Any] | None:
    """
    What one of this package's LLM components (those wrapping a `chat_generator`) reports about its own calls: its
    `meta` output, or its first answer's `meta` (a split vote emits `split`, not `answers`).

    :returns: That `meta` (empty when the component emitted neither), or None for any other component.
    """
    if not hasattr(pipeline.get_component(name), "_chat_generator"):
        return None
    if isinstance(output.get("meta"), dict):
        return output["meta"]
    answers = output.get("answers") or output.get("split") or []
    return answers[0].meta if answers else {}


def pipeline_failures(pipeline: Pipeline, outputs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """
    The failed LLM calls of a pipeline run: what this package's LLM components report in `meta["failures"]` (their
    `meta` output, or their first answer's `meta`, as `pipeline_usage` reads their usage), each tagged with the
    component's name. A call that failed counted as an abstention (or a False / unreadable score); this says which.

    :param pipeline: The pipeline that ran.
    :param outputs: `Pipeline.run(..., include_outputs_from=<all components>)` result.
    :returns: One dict per failed call: `component` (its name in the pipeline), the component's own keys (`index`,
        `round`, `rank`, `sample`, `call`) and `error` ("ExceptionType: message"); empty when none failed.
    """
    failures: list[dict[str, Any]] = []
    for name, output in outputs.items():
        meta = _own_meta(pipeline, name, output) or {}
        failures.extend({"component": name, **failure} for failure in meta.get("failures") or [])
    return failures


def stage_trace(outputs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """
    Which stage of a fallback strategy (`concat_pf`, `cascade`) answered, and why the earlier ones did not.

    :param outputs: The pipeline run's outputs, with every component in `include_outputs_from`.
    :returns: One entry per stage that ran, in order: `stage` ("concatenation", "post_fusion", "sure"), `answered`
        (bool) and, for a stage that passed the question on, `reason` (the router's: "unknown answer", "confidence
        0.31 < 0.5"; the voter's: "tie at the top", "vote share 0.40 < 0.5"). The last entry answered.
    """
    router = outputs.get("router", {})
    if "unknown" not in router:
        return [{"stage": "concatenation", "answered": True}]
    stages: list[dict[str, Any]] = [{"stage": "concatenation", "answered": False, "reason": router.get("reason")}]
    voter = outputs.get("voter", {})
    split = voter.get("split")
    if not split:
        return [*stages, {"stage": "post_fusion", "answered": True}]
    stages.append({"stage": "post_fusion", "answered": False, "reason": split[0].meta.get("split_reason")})
    return [*stages, {"stage": "sure", "answered": "verifier" in outputs}]


def run_strategy(
    name: str,
    pipeline: Pipeline,
    query: str,
    *,
    top_k: int | None = None,
    retriever_inputs: dict[str, Any] | None = None,
) -> StrategyRun:
    """
    Ask one question through a strategy pipeline and gather its answer, evidence and usage.

    :param name: The registered strategy the pipeline was built for.
    :param pipeline: A pipeline from `build_pipeline(name, ...)` (or loaded from its YAML).
    :param query: The question.
    :param top_k: Passages to retrieve; None keeps the retriever's own `top_k`.
    :param retriever_inputs: Further run inputs of the `retriever` component (the evaluation's per-question gold
        data for `EvalRetriever`).
    :returns: A `StrategyRun`. Every answer whose reply carried token log-probabilities gets `meta["confidence"]`
        (`answers.answer_confidence`); the answer of a fallback strategy gets `meta["stage"]` and `meta["stages"]`
        (`stage_trace`) and, when an LLM call of any stage failed, `meta["failures"]` (`pipeline_failures`: a failed
        concatenation call, which sent the question on to post-fusion, included).
    :raises ValueError: If the question is empty or only whitespace, or the strategy is not registered.
    """
    get_strategy(name)  # ValueError for an unregistered strategy, before anything runs
    query = validate_query(query)
    data: dict[str, dict[str, Any]] = {
        component: {"query": query} for component, sockets in pipeline.inputs().items() if "query" in sockets
    }
    if top_k is not None:
        data.setdefault("retriever", {})["top_k"] = top_k
    if retriever_inputs:
        data.setdefault("retriever", {}).update(retriever_inputs)
    components = [component for component, _ in pipeline.walk()]
    start = time.perf_counter()
    outputs = pipeline.run(data=data, include_outputs_from=set(components))
    return strategy_run(name, pipeline, query, outputs, seconds=time.perf_counter() - start)


def strategy_run(
    name: str, pipeline: Pipeline, query: str, outputs: dict[str, dict[str, Any]], *, seconds: float = 0.0
) -> StrategyRun:
    """
    Gather a `StrategyRun` from a strategy pipeline's outputs: what `run_strategy` returns, for a run made another way
    (e.g. `Pipeline.run_async_generator` while streaming, as the Hayhooks wrappers do).

    :param name: The registered strategy the pipeline was built for.
    :param pipeline: Its pipeline (read for its component names and usage, not run).
    :param query: The question asked (the answer's query when the strategy gave no answer).
    :param outputs: Component name -> that component's outputs, for every component that ran (a run with every
        component in `include_outputs_from`).
    :param seconds: Wall-clock time of the run, in seconds.
    :returns: The `StrategyRun`, with answer meta (`confidence`, `stage`, `stages`, `failures`) as `run_strategy`
        adds it.
    :raises ValueError: If the strategy is not registered.
    """
    strategy = get_strategy(name)
    components = [component for component, _ in pipeline.walk()]
    answers = outputs.get(strategy.answer_component, {}).get("answers") or []
    answer = answers[0] if answers else GeneratedAnswer(data=UNKNOWN, query=query, documents=[], meta={})
    voter_answers = outputs.get("voter", {}).get("answers") or outputs.get("voter", {}).get("split") or []
    summarizer = outputs.get("summarizer", {})
    evidence: dict[str, Any] = {
        "components_run": [component for component in components if component in outputs],
        "votes": voter_answers[0].meta.get("votes") if voter_answers else None,
        "candidates": outputs.get("voter", {}).get("candidates") or summarizer.get("candidates"),
    }
    if summarizer:
        evidence["summaries"] = summarizer.get("summaries")
        evidence["label_summaries"] = sum(
            summary_is_label(summary, summarizer.get("candidates") or []) for summary in evidence["summaries"] or []
        )
        if rejected := (summarizer.get("meta") or {}).get("invalid_candidates"):
            evidence["invalid_candidates"] = len(rejected)
    if voter_answers:
        evidence["vote_share"] = voter_answers[0].meta.get("vote_share")
    if "note_taker" in outputs:
        evidence["notes"] = outputs["note_taker"].get("notes")
        evidence["answer_source"] = answer.meta.get("answer_source")
    if "verifier" in outputs:
        evidence["scores"] = [
            {key: a.meta.get(key) for key in ("candidate_index", "validity", "ranking", "score")} for a in answers
        ]
    if "router" in outputs:
        evidence["fallback"] = "unknown" in outputs["router"]
        evidence["stages"] = stage_trace(outputs)
        answer.meta.update(stage=evidence["stages"][-1]["stage"], stages=evidence["stages"])
    for item in answers:
        if "confidence" not in item.meta and (confidence := answer_confidence(item.meta, item.data)) is not None:
            item.meta["confidence"] = confidence
    evidence["confidence"] = answer.meta.get("confidence")
    if answer.meta.get("finish_reason") is not None:  # the answer is one reply's: did the token cap cut it?
        evidence["finish_reason"] = answer.meta["finish_reason"]
    if is_invalid(answer.meta):
        evidence.update({key: answer.meta.get(key) for key in ("answer_source", "invalid_reason", "rejected_answer")})
    if voter_answers and voter_answers[0].meta.get("invalid_answers"):
        evidence["invalid_answers"] = voter_answers[0].meta["invalid_answers"]
    if voter_answers and voter_answers[0].meta.get("vote"):  # overlap voting: %NM reads the pool the same way
        evidence.update({key: voter_answers[0].meta[key] for key in ("vote", "overlap_threshold")})
    if failures := pipeline_failures(pipeline, outputs):
        evidence["failures"] = failures
        if "router" in outputs:  # the answer of a later stage says which calls failed, the earlier stages' included
            answer = dataclasses.replace(answer, meta={**answer.meta, "failures": failures})
            answers = [answer, *answers[1:]] if answers else answers
    return StrategyRun(
        answer=answer,
        answers=answers,
        documents=outputs.get("retriever", {}).get("documents") or [],
        evidence=evidence,
        usage=pipeline_usage(pipeline, outputs),
        seconds=seconds,
    )
