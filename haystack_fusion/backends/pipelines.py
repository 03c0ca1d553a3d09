"""
A strategy's pipeline on a backend (`backend_pipeline`): the one place that turns a `BackendConfig` and strategy
settings into a Pipeline, so `ask`, `demo`, `eval`, `serve` and the YAML `haystack-fusion pipelines` writes run a
strategy with the same settings on the same backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from haystack import Pipeline

from haystack_fusion.backends import config as backend_config
from haystack_fusion.backends.config import BackendConfig
from haystack_fusion.settings import strategy_defaults
from haystack_fusion.strategies import build_pipeline, strategy_settings


def backend_pipeline(
    strategy: str,
    config: BackendConfig | None,
    settings: Mapping[str, Any] | None = None,
    *,
    retriever: Any | None = None,
    chat_generator: Any | None = None,
    fallback_chat_generator: Any | None = None,
    max_concurrency: int | None = None,
) -> Pipeline:
    """
    The pipeline of a registered strategy on a backend. Its settings, each overriding the ones before:

    1. `settings.strategy_defaults(config.llm)`: what the LLM needs (the embedded base model: SuRe's few-shot
       candidate prompt, 400 tokens for Chain-of-Note's notes);
    2. `settings`, the caller's explicit `StrategyConfig` fields (command-line flags, `EvalConfig.strategy_options`);
    3. the fallback LLM: `fallback_chat_generator`, else the backend's (`config.fallback_chat_generator`), for
       `concat_pf`, `pf_concat` and `cascade`;

    then `strategies.strategy_settings` leaves out what the strategy does not take, and `strategies.build_pipeline`
    builds it on `retriever` (else the backend's, `config.retriever`) with `chat_generator` (else the backend's,
    `config.chat_generator`).

    ### Usage example
    ```python
    from haystack_fusion.backends import BackendConfig, backend_pipeline
    from haystack_fusion.strategies import run_strategy

    # the embedded model over the index `haystack-fusion index` saved, with `ask --candidate-prompt zero-shot`
    pipeline = backend_pipeline("sure", BackendConfig(), {"few_shot": False}, max_concurrency=2)
    print(run_strategy(pipeline, "Which river flows through Orleans?").answer.data)
    ```

    :param strategy: A registered strategy name.
    :param config: The backend: store, retriever, LLM and fallback LLM. None (an evaluation's own retriever and
        generators): no defaults and no backend components, so `chat_generator` is required, the pipeline takes its
        passages as the `documents` input without `retriever`, and the fallback LLM is `fallback_chat_generator`
        or the one `settings` names.
    :param settings: `StrategyConfig` fields (`num_candidates`, `few_shot`, `note_generation_kwargs`, ...); fields the
        strategy does not take (`fallback_chat_generator` outside `FALLBACK_STRATEGIES`, the confidence settings
        without a concatenation round) are left out.
    :param retriever: A retriever component (`query` and `top_k` inputs, a `documents` output), e.g. the YAML's
        `SavedInMemoryBM25Retriever` or an evaluation's `EvalRetriever`; None: the backend's.
    :param chat_generator: The LLM of every round (a ChatGenerator, e.g. serving's `CallLimitedChatGenerator`); None:
        the backend's.
    :param fallback_chat_generator: The fallback rounds' ChatGenerator; None: the backend's (None without
        `fallback_llm`: every round on `chat_generator`).
    :param max_concurrency: LLM calls of one round under way at once (None: all of them).
    :returns: A new Pipeline, not warmed up (the embedded model and a saved index load on `warm_up` or the first run).
    :raises ValueError: If the strategy is not registered, a setting is out of range, or `config` and
        `chat_generator` are both None; for dense or hybrid retrieval over an in-memory store without embeddings.
    :raises ImportError: If the backend needs an extra that is not installed.
    """
    if config is None and chat_generator is None:
        raise ValueError("`backend_pipeline` needs a `config` or a `chat_generator`")
    options: dict[str, Any] = {**(strategy_defaults(config.llm) if config is not None else {}), **(settings or {})}
    if config is not None:
        retriever = backend_config.retriever(config) if retriever is None else retriever
        chat_generator = backend_config.chat_generator(config) if chat_generator is None else chat_generator
        if fallback_chat_generator is None:
            fallback_chat_generator = backend_config.fallback_chat_generator(config)
    if config is not None or fallback_chat_generator is not None:
        options["fallback_chat_generator"] = fallback_chat_generator
    return build_pipeline(
        strategy,
        retriever=retriever,
        chat_generator=chat_generator,
        max_concurrency=max_concurrency,
        **strategy_settings(strategy, options),
    )
