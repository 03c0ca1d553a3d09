"""The strategy registry: strategy name -> `Strategy` (its builder, stages and sources), the single source of truth."""

from __future__ import annotations

from typing import Any

from haystack import Pipeline

from haystack_fusion.strategies.builders import (
    ANSWER,
    CONCATENATION,
    NOTES,
    POST_FUSION,
    SUMMARIES,
    VERIFICATION,
    _cascade,
    _chain_of_note,
    _concat_pf,
    _pf_concat,
    _post_fusion,
    _single_prompt,
    _summarize_then_answer,
    _sure,
    assemble,
)
from haystack_fusion.strategies.config import Strategy, StrategyConfig

_SURE_SUMMARIES = ("sure_candidates", "sure_few_shot_candidates", "sure_summary", "sure_few_shot_summary")

STRATEGIES: dict[str, Strategy] = {
    strategy.name: strategy
    for strategy in (
        Strategy(
            "concatenation",
            "all top-k passages in one prompt, one LLM call",
            "Liu et al., section 3.2.1, Eq. 1, Figure 7",
            "1",
            "answer_builder",
            _single_prompt("figure7"),
            stages=(ANSWER,),
            prompts=("figure7",),
        ),
        Strategy(
            "post_fusion",
            "one LLM call per passage, majority vote over the answers",
            "Liu et al., section 3.2.1, Eq. 2, Figure 7",
            "1",
            "voter",
            _post_fusion,
            stages=(POST_FUSION,),
            prompts=("figure7",),
            calls="k",
        ),
        Strategy(
            "pruning",
            "one-shot chain-of-thought prompt that prunes irrelevant passages",
            "Liu et al., section 3.2.2, Figure 8",
            "1",
            "answer_builder",
            _single_prompt("pruning"),
            stages=(ANSWER,),
            prompts=("pruning",),
        ),
        Strategy(
            "summary_cot",
            "one-shot chain-of-thought prompt that summarizes the relevant passages",
            "Liu et al., section 3.2.2, Figure 9",
            "1",
            "answer_builder",
            _single_prompt("summary"),
            stages=(ANSWER,),
            prompts=("summary",),
        ),
        Strategy(
            "concat_pf",
            "concatenation; post-fusion as the fallback when it answers unknown",
            "Liu et al., section 3.3, Figure 2 (top)",
            "1-2",
            "joiner",
            _concat_pf,
            stages=(CONCATENATION, POST_FUSION),
            prompts=("figure7",),
            calls="1 or 1+k",
        ),
        Strategy(
            "pf_concat",
            "post-fusion candidates, then concatenation of the answering passages as the distiller",
            "Liu et al., section 3.3, Figure 2 (bottom)",
            "1-2",
            "joiner",
            _pf_concat,
            stages=(POST_FUSION, ANSWER),
            prompts=("figure7", "distiller"),
            calls="k+1",
        ),
        Strategy(
            "cascade",
            "concatenation; post-fusion when unknown or unsure; SuRe's verification when the vote is split",
            "Liu et al., section 3.3 + Kim et al., section 3.3, Eq. 4-6 (this package's combination)",
            "1-4",
            "joiner",
            _cascade,
            stages=(CONCATENATION, POST_FUSION, SUMMARIES, VERIFICATION),
            prompts=("figure7", "sure_summary", "sure_few_shot_summary", "sure_validity", "sure_ranking"),
            calls="1, 1+k or 1+k+2K+K(K-1)",
        ),
        Strategy(
            "base",
            "all top-k passages in one prompt, one LLM call (Kim et al.'s Base)",
            "Kim et al., Appendix A.5, Listing 10, Table 3 (Base)",
            "1",
            "answer_builder",
            _single_prompt("sure_base", layout="titled"),
            stages=(ANSWER,),
            prompts=("sure_base",),
        ),
        Strategy(
            "sure",
            "K answer candidates, a summary per candidate, pick by validity + pair-wise ranking",
            "Kim et al., section 3, Algorithm 1, Eq. 2-6",
            "3",
            "verifier",
            _sure(use_validity=True),
            stages=(SUMMARIES, VERIFICATION),
            prompts=(*_SURE_SUMMARIES, "sure_validity", "sure_ranking"),
            calls="1+2K+K(K-1)",
        ),
        Strategy(
            "sure_rank_only",
            "SuRe without instance-wise validity: pick by pair-wise ranking alone",
            "Kim et al., section 4.3, Table 3 (+ Pair-wise ranking)",
            "3",
            "verifier",
            _sure(use_validity=False),
            stages=(SUMMARIES, VERIFICATION),
            prompts=(*_SURE_SUMMARIES, "sure_ranking"),
            calls="1+K+K(K-1)",
        ),
        Strategy(
            "sure_sum_all",
            "all conditional summaries appended to the passages, one answer call",
            "Kim et al., section 4.3, Table 3 (+ Conditional summarizations)",
            "3",
            "answer_builder",
            _summarize_then_answer("conditional", "sure_sum_all", "summaries"),
            stages=(SUMMARIES, ANSWER),
            prompts=(*_SURE_SUMMARIES, "sure_sum_all"),
            calls="1+K+1",
        ),
        Strategy(
            "mcq",
            "the answer candidates as multiple choices next to the passages",
            "Kim et al., Appendix A.7, Listing 12, Table 3 (MCQ prompt)",
            "2",
            "answer_builder",
            _summarize_then_answer("candidates", "sure_mcq", "candidates"),
            stages=(SUMMARIES, ANSWER),
            prompts=("sure_candidates", "sure_few_shot_candidates", "sure_mcq"),
            calls="2",
        ),
        Strategy(
            "generic_summary",
            "one generic summary of the passages, then the answer from the summary",
            "Kim et al., Appendix A.6, Listing 11, Table 3 (Sum-and-pred (Gen))",
            "2",
            "answer_builder",
            _summarize_then_answer("generic", "sure_sum_and_pred", "summaries"),
            stages=(SUMMARIES, ANSWER),
            prompts=("sure_generic_summary", "sure_sum_and_pred"),
            calls="2",
        ),
        Strategy(
            "chain_of_note",
            "one prompt: a reading note per passage with its relevance, then the answer",
            "Yu et al., section 2.3, Appendix A.5",
            "1",
            "note_taker",
            _chain_of_note("single_call"),
            stages=(NOTES,),
            prompts=("con_single_call", "con_synthesis"),
        ),
        Strategy(
            "chain_of_note_per_document",
            "a reading note per passage concurrently, then one synthesis call",
            "Yu et al., section 2.3.1 (per-document notes)",
            "2",
            "note_taker",
            _chain_of_note("per_document"),
            stages=(NOTES,),
            prompts=("con_document_note", "con_synthesis"),
            calls="k+1",
        ),
    )
}
"""Every registered strategy, by name: Liu et al.'s Table 1, Kim et al.'s SuRe with its ablations and baselines, then
Yu et al.'s Chain-of-Note."""


def get_strategy(name: str) -> Strategy:
    """
    Look a strategy up by name.

    :raises ValueError: If there is no such strategy; the message lists the registered names.
    """
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; registered strategies: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def strategy_of(pipeline: Pipeline) -> Strategy:
    """
    The strategy a pipeline was built for, from its `metadata["strategy"]` (written by `build_pipeline`).

    :raises ValueError: If the pipeline names no registered strategy.
    """
    return get_strategy(pipeline.metadata.get("strategy", "(none)"))


def build_pipeline(name: str, *, retriever: Any | None = None, **config: Any) -> Pipeline:
    """
    Build the pipeline of a registered strategy: the passages in (`documents`), the answers out; with a retriever,
    your retriever followed by the strategy.

    ### Usage example
    ```python
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
    from haystack_fusion.backends import load_store, local_chat_generator
    from haystack_fusion.strategies import build_pipeline, run_strategy

    # the index made by `haystack-fusion index passages.jsonl --store index.json`
    retriever = InMemoryBM25Retriever(load_store("index.json"), top_k=5)
    pipe = build_pipeline("concat_pf", retriever=retriever, chat_generator=local_chat_generator())
    print(run_strategy(pipe, "Which river flows through the capital?").answer.data)
    ```

    :param name: A registered strategy name, kept in the pipeline's `metadata["strategy"]`.
    :param retriever: A retriever component (`query` and `top_k` inputs, a `documents` output), added as
        `retriever`; None: the pipeline takes the passages as its `documents` input.
    :param config: The fields of `StrategyConfig` (`chat_generator` is required).
    :returns: A new Pipeline.
    :raises ValueError: If the strategy is not registered.
    """
    return assemble(get_strategy(name).build(StrategyConfig(**config)), strategy=name, retriever=retriever)
