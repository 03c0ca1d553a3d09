"""A registered strategy as one drop-in component: `query` and your retriever's `documents` in, `answers` out."""

from __future__ import annotations

from typing import Any

from haystack import SuperComponent, default_from_dict, default_to_dict, super_component
from haystack.components.generators.chat.types import ChatGenerator
from haystack.core.serialization import component_to_dict
from haystack.utils.deserialization import deserialize_component_inplace

from haystack_fusion.answers import validate_query
from haystack_fusion.strategies.config import StrategyConfig
from haystack_fusion.strategies.registry import build_pipeline, get_strategy

_COMPONENT_SETTINGS = ("verifier_chat_generator", "document_ranker")
"""`StrategyConfig` fields that hold components; they are passed and serialized as components, not as settings."""


@super_component
class FusionAnswerer:
    """
    Any registered strategy (`haystack-fusion strategies`) after your own retriever, as one component.

    It wraps the strategy's pipeline (`build_pipeline` without a retriever): the passages are read in the order
    given (best-ranked first, as the papers assume); the answers are the strategy's, each `meta` carrying its
    evidence (votes, candidates, notes, stages, confidence, usage).

    ### Usage example
    ```python
    from haystack import Document, Pipeline
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
    from haystack.document_stores.in_memory import InMemoryDocumentStore
    from haystack_fusion import FusionAnswerer
    from haystack_fusion.backends import local_chat_generator

    store = InMemoryDocumentStore()
    store.write_documents([Document(content="The Eiffel Tower is in Paris."), Document(content="Rome is in Italy.")])
    pipe = Pipeline()
    pipe.add_component("retriever", InMemoryBM25Retriever(document_store=store, top_k=5))
    pipe.add_component("answerer", FusionAnswerer(strategy="concat_pf", chat_generator=local_chat_generator()))
    pipe.connect("retriever.documents", "answerer.documents")
    question = "Where is the Eiffel Tower?"
    result = pipe.run({"retriever": {"query": question}, "answerer": {"query": question}})
    print(result["answerer"]["answers"][0].data)
    ```
    """

    def __init__(
        self,
        *,
        strategy: str,
        chat_generator: ChatGenerator,
        settings: dict[str, Any] | None = None,
        verifier_chat_generator: ChatGenerator | None = None,
        document_ranker: Any | None = None,
    ) -> None:
        """
        :param strategy: A registered strategy name, e.g. "concat_pf", "sure", "chain_of_note", "cascade".
        :param chat_generator: The LLM every component of the strategy calls.
        :param settings: Further `StrategyConfig` fields (JSON values), e.g. `{"num_candidates": 3,
            "few_shot": True, "min_confidence": 0.25}`; unset fields keep the strategy's defaults.
        :param verifier_chat_generator: SuRe's validity and ranking LLM (Kim et al., Table 10); None: `chat_generator`.
        :param document_ranker: SuRe's summary reranker (Kim et al., Table 4); None keeps the given order.
        :raises ValueError: If the strategy is not registered, or `settings` holds `chat_generator`, a component field
            or a field `StrategyConfig` does not have.
        """
        self.strategy = strategy
        self.chat_generator = chat_generator
        self.settings = dict(settings or {})
        self.verifier_chat_generator = verifier_chat_generator
        self.document_ranker = document_ranker
        answer_component = get_strategy(strategy).answer_component
        allowed = set(StrategyConfig.__dataclass_fields__) - {"chat_generator", *_COMPONENT_SETTINGS}
        unknown = sorted(set(self.settings) - allowed)
        if unknown:
            raise ValueError(f"FusionAnswerer `settings` has no field(s) {unknown}; allowed: {sorted(allowed)}")
        self.pipeline = build_pipeline(
            strategy,
            chat_generator=chat_generator,
            verifier_chat_generator=verifier_chat_generator,
            document_ranker=document_ranker,
            **self.settings,
        )
        inputs = self.pipeline.inputs()
        self.input_mapping = {
            socket: sorted(f"{name}.{socket}" for name, sockets in inputs.items() if socket in sockets)
            for socket in ("query", "documents")
        }
        self.output_mapping = {f"{answer_component}.answers": "answers"}

    def run(self, **kwargs: Any) -> dict[str, Any]:
        """
        Answer `query` from `documents` (your retriever's, best-ranked first; none: "unknown" for most strategies).

        The question is checked here, before any LLM call: not every strategy's first call is one of ours.

        :returns: `answers`: the strategy's `GeneratedAnswer` list, best first.
        :raises ValueError: If the question is empty, only whitespace or not valid Unicode text.
        """
        validate_query(kwargs.get("query", ""))
        return SuperComponent.run(self, **kwargs)  # type: ignore[arg-type]

    async def run_async(self, **kwargs: Any) -> dict[str, Any]:
        """`run` with the strategy's pipeline run by `run_async`: same inputs, outputs and errors."""
        validate_query(kwargs.get("query", ""))
        return await SuperComponent.run_async(self, **kwargs)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        """Serialize the strategy name, settings and generators (the inner pipeline is rebuilt on load)."""
        components = {
            name: component_to_dict(obj=value, name=name) if (value := getattr(self, name)) is not None else None
            for name in ("chat_generator", *_COMPONENT_SETTINGS)
        }
        return default_to_dict(self, strategy=self.strategy, settings=self.settings, **components)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FusionAnswerer:
        """Rebuild from `to_dict`'s output, deserializing the generators and the ranker."""
        params = data["init_parameters"]
        for name in ("chat_generator", *_COMPONENT_SETTINGS):
            if params.get(name):
                deserialize_component_inplace(params, key=name)
        return default_from_dict(cls, data)
