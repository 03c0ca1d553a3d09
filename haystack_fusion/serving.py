"""
The shipped YAML pipelines in `pipelines/`: every strategy on the production backends, generated from the registry.

Each file is `Pipeline.dumps()` of a strategy built on one production combination (Elasticsearch BM25 or hybrid
retrieval x OpenAI or Ollama), plus the `inputs` / `outputs` sections Hayhooks reads to serve it at `/{name}/run`:
the question goes to every `query` socket, the answers come from the strategy's answer component. Secrets appear
only as environment-variable references (`OPENAI_API_KEY`, `ELASTIC_API_KEY`). `haystack-fusion pipelines`
regenerates the folder; a test fails when a shipped file differs from what the registry generates.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import yaml
from haystack import Pipeline

from haystack_fusion.backends import BackendConfig, chat_generator, retriever
from haystack_fusion.strategies import STRATEGIES, build_pipeline, get_strategy

COMBINATIONS: dict[str, BackendConfig] = {
    "es_bm25_openai": BackendConfig(store="elasticsearch", retriever="bm25", llm="openai"),
    "es_bm25_ollama": BackendConfig(store="elasticsearch", retriever="bm25", llm="ollama"),
    "es_hybrid_openai": BackendConfig(store="elasticsearch", retriever="hybrid", llm="openai"),
    "es_hybrid_ollama": BackendConfig(store="elasticsearch", retriever="hybrid", llm="ollama"),
}
"""The production backends of the shipped files, by the suffix of their names (default hosts and models: edit the
file, or set `ELASTICSEARCH_URL` / `OLLAMA_HOST` / `OPENAI_BASE_URL` when regenerating)."""

PIPELINES_DIR = Path(__file__).resolve().parent.parent / "pipelines"
"""The repository's `pipelines/` folder."""

_PLACEHOLDER_KEY = "placeholder-key-not-serialized"


@contextlib.contextmanager
def _openai_key_for_construction() -> Iterator[None]:
    """OpenAI components read their key when built; only its environment-variable name is serialized."""
    had_key = "OPENAI_API_KEY" in os.environ
    if not had_key:
        os.environ["OPENAI_API_KEY"] = _PLACEHOLDER_KEY
    try:
        yield
    finally:
        if not had_key:
            del os.environ["OPENAI_API_KEY"]


def pipeline_name(strategy: str, combination: str) -> str:
    """The file stem (and Hayhooks pipeline name) of a strategy on a combination, e.g. `concat_pf__es_bm25_openai`."""
    return f"{strategy}__{combination}"


def hayhooks_sections(pipeline: Pipeline, strategy: str) -> dict[str, dict[str, object]]:
    """
    Hayhooks' `inputs` / `outputs` for a strategy pipeline.

    :returns: `inputs`: `query` -> every component socket named `query` (sorted); `outputs`: `answers` -> the
        strategy's answer component's `answers`.
    """
    targets = sorted(f"{name}.query" for name, sockets in pipeline.inputs().items() if "query" in sockets)
    return {
        "inputs": {"query": targets},
        "outputs": {"answers": f"{get_strategy(strategy).answer_component}.answers"},
    }


def pipeline_yaml(strategy: str, config: BackendConfig) -> str:
    """
    The YAML of a strategy on given backends, with Hayhooks' sections appended.

    :raises ValueError: If the strategy is not registered.
    """
    with _openai_key_for_construction():
        pipeline = build_pipeline(strategy, retriever=retriever(config), chat_generator=chat_generator(config))
        text = pipeline.dumps()
    sections = yaml.safe_dump(hayhooks_sections(pipeline, strategy), sort_keys=False)
    return f"{text.rstrip()}\n{sections}"


def generate(out_dir: str | Path = PIPELINES_DIR) -> list[Path]:
    """
    Write every strategy on every production combination to `out_dir` (`<strategy>__<combination>.yml`).

    :returns: The files written, sorted.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for strategy in STRATEGIES:
        for combination, config in COMBINATIONS.items():
            path = out / f"{pipeline_name(strategy, combination)}.yml"
            path.write_text(pipeline_yaml(strategy, config), encoding="utf-8")
            written.append(path)
    return sorted(written)
