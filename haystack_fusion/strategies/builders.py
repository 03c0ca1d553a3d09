"""
The pipeline builders: one function per strategy, from a `StrategyConfig` to its components and connections,
and `assemble`, which makes them a Haystack `Pipeline`.

Every strategy is a `Pipeline` from the passages (a `documents` input, or a retriever's `documents`) to one list of
`GeneratedAnswer` (the output of the component named by `Strategy.answer_component`). Every question socket is named
`query`, so `pipeline.run({"query": ..., "documents": ...})` reaches the prompt builders, the answer builders (and a
retriever) alike.
Strategies that need no component of their own are this package's PassageFormatter plus Haystack's
ChatPromptBuilder, the ChatGenerator and AnswerBuilder.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from haystack import Pipeline, logging
from haystack.components.generators.chat.types import ChatGenerator
from haystack.components.joiners import AnswerJoiner
from haystack.core.serialization import component_from_dict, component_to_dict

from haystack_fusion.components.abstaining_chat_generator import AbstainingChatGenerator
from haystack_fusion.components.candidate_summarizer import CandidateSummarizer, SummaryMode
from haystack_fusion.components.checked_answer_builder import CheckedAnswerBuilder
from haystack_fusion.components.note_taker import NoteMode, NoteTaker
from haystack_fusion.components.passage_formatter import PassageFormatter
from haystack_fusion.components.post_fusion_voter import PostFusionVoter
from haystack_fusion.components.split_vote_router import SplitVoteRouter
from haystack_fusion.components.summary_verifier import Scoring, SummaryVerifier
from haystack_fusion.components.unknown_router import UnknownRouter
from haystack_fusion.llm import CallLimitedChatGenerator, stop_kwargs, unwrap_call_limit
from haystack_fusion.prompts import PROMPTS, PassageLayout
from haystack_fusion.strategies.config import DOCUMENTS, RETRIEVER, SPLIT_ROUTER, Parts, Stage, StrategyConfig

logger = logging.getLogger(__name__)

ANSWER = Stage("answer", "llm")
CONCATENATION = Stage("concatenation", "router")
POST_FUSION = Stage("post_fusion", "voter")
SUMMARIES = Stage("summaries", "summarizer")
VERIFICATION = Stage("verification", "verifier")
NOTES = Stage("notes", "note_taker")
"""The stages the builders below wire, by the component that runs each (`Strategy.stages` lists them)."""


def assemble(parts: Parts, *, strategy: str, retriever: Any | None = None) -> Pipeline:
    """
    Build the Pipeline with components added by name and connections grouped by sender in that order.

    This is the order `Pipeline.loads(pipeline.dumps())` rebuilds a pipeline in, so the round trip gives an equal
    pipeline (Haystack compares pipelines by their serialized form, connection order included).

    :param parts: The strategy's components and connections.
    :param strategy: The strategy's name, kept in `Pipeline.metadata["strategy"]`.
    :param retriever: The component named `retriever` whose `documents` feed every passage socket; None leaves those
        sockets as the pipeline's `documents` input.
    """
    components, connections = parts
    if retriever is not None:
        components = {**components, RETRIEVER: retriever}
        connections = [(f"{RETRIEVER}.documents" if s == DOCUMENTS else s, r) for s, r in connections]
    else:
        connections = [(s, r) for s, r in connections if s != DOCUMENTS]
    pipe = Pipeline(metadata={"strategy": strategy})
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
        "llm": chain_generator(config.chat_generator, prompt.stop),
        "answer_builder": CheckedAnswerBuilder(
            pattern=prompt.answer_pattern, demonstrations=list(prompt.demonstrations) or None
        ),
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
    reply cache) whose `generation_kwargs` add `stop` to its own stop sequences (`llm.stop_kwargs`), so the
    YAML of the pipeline shows them. A `CallLimitedChatGenerator` gives a copy of the generator it wraps, wrapped
    again: its calls hold the process's call slots as the original's do.

    :param chat_generator: The strategy's generator.
    :param stop: The prompt's stop sequences; empty returns `chat_generator` itself.
    :returns: The copy, or `chat_generator` itself when there is nothing to add, when it takes no
        `generation_kwargs` (a mock) or when it cannot be serialized (a secret given as a token): then the prompt's
        own answer pattern still reads the first line, the reply is only longer.
    """
    generator = unwrap_call_limit(chat_generator)
    own = getattr(generator, "generation_kwargs", None)
    kwargs = stop_kwargs(generator, stop)
    if not kwargs or not isinstance(own, dict) or kwargs.get("stop") == own.get("stop"):
        return chat_generator
    try:
        data = component_to_dict(generator, "llm")
    except Exception as error:  # e.g. Secret.from_token: not serializable, so not copied
        logger.warning("Cannot copy {generator} to add stop sequences: {error}", generator=type(generator), error=error)
        return chat_generator
    data["init_parameters"]["generation_kwargs"] = {**own, **kwargs}
    copy = component_from_dict(type(generator), data, "llm")
    if isinstance(chat_generator, CallLimitedChatGenerator):
        return CallLimitedChatGenerator(chat_generator=copy)
    return copy


def _voter(config: StrategyConfig) -> PostFusionVoter:
    return PostFusionVoter(
        chat_generator=config.chat_generator,
        max_concurrency=config.max_concurrency,
        samples_per_passage=config.samples_per_passage,
        max_passage_chars=config.max_passage_chars,
        unknown_patterns=config.unknown_patterns,
        datamark=config.datamark,
    )


def _single_prompt(prompt_name: str, layout: PassageLayout = "numbered") -> Callable[[StrategyConfig], Parts]:
    def build(config: StrategyConfig) -> Parts:
        components, connections = _prompt_chain(config, prompt_name, DOCUMENTS, layout)
        connections.append(("llm.replies", "answer_builder.replies"))
        return components, connections

    return build


def _post_fusion(config: StrategyConfig) -> Parts:
    return {"voter": _voter(config)}, [(DOCUMENTS, "voter.documents")]


def _fallback_chain(config: StrategyConfig, min_confidence: float | None) -> Parts:
    """
    Concatenation, routed on its answer (unknown, or confidence below `min_confidence`) to post-fusion over the same
    passages; the concatenation answer goes to the joiner, the caller connects the voter's. The confidence needs a
    generator that returns token log-probabilities (`llm.supports_logprobs`); with one that does not, the text signal
    alone decides. A concatenation call that fails (after the generator's retries) gives no answer either, so it goes
    to post-fusion too ("no reply"): its generator is wrapped in an `AbstainingChatGenerator`, which reports the
    failure instead of raising it.
    """
    components, connections = _prompt_chain(config, "figure7", DOCUMENTS)
    components.update(
        llm=AbstainingChatGenerator(chat_generator=components["llm"]),
        router=UnknownRouter(
            answer_pattern=PROMPTS["figure7"].answer_pattern,
            unknown_patterns=config.unknown_patterns,
            min_confidence=min_confidence,
            demonstrations=list(PROMPTS["figure7"].demonstrations),
        ),
        voter=_voter(config),
        joiner=AnswerJoiner(),
    )
    connections += [
        ("llm.replies", "router.replies"),
        (DOCUMENTS, "router.documents"),
        ("router.known", "answer_builder.replies"),
        ("router.fallback_query", "voter.query"),
        ("router.fallback_documents", "voter.documents"),
        ("answer_builder.answers", "joiner.answers"),
    ]
    return components, connections


def _concat_pf(config: StrategyConfig) -> Parts:
    """
    Concatenation; when its answer is unknown (or, with `min_confidence`, less confident than tau), post-fusion over
    the same passages (Liu et al., section 3.3).
    """
    components, connections = _fallback_chain(config, config.min_confidence)
    return components, [*connections, ("voter.answers", "joiner.answers")]


CASCADE_MIN_CONFIDENCE = 0.25
"""tau, the `cascade` strategy's default confidence floor for the concatenation answer: the replayed concat_pf sweep's
best SQuAD 2.0 EM on a development split kept apart from the reported sample."""

CASCADE_MIN_VOTE_SHARE = 0.5
"""s, the `cascade` strategy's default: a post-fusion winner with less than half of the votes (or a tie at the top)
is verified by SuRe (`SplitVoteRouter`). Not yet chosen on data."""


def _cascade(config: StrategyConfig) -> Parts:
    """
    Concatenation -> post-fusion when it says unknown or is unsure -> SuRe's verification of the top-K post-fusion
    candidates when the vote is split, each candidate summarized from the passages that produced it.
    """
    tau = CASCADE_MIN_CONFIDENCE if config.min_confidence is None else config.min_confidence
    share = CASCADE_MIN_VOTE_SHARE if config.min_vote_share is None else config.min_vote_share
    components, connections = _fallback_chain(config, tau)
    components.update(
        {SPLIT_ROUTER: SplitVoteRouter(min_vote_share=share, max_candidates=max(2, config.num_candidates))},
        summarizer=_summarizer(config, "conditional"),
        verifier=_verifier(config, use_validity=True, scoring=config.verifier_scoring or "probability"),
    )
    connections += [
        ("voter.answers", f"{SPLIT_ROUTER}.answers"),
        (f"{SPLIT_ROUTER}.answers", "joiner.answers"),
        (f"{SPLIT_ROUTER}.split_query", "summarizer.query"),
        (DOCUMENTS, "summarizer.documents"),
        (f"{SPLIT_ROUTER}.split_candidates", "summarizer.candidates"),
        (f"{SPLIT_ROUTER}.split_documents", "summarizer.candidate_documents"),
        (f"{SPLIT_ROUTER}.split_query", "verifier.query"),
        (DOCUMENTS, "verifier.documents"),
        ("summarizer.candidates", "verifier.candidates"),
        ("summarizer.summaries", "verifier.summaries"),
        ("verifier.answers", "joiner.answers"),
    ]
    return components, connections


def _pf_concat(config: StrategyConfig) -> Parts:
    """
    Post-fusion candidates, then one concatenation over the passages that did not say unknown (section 3.3).

    When every passage said unknown the voter emits no candidates, the distiller round does not run, and the
    voter's "unknown" answer reaches the joiner instead.
    """
    components, connections = _prompt_chain(config, "distiller", "voter.documents")
    components.update(voter=_voter(config), joiner=AnswerJoiner())
    connections += [
        (DOCUMENTS, "voter.documents"),
        ("voter.candidates", "prompt_builder.candidates"),
        ("llm.replies", "answer_builder.replies"),
        ("answer_builder.answers", "joiner.answers"),
        ("voter.unknown", "joiner.answers"),
    ]
    return components, connections


def _no_datamark(config: StrategyConfig, component: str) -> None:
    """Refuse `datamark` for a component that formats its passages itself without it."""
    if config.datamark:
        raise ValueError(f"`datamark` is not supported by strategies with a {component} (only Liu et al.'s strategies)")


def _summarizer(config: StrategyConfig, mode: SummaryMode) -> CandidateSummarizer:
    _no_datamark(config, "CandidateSummarizer")
    return CandidateSummarizer(
        chat_generator=config.chat_generator,
        num_candidates=config.num_candidates,
        mode=mode,
        max_concurrency=config.max_concurrency,
        max_passage_chars=config.max_passage_chars,
        few_shot=config.few_shot,
    )


def _verifier(config: StrategyConfig, use_validity: bool, scoring: Scoring) -> SummaryVerifier:
    return SummaryVerifier(
        chat_generator=config.verifier_chat_generator or config.chat_generator,
        use_validity=use_validity,
        max_concurrency=config.max_concurrency,
        document_ranker=config.document_ranker,
        scoring=scoring,
    )


def _sure(use_validity: bool) -> Callable[[StrategyConfig], Parts]:
    """Candidates and conditional summaries, then verification (Kim et al., Algorithm 1; Table 3 ablation)."""

    def build(config: StrategyConfig) -> Parts:
        verifier = _verifier(config, use_validity, config.verifier_scoring or "text")
        components = {
            "summarizer": _summarizer(config, "conditional"),
            "verifier": verifier,
        }
        connections = [
            (DOCUMENTS, "summarizer.documents"),
            (DOCUMENTS, "verifier.documents"),
            ("summarizer.candidates", "verifier.candidates"),
            ("summarizer.summaries", "verifier.summaries"),
        ]
        return components, connections

    return build


def _summarize_then_answer(mode: SummaryMode, prompt_name: str, reads: str) -> Callable[[StrategyConfig], Parts]:
    """
    Kim et al.'s prompting baselines: a CandidateSummarizer round, then one answer prompt that reads its `reads`
    output (`summaries` or `candidates`), with the passages (titled layout) unless the generic summary replaces them.
    """

    def build(config: StrategyConfig) -> Parts:
        # Sum-and-pred (Gen): the generic summary stands in for the passages
        layout: PassageLayout | None = None if mode == "generic" else "titled"
        components, connections = _prompt_chain(config, prompt_name, DOCUMENTS, layout=layout)
        components.update(summarizer=_summarizer(config, mode))
        connections += [
            (DOCUMENTS, "summarizer.documents"),
            (f"summarizer.{reads}", f"prompt_builder.{reads}"),
            ("llm.replies", "answer_builder.replies"),
        ]
        return components, connections

    return build


def _chain_of_note(mode: NoteMode) -> Callable[[StrategyConfig], Parts]:
    """Reading notes per passage, then the answer (Yu et al., section 2.3)."""

    def build(config: StrategyConfig) -> Parts:
        _no_datamark(config, "NoteTaker")
        note_taker = NoteTaker(
            chat_generator=config.chat_generator,
            mode=mode,
            allow_parametric_knowledge=config.allow_parametric_knowledge,
            max_concurrency=config.max_concurrency,
            max_passage_chars=config.max_passage_chars,
            generation_kwargs=config.note_generation_kwargs,
            unknown_patterns=config.unknown_patterns,
        )
        return {"note_taker": note_taker}, [(DOCUMENTS, "note_taker.documents")]

    return build
