"""
Hayhooks pipeline wrappers for the strategies: `/{name}/run` and the OpenAI-compatible chat endpoint (`serve` extra).

A wrapper in `pipelines/<name>/pipeline_wrapper.py` only names its strategy; this base class builds the pipeline from
the environment (`BackendConfig.from_env`: `HAYSTACK_FUSION_DOCUMENT_STORE`, `HAYSTACK_FUSION_RETRIEVER`,
`HAYSTACK_FUSION_LLM`, `HAYSTACK_FUSION_MODEL`, `HAYSTACK_FUSION_STORE`, `ELASTICSEARCH_URL`, `OLLAMA_HOST`,
`OPENAI_BASE_URL`, ...), answers `POST /{name}/run` with the answer, its sources, evidence and usage, and answers
`POST /v1/chat/completions` (model = the wrapper's name) with the answer followed by its numbered sources.
"""

from __future__ import annotations

import textwrap
from typing import Any, ClassVar

try:
    from fastapi import HTTPException
    from hayhooks import BasePipelineWrapper, get_last_user_message
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("Serving with Hayhooks needs the `serve` extra: pip install 'haystack-fusion[serve]'") from error

from haystack_fusion.backends import BackendConfig, chat_generator, retriever
from haystack_fusion.strategies import StrategyRun, build_pipeline, run_strategy


def strategy_options(config: BackendConfig) -> dict[str, Any]:
    """
    Strategy settings that depend on the LLM: the embedded base model gets SuRe's few-shot candidate prompt and a
    larger completion budget for Chain-of-Note's notes; instruction-tuned models get the papers' defaults.
    """
    if config.llm == "local":
        return {"few_shot": True, "note_generation_kwargs": {"max_tokens": 400}}
    return {}


def sources_text(run: StrategyRun, *, chars: int = 200) -> str:
    """The answer's supporting passages (else the retrieved ones) as numbered lines "[i] title: text"."""
    documents = run.answer.documents or run.documents
    lines = []
    for index, document in enumerate(documents, start=1):
        title = (document.meta or {}).get("title")
        text = textwrap.shorten(document.content or "", width=chars, placeholder=" ...")
        lines.append(f"[{index}] {title}: {text}" if title else f"[{index}] {text}")
    return "\n".join(lines)


def _answer(strategy: str, pipeline: Any, query: str) -> StrategyRun:
    """Run the strategy; a question it refuses (empty) is the client's error: HTTP 400, not 500."""
    try:
        return run_strategy(strategy, pipeline, query)
    except ValueError as error:
        raise HTTPException(status_code=400, detail=str(error)) from error


class StrategyPipelineWrapper(BasePipelineWrapper):
    """
    Base of the shipped Hayhooks wrappers: set `strategy` to a registered strategy name.

    ### Usage example
    ```python
    # pipelines/concat_pf/pipeline_wrapper.py
    from haystack_fusion.hayhooks_wrapper import StrategyPipelineWrapper


    class PipelineWrapper(StrategyPipelineWrapper):
        strategy = "concat_pf"
    ```
    """

    strategy: ClassVar[str]

    def setup(self) -> None:
        """Build the strategy's pipeline on the backends the environment configures."""
        config = BackendConfig.from_env()
        self.pipeline = build_pipeline(
            self.strategy,
            retriever=retriever(config),
            chat_generator=chat_generator(config),
            **strategy_options(config),
        )

    def run_api(self, query: str) -> dict:
        """
        Answer a question.

        :param query: The question.
        :returns: `answer` (text), `sources` (id, title, content, score of the answer's passages, else the retrieved
            ones), `evidence` (the strategy's own: votes, candidates, notes, ...) and `usage` (LLM calls, tokens).
        :raises HTTPException: 400 for an empty question.
        """
        run = _answer(self.strategy, self.pipeline, query)
        documents = run.answer.documents or run.documents
        return {
            "answer": run.answer.data,
            "sources": [
                {"id": d.id, "title": (d.meta or {}).get("title"), "content": d.content, "score": d.score}
                for d in documents
            ],
            "evidence": run.evidence,
            "usage": run.usage,
        }

    def run_chat_completion(self, model: str, messages: list[dict], body: dict) -> str:
        """Answer the last user message: the answer, a blank line, "Sources:" and the numbered passages."""
        question = get_last_user_message(messages) or ""
        run = _answer(self.strategy, self.pipeline, question)
        return f"{run.answer.data}\n\nSources:\n{sources_text(run)}"
