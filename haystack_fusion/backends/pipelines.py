"""`backend_pipeline`: where a `BackendConfig` and strategy settings become a Pipeline (`ask`, `eval`, `serve`)."""

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
    A registered strategy's pipeline on a backend (`config`), not warmed up, with
    `settings.strategy_defaults(config.llm)` under `settings` (`StrategyConfig` fields; those the strategy does not take
    left out); `retriever`, `chat_generator` and `fallback_chat_generator` None: the backend's. `config` None (an
    evaluation's own parts): no defaults, `chat_generator` required, and the passages are the `documents` input unless
    `retriever` is given.

    :raises ValueError: For an unregistered strategy, a setting out of range, no `config` nor `chat_generator`, or dense
        or hybrid retrieval over in-memory passages without embeddings.
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
