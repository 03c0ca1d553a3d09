"""`STRATEGIES` and their builders: each strategy is a `Pipeline` from the passages (`documents`, or a retriever's) to
the answers of `Strategy.answer_component`; every question socket is named `query`."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial
from typing import Any

from haystack import Pipeline, logging
from haystack.components.generators.chat.types import ChatGenerator
from haystack.components.joiners import AnswerJoiner

from haystack_fusion.components.candidate_summarizer import CandidateSummarizer, SummaryMode
from haystack_fusion.components.concatenation import AbstainingChatGenerator, CheckedAnswerBuilder, PassageFormatter
from haystack_fusion.components.note_taker import NoteMode, NoteTaker
from haystack_fusion.components.post_fusion_voter import PostFusionVoter
from haystack_fusion.components.speculation import PostFusionSpeculator
from haystack_fusion.components.split_vote_router import SplitVoteRouter
from haystack_fusion.components.summary_verifier import Scoring, SummaryVerifier
from haystack_fusion.components.unknown_router import UnknownRouter
from haystack_fusion.llm import CallLimitedChatGenerator, stop_kwargs, unwrap_call_limit
from haystack_fusion.prompts import PROMPTS, ChatPrompt, PassageLayout
from haystack_fusion.strategies.config import DOCUMENTS, RETRIEVER, SPLIT_ROUTER, Parts, Stage, Strategy, StrategyConfig

logger = logging.getLogger(__name__)
ANSWER = Stage("answer", "llm")
CONCATENATION = Stage("concatenation", "router")
POST_FUSION = Stage("post_fusion", "voter")
SUMMARIES = Stage("summaries", "summarizer")
VERIFICATION = Stage("verification", "verifier")
NOTES = Stage("notes", "note_taker")

CASCADE_MIN_CONFIDENCE = 0.25
"""tau, `cascade`'s default confidence floor for the concatenation answer (chosen in docs/post-fusion.md)."""

CASCADE_MIN_VOTE_SHARE = 0.5
"""s, `cascade`'s default: a post-fusion winner with less than half of the votes (or a tie) is verified by SuRe."""


def _chain_generator(chat_generator: ChatGenerator, stop: tuple[str, ...]) -> ChatGenerator:
    """`chat_generator` in a `CallLimitedChatGenerator` (rewrapped with its breaker) sending `stop` with each call
    (`llm.stop_kwargs`), shown in the YAML; itself when there is nothing to add or it takes no `generation_kwargs`."""
    generator = unwrap_call_limit(chat_generator)
    limited = chat_generator if isinstance(chat_generator, CallLimitedChatGenerator) else None
    own = getattr(generator, "generation_kwargs", None)
    kwargs = stop_kwargs(generator, stop, limited.generation_kwargs if limited else None)
    if not kwargs or not isinstance(own, dict) or kwargs.get("stop") == own.get("stop"):
        return chat_generator
    breaker = limited.breaker if limited else None
    return CallLimitedChatGenerator(chat_generator=generator, breaker=breaker, generation_kwargs=kwargs)


def _prompt_chain(
    config: StrategyConfig,
    prompt_name: str,
    documents_from: str,
    layout: PassageLayout | None = "numbered",
    chat_generator: ChatGenerator | None = None,
    replies_from: str = "llm.replies",
) -> Parts:
    """passages -> prompt_builder -> llm -> answer_builder for one prompt, fed from `documents_from`; `layout` None
    shows no passages."""
    prompt = PROMPTS[prompt_name]
    template = (config.prompts or {}).get(prompt_name)
    chat = ChatPrompt(prompt, template, system_prompt=config.system_prompt, parameter=f"prompts[{prompt_name!r}]")
    components: dict[str, Any] = {
        "prompt_builder": chat.builder(),
        "llm": _chain_generator(chat_generator or config.chat_generator, prompt.stop),
        "answer_builder": CheckedAnswerBuilder(
            pattern=prompt.answer_pattern, demonstrations=list(prompt.demonstrations) or None
        ),
    }
    connections = [
        ("prompt_builder.prompt", "llm.messages"),
        (documents_from, "answer_builder.documents"),
        (replies_from, "answer_builder.replies"),
    ]
    if layout is not None:
        components["passages"] = _component(PassageFormatter, config, {}, layout=layout)
        connections = [
            (documents_from, "passages.documents"),
            ("passages.passages", "prompt_builder.passages"),
            *connections,
        ]
    return components, connections


def _single_prompt(prompt_name: str, layout: PassageLayout = "numbered") -> Callable[[StrategyConfig], Parts]:
    return lambda config: _prompt_chain(config, prompt_name, DOCUMENTS, layout)


def _component(cls: Any, config: StrategyConfig, prompts: dict[str, str], **overrides: Any) -> Any:
    """`cls` with the `StrategyConfig` fields its init takes by name, the templates `config.prompts` gives for its
    prompt parameters (`prompts`: parameter -> `PROMPTS` name), then the `overrides` that are not None."""
    taken = inspect.signature(cls.__init__).parameters
    kwargs = {name: getattr(config, name) for name in taken if name in StrategyConfig.__dataclass_fields__}
    given = config.prompts or {}
    kwargs.update({parameter: given[name] for parameter, name in prompts.items() if name in given})
    return cls(**kwargs | {name: value for name, value in overrides.items() if value is not None})


_VERIFICATION = [
    (DOCUMENTS, "verifier.documents"),
    ("summarizer.candidates", "verifier.candidates"),
    ("summarizer.summaries", "verifier.summaries"),
]


def _voter(config: StrategyConfig, chat_generator: ChatGenerator | None = None) -> PostFusionVoter:
    return _component(PostFusionVoter, config, {"prompt": "figure7"}, chat_generator=chat_generator)


def _post_fusion(config: StrategyConfig) -> Parts:
    return {"voter": _voter(config)}, [(DOCUMENTS, "voter.documents")]


def _fallback_chain(config: StrategyConfig, min_confidence: float | None) -> Parts:
    """Concatenation, routed when unknown, failed or below `min_confidence` to post-fusion on the fallback LLM (Liu et
    al., section 3.3); the caller connects the voter's answers."""
    components, connections = _prompt_chain(config, "figure7", DOCUMENTS, replies_from="router.known")
    agreement = config.confidence == "agreement"
    components.update(
        llm=AbstainingChatGenerator(
            chat_generator=components["llm"],
            samples=config.agreement_samples if agreement else 0,
            sampling_generation_kwargs={"temperature": config.agreement_temperature} if agreement else None,
        ),
        router=UnknownRouter(
            answer_pattern=PROMPTS["figure7"].answer_pattern,
            unknown_patterns=config.unknown_patterns,
            min_confidence=None if config.confidence == "none" else min_confidence,
            demonstrations=list(PROMPTS["figure7"].demonstrations),
            confidence=config.confidence,
        ),
        voter=(voter := _voter(config, config.fallback_chat_generator)),  # None: `chat_generator`
        joiner=AnswerJoiner(),
    )
    generator = unwrap_call_limit(voter._chat_generator)
    if config.speculative and any(cls.__name__ == "LocalChatGenerator" for cls in type(generator).__mro__):
        logger.warning("Speculative post-fusion is off: the embedded model makes one call at a time")
    elif config.speculative:  # its name sorts before `llm`'s: `Pipeline.run` starts it first
        components["fallback_speculator"] = PostFusionSpeculator(voter=voter)
        connections.append((DOCUMENTS, "fallback_speculator.documents"))
        connections.append(("fallback_speculator.speculation", "router.speculation"))
        connections.append(("router.fallback_speculation", "voter.speculation"))
    connections += [
        ("llm.replies", "router.replies"),
        (DOCUMENTS, "router.documents"),
        ("router.fallback_query", "voter.query"),
        ("router.fallback_documents", "voter.documents"),
        ("answer_builder.answers", "joiner.answers"),
    ]
    return components, connections


def _concat_pf(config: StrategyConfig) -> Parts:
    components, connections = _fallback_chain(config, config.min_confidence)
    return components, [*connections, ("voter.answers", "joiner.answers")]


def _cascade(config: StrategyConfig) -> Parts:
    """Concatenation -> post-fusion when unknown or unsure -> SuRe's verification of the top-K candidates when the
    vote is split, each summarized from the passages that produced it."""
    tau = CASCADE_MIN_CONFIDENCE if config.min_confidence is None else config.min_confidence
    share = CASCADE_MIN_VOTE_SHARE if config.min_vote_share is None else config.min_vote_share
    components, connections = _fallback_chain(config, tau)
    fallback = config.fallback_chat_generator
    components.update(
        {SPLIT_ROUTER: SplitVoteRouter(min_vote_share=share, max_candidates=max(2, config.num_candidates))},
        summarizer=_summarizer(config, "conditional", fallback),
        verifier=_verifier(
            config, True, config.verifier_scoring or "probability", config.verifier_chat_generator or fallback
        ),
    )
    connections += [
        ("voter.answers", f"{SPLIT_ROUTER}.answers"),
        (f"{SPLIT_ROUTER}.answers", "joiner.answers"),
        (f"{SPLIT_ROUTER}.split_query", "summarizer.query"),
        (DOCUMENTS, "summarizer.documents"),
        (f"{SPLIT_ROUTER}.split_candidates", "summarizer.candidates"),
        (f"{SPLIT_ROUTER}.split_documents", "summarizer.candidate_documents"),
        (f"{SPLIT_ROUTER}.split_query", "verifier.query"),
        *_VERIFICATION,
        ("verifier.answers", "joiner.answers"),
    ]
    return components, connections


def _pf_concat(config: StrategyConfig) -> Parts:
    """Post-fusion candidates, then one concatenation over the passages that did not say unknown (section 3.3); else
    the voter's "unknown" reaches the joiner."""
    components, connections = _prompt_chain(
        config, "distiller", "voter.documents", chat_generator=config.fallback_chat_generator
    )
    components.update(voter=_voter(config), joiner=AnswerJoiner())
    connections += [
        (DOCUMENTS, "voter.documents"),
        ("voter.candidates", "prompt_builder.candidates"),
        ("answer_builder.answers", "joiner.answers"),
        ("voter.unknown", "joiner.answers"),
    ]
    return components, connections


def _no_datamark(config: StrategyConfig, component: str) -> None:
    if config.datamark:
        raise ValueError(f"`datamark` is not supported by strategies with a {component} (only Liu et al.'s strategies)")


def _summarizer(
    config: StrategyConfig, mode: SummaryMode, chat_generator: ChatGenerator | None = None
) -> CandidateSummarizer:
    _no_datamark(config, "CandidateSummarizer")
    few_shot = "few_shot_" if config.few_shot else ""
    summary = "sure_generic_summary" if mode == "generic" else f"sure_{few_shot}summary"
    prompts = {"candidates_prompt": f"sure_{few_shot}candidates", "summary_prompt": summary}
    return _component(CandidateSummarizer, config, prompts, mode=mode, chat_generator=chat_generator)


def _verifier(
    config: StrategyConfig, use_validity: bool, scoring: Scoring, chat_generator: ChatGenerator | None = None
) -> SummaryVerifier:
    prompts = {"validity_prompt": "sure_validity", "ranking_prompt": "sure_ranking"}
    generator = chat_generator or config.verifier_chat_generator
    return _component(
        SummaryVerifier, config, prompts, chat_generator=generator, use_validity=use_validity, scoring=scoring
    )


def _sure(use_validity: bool, config: StrategyConfig) -> Parts:
    verifier = _verifier(config, use_validity, config.verifier_scoring or "text")
    components = {"summarizer": _summarizer(config, "conditional"), "verifier": verifier}
    return components, [(DOCUMENTS, "summarizer.documents"), *_VERIFICATION]


def _summarize_then_answer(mode: SummaryMode, prompt_name: str, reads: str, config: StrategyConfig) -> Parts:
    """Kim et al.'s baselines: a CandidateSummarizer round, then an answer prompt reading its `reads` output, with the
    passages unless the generic summary replaces them (Sum-and-pred (Gen))."""
    layout: PassageLayout | None = None if mode == "generic" else "titled"
    components, connections = _prompt_chain(config, prompt_name, DOCUMENTS, layout=layout)
    components.update(summarizer=_summarizer(config, mode))
    connections += [(DOCUMENTS, "summarizer.documents"), (f"summarizer.{reads}", f"prompt_builder.{reads}")]
    return components, connections


def _chain_of_note(mode: NoteMode, config: StrategyConfig) -> Parts:
    _no_datamark(config, "NoteTaker")
    answer = "con_synthesis" if mode == "per_document" else "con_single_call"
    prompts = {"note_prompt": "con_document_note", "answer_prompt": answer}
    note_taker = _component(NoteTaker, config, prompts, mode=mode, generation_kwargs=config.note_generation_kwargs)
    return {"note_taker": note_taker}, [(DOCUMENTS, "note_taker.documents")]


_SURE_SUMMARIES = ("sure_candidates", "sure_few_shot_candidates", "sure_summary", "sure_few_shot_summary")
_ONE_PROMPT = "all top-k passages in one prompt, one LLM call"

# fmt: off
STRATEGIES: dict[str, Strategy] = {strategy.name: strategy for strategy in (
    # name, summary, source, rounds, answer component, builder, stages, prompts, LLM calls
    Strategy("concatenation", _ONE_PROMPT, "Liu et al., section 3.2.1, Eq. 1, Figure 7", "1", "answer_builder",
             _single_prompt("figure7"), (ANSWER,), ("figure7",)),
    Strategy("post_fusion", "one LLM call per passage, majority vote over the answers",
             "Liu et al., section 3.2.1, Eq. 2, Figure 7", "1", "voter", _post_fusion, (POST_FUSION,), ("figure7",),
             "k"),
    Strategy("pruning", "one-shot chain-of-thought prompt that prunes irrelevant passages",
             "Liu et al., section 3.2.2, Figure 8", "1", "answer_builder", _single_prompt("pruning"), (ANSWER,),
             ("pruning",)),
    Strategy("summary_cot", "one-shot chain-of-thought prompt that summarizes the relevant passages",
             "Liu et al., section 3.2.2, Figure 9", "1", "answer_builder", _single_prompt("summary"), (ANSWER,),
             ("summary",)),
    Strategy("concat_pf", "concatenation; post-fusion as the fallback when it answers unknown",
             "Liu et al., section 3.3, Figure 2 (top)", "1-2", "joiner", _concat_pf, (CONCATENATION, POST_FUSION),
             ("figure7",), "1 or 1+k"),
    Strategy("pf_concat", "post-fusion candidates, then concatenation of the answering passages as the distiller",
             "Liu et al., section 3.3, Figure 2 (bottom)", "1-2", "joiner", _pf_concat, (POST_FUSION, ANSWER),
             ("figure7", "distiller"), "k+1"),
    Strategy("cascade",
             "concatenation; post-fusion when unknown or unsure; SuRe's verification when the vote is split",
             "Liu et al., section 3.3 + Kim et al., section 3.3, Eq. 4-6 (this package's combination)", "1-4",
             "joiner", _cascade, (CONCATENATION, POST_FUSION, SUMMARIES, VERIFICATION),
             ("figure7", "sure_summary", "sure_few_shot_summary", "sure_validity", "sure_ranking"),
             "1, 1+k or 1+k+2K+K(K-1)"),
    Strategy("base", f"{_ONE_PROMPT} (Kim et al.'s Base)", "Kim et al., Appendix A.5, Listing 10, Table 3 (Base)",
             "1", "answer_builder", _single_prompt("sure_base", layout="titled"), (ANSWER,), ("sure_base",)),
    Strategy("sure", "K answer candidates, a summary per candidate, pick by validity + pair-wise ranking",
             "Kim et al., section 3, Algorithm 1, Eq. 2-6", "3", "verifier", partial(_sure, True),
             (SUMMARIES, VERIFICATION), (*_SURE_SUMMARIES, "sure_validity", "sure_ranking"), "1+2K+K(K-1)"),
    Strategy("sure_rank_only", "SuRe without instance-wise validity: pick by pair-wise ranking alone",
             "Kim et al., section 4.3, Table 3 (+ Pair-wise ranking)", "3", "verifier", partial(_sure, False),
             (SUMMARIES, VERIFICATION), (*_SURE_SUMMARIES, "sure_ranking"), "1+K+K(K-1)"),
    Strategy("sure_sum_all", "all conditional summaries appended to the passages, one answer call",
             "Kim et al., section 4.3, Table 3 (+ Conditional summarizations)", "3", "answer_builder",
             partial(_summarize_then_answer, "conditional", "sure_sum_all", "summaries"), (SUMMARIES, ANSWER),
             (*_SURE_SUMMARIES, "sure_sum_all"), "1+K+1"),
    Strategy("mcq", "the answer candidates as multiple choices next to the passages",
             "Kim et al., Appendix A.7, Listing 12, Table 3 (MCQ prompt)", "2", "answer_builder",
             partial(_summarize_then_answer, "candidates", "sure_mcq", "candidates"), (SUMMARIES, ANSWER),
             ("sure_candidates", "sure_few_shot_candidates", "sure_mcq"), "2"),
    Strategy("generic_summary", "one generic summary of the passages, then the answer from the summary",
             "Kim et al., Appendix A.6, Listing 11, Table 3 (Sum-and-pred (Gen))", "2", "answer_builder",
             partial(_summarize_then_answer, "generic", "sure_sum_and_pred", "summaries"), (SUMMARIES, ANSWER),
             ("sure_generic_summary", "sure_sum_and_pred"), "2"),
    Strategy("chain_of_note", "one prompt: a reading note per passage with its relevance, then the answer",
             "Yu et al., section 2.3, Appendix A.5", "1", "note_taker", partial(_chain_of_note, "single_call"),
             (NOTES,), ("con_single_call", "con_synthesis")),
    Strategy("chain_of_note_per_document", "a reading note per passage concurrently, then one synthesis call",
             "Yu et al., section 2.3.1 (per-document notes)", "2", "note_taker",
             partial(_chain_of_note, "per_document"), (NOTES,), ("con_document_note", "con_synthesis"), "k+1"),
)}
# fmt: on
"""Every strategy, by name: Liu et al.'s Table 1, Kim et al.'s SuRe with ablations and baselines, Yu et al.'s CoN."""


def _check_prompts(strategy: Strategy, config: StrategyConfig) -> None:
    """`config.prompts` names only prompts the strategy renders with these settings: the SuRe listings `few_shot`
    picks, single-call Chain-of-Note without the synthesis prompt."""
    zero_shot, few_shot = ("sure_candidates", "sure_summary"), ("sure_few_shot_candidates", "sure_few_shot_summary")
    left_out = set(zero_shot if config.few_shot else few_shot)
    if "con_single_call" in strategy.prompts:
        left_out.add("con_synthesis")
    rendered = [name for name in strategy.prompts if name not in left_out]
    for name in config.prompts or {}:
        if name not in PROMPTS:
            raise ValueError(f"`prompts` names no prompt {name!r}; strategy {strategy.name!r} renders {rendered}")
        if name not in rendered:
            raise ValueError(
                f"`prompts` names {name!r}, which strategy {strategy.name!r} does not render with these settings; "
                f"it renders {rendered}"
            )


FALLBACK_STRATEGIES = ("concat_pf", "pf_concat", "cascade")  # with rounds on `fallback_chat_generator`
SPECULATIVE_STRATEGIES = ("concat_pf", "cascade")  # whose post-fusion can start beside concatenation


def _check_fallback(strategy: Strategy, config: StrategyConfig) -> None:
    """ValueError for a fallback LLM outside `FALLBACK_STRATEGIES`, a confidence setting without a concatenation round
    to judge, `speculative` outside `SPECULATIVE_STRATEGIES`."""
    if config.fallback_chat_generator is not None and strategy.name not in FALLBACK_STRATEGIES:
        raise ValueError(
            f"`fallback_chat_generator` is for the strategies with fallback rounds ({', '.join(FALLBACK_STRATEGIES)}), "
            f"not {strategy.name!r}"
        )
    if config.speculative and strategy.name not in SPECULATIVE_STRATEGIES:
        raise ValueError(f"`speculative` is for {' and '.join(SPECULATIVE_STRATEGIES)}, not {strategy.name!r}")
    judged = [name for name, s in STRATEGIES.items() if CONCATENATION in s.stages]
    if config.confidence != "logprobs" and CONCATENATION not in strategy.stages:
        raise ValueError(
            f"`confidence` is for the strategies that judge a first answer ({', '.join(judged)}), not {strategy.name!r}"
        )


def strategy_settings(name: str, settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` without the fields strategy `name` does not take (which `build_pipeline` rejects), for flags shared
    by several strategies; ValueError for an unregistered strategy."""
    strategy = get_strategy(name)
    left_out = set()
    if strategy.name not in FALLBACK_STRATEGIES:
        left_out.add("fallback_chat_generator")
    if strategy.name not in SPECULATIVE_STRATEGIES:
        left_out.add("speculative")
    if CONCATENATION not in strategy.stages:
        left_out |= {"confidence", "agreement_samples", "agreement_temperature"}
    return {key: value for key, value in settings.items() if key not in left_out}


def get_strategy(name: str) -> Strategy:
    """The strategy of a name; ValueError listing the registered names for another."""
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; registered strategies: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def strategy_of(pipeline: Pipeline) -> Strategy:
    """The strategy of a pipeline's `metadata["strategy"]` (`build_pipeline`); ValueError if it names none."""
    return get_strategy(pipeline.metadata.get("strategy", "(none)"))


def build_pipeline(name: str, *, retriever: Any | None = None, **config: Any) -> Pipeline:
    """
    The pipeline of a registered strategy (`name`, kept in its `metadata["strategy"]`) from `StrategyConfig` fields
    (`chat_generator` required), after `retriever` if given (else a `documents` input). Components are added in the
    order `Pipeline.loads(pipeline.dumps())` rebuilds them, so the round trip is equal.

    :raises ValueError: For an unregistered strategy, a prompt it does not render or a template with other variables
        than its prompt's, a setting out of range, or a setting the strategy does not take.
    """
    strategy, settings = get_strategy(name), StrategyConfig(**config)
    _check_prompts(strategy, settings)
    _check_fallback(strategy, settings)
    components, connections = strategy.build(settings)
    if retriever is not None:
        components = {**components, RETRIEVER: retriever}
        connections = [(f"{RETRIEVER}.documents" if s == DOCUMENTS else s, r) for s, r in connections]
    else:
        connections = [(s, r) for s, r in connections if s != DOCUMENTS]
    pipe = Pipeline(metadata={"strategy": name})
    for component_name in sorted(components):
        pipe.add_component(component_name, components[component_name])
    for sender, receiver in sorted(connections, key=lambda connection: connection[0].split(".")[0]):
        pipe.connect(sender, receiver)
    return pipe
