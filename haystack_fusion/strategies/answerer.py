"""A registered strategy as one drop-in component: `query` and your retriever's `documents` in, `answers` out."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from haystack import SuperComponent, component, default_from_dict, default_to_dict, super_component
from haystack.components.generators.chat.types import ChatGenerator
from haystack.core.serialization import component_to_dict
from haystack.dataclasses import ComponentInfo, StreamingCallbackT, StreamingChunk, select_streaming_callback
from haystack.utils import deserialize_callable, serialize_callable
from haystack.utils.deserialization import deserialize_component_inplace

from haystack_fusion.answers import validate_query
from haystack_fusion.failures import CallFailure, failed_run
from haystack_fusion.llm import emit_chunk, is_async_callback
from haystack_fusion.strategies.config import StrategyConfig
from haystack_fusion.strategies.registry import build_pipeline, get_strategy

_COMPONENT_SETTINGS = ("fallback_chat_generator", "verifier_chat_generator", "document_ranker")  # not `settings`


@super_component
class FusionAnswerer:
    """
    Any registered strategy (`haystack-fusion strategies`) after your own retriever, as one component: the strategy's
    pipeline without a retriever, reading the passages in the order given; each answer's `meta` carries its evidence.

    Streaming: a last round of one call whose reply is the answer streams its tokens; otherwise the answer comes as
    one chunk when it is known. A streamed reply that is not just the answer is followed by one chunk
    `"\n\nAnswer: <answer>"`: the stream always ends with `answers[0]`.

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
        fallback_chat_generator: ChatGenerator | None = None,
        verifier_chat_generator: ChatGenerator | None = None,
        document_ranker: Any | None = None,
        streaming_callback: StreamingCallbackT | None = None,
    ) -> None:
        """
        :param strategy: A registered strategy name, e.g. "concat_pf", "sure", "chain_of_note", "cascade".
        :param chat_generator: The LLM of every call (the first round's only, with `fallback_chat_generator`).
        :param fallback_chat_generator: The LLM of the fallback rounds of `concat_pf`, `pf_concat` and `cascade`.
        :param settings: Further `StrategyConfig` fields (JSON values), e.g. `{"num_candidates": 3}`.
        :param verifier_chat_generator: SuRe's validity and ranking LLM (Kim et al., Table 10); None: `chat_generator`.
        :param document_ranker: SuRe's summary reranker (Kim et al., Table 4); None keeps the given order.
        :param streaming_callback: Sync for `run`, sync or async for `run_async`.
        :raises ValueError: If the strategy is not registered, `settings` holds a component or an unknown field, or
            `build_pipeline` rejects the settings.
        """
        self.strategy = strategy
        self.chat_generator = chat_generator
        self.settings = dict(settings or {})
        self.fallback_chat_generator = fallback_chat_generator
        self.verifier_chat_generator = verifier_chat_generator
        self.document_ranker = document_ranker
        self.streaming_callback = streaming_callback
        answer_component = get_strategy(strategy).answer_component
        allowed = set(StrategyConfig.__dataclass_fields__) - {"chat_generator", *_COMPONENT_SETTINGS}
        unknown = sorted(set(self.settings) - allowed)
        if unknown:
            raise ValueError(f"FusionAnswerer `settings` has no field(s) {unknown}; allowed: {sorted(allowed)}")
        self.pipeline = build_pipeline(
            strategy,
            chat_generator=chat_generator,
            fallback_chat_generator=fallback_chat_generator,
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
        # the inner components that stream the call writing the answer get the callback; the socket is always there
        streaming = sorted(
            f"{name}.streaming_callback" for name, sockets in inputs.items() if "streaming_callback" in sockets
        )
        if streaming:
            self.input_mapping["streaming_callback"] = streaming
        else:
            component.set_input_type(self, "streaming_callback", StreamingCallbackT | None, None)

    def _failed_run(self) -> contextlib.AbstractContextManager[list[CallFailure]]:
        stages = get_strategy(self.strategy).stages
        reader = stages[0].component if len(stages) == 1 and stages[0].kind == "answer" else None
        return failed_run(f"strategy {self.strategy!r}", reader=reader)

    def _split_callback(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        """The inputs and the run's callback (a class is `SuperComponent`'s stand-in for a missing input)."""
        validate_query(kwargs.get("query", ""))
        inputs = {key: value for key, value in kwargs.items() if key != "streaming_callback"}
        runtime = kwargs.get("streaming_callback")
        return inputs, None if isinstance(runtime, type) else runtime

    def _last_chunk(self, result: dict[str, Any], streamed: str | None) -> StreamingChunk | None:
        answers = result["answers"]
        answer = (answers[0].data or "").strip() if answers else ""
        if not answer or (streamed is not None and streamed.strip() == answer):
            return None
        text = answer if not streamed else f"\n\nAnswer: {answer}"
        info = ComponentInfo.from_component(self)
        return StreamingChunk(content=text, component_info=info, index=0, start=not streamed, finish_reason="stop")

    def run(self, **kwargs: Any) -> dict[str, Any]:
        """
        Answer `query` from `documents` (best-ranked first).

        :param kwargs: `query`, `documents`, optionally `streaming_callback` (overrides the init one).
        :returns: `answers`: the strategy's `GeneratedAnswer` list, best first.
        :raises ValueError: If the question is empty or invalid, or the streaming callback is async.
        :raises LLMCallsFailedError: If every LLM call of a round, or the strategy's only call, failed.
        """
        inputs, runtime = self._split_callback(kwargs)
        callback = select_streaming_callback(self.streaming_callback, runtime, requires_async=False)
        streamed = _Joined(callback, inputs)
        with self._failed_run():
            result = SuperComponent.run(self, **inputs)  # type: ignore[arg-type]
        if callback is not None and (last := self._last_chunk(result, streamed.text)) is not None:
            callback(last)
        return result

    async def run_async(self, **kwargs: Any) -> dict[str, Any]:
        """Async form of `run`; the streaming callback may be sync or async."""
        inputs, runtime = self._split_callback(kwargs)
        callback = runtime or self.streaming_callback
        streamed = _Joined(callback, inputs)
        with self._failed_run():
            result = await SuperComponent.run_async(self, **inputs)  # type: ignore[arg-type]
        if callback is not None and (last := self._last_chunk(result, streamed.text)) is not None:
            await emit_chunk(callback, last)
        return result

    def to_dict(self) -> dict[str, Any]:
        """Serialize the strategy name, settings and generators (the inner pipeline is rebuilt on load)."""
        components = {
            name: component_to_dict(obj=value, name=name) if (value := getattr(self, name)) is not None else None
            for name in ("chat_generator", *_COMPONENT_SETTINGS)
        }
        callback = serialize_callable(self.streaming_callback) if self.streaming_callback else None
        return default_to_dict(
            self, strategy=self.strategy, settings=self.settings, streaming_callback=callback, **components
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FusionAnswerer:
        """Rebuild from `to_dict`'s output, deserializing the generators and the ranker."""
        params = data["init_parameters"]
        if params.get("streaming_callback"):
            params["streaming_callback"] = deserialize_callable(params["streaming_callback"])
        for name in ("chat_generator", *_COMPONENT_SETTINGS):
            if params.get(name):
                deserialize_component_inplace(params, key=name)
        return default_from_dict(cls, data)


class _Joined:
    """A streaming callback that keeps the text it passes on (`text`: None until a chunk came), put in `inputs`."""

    def __init__(self, callback: StreamingCallbackT | None, inputs: dict[str, Any]) -> None:
        self.text: str | None = None
        self.callback: Callable[[StreamingChunk], Any]
        if callback is None:
            return
        if is_async_callback(callback):

            async def join_async(chunk: StreamingChunk) -> None:
                self.text = (self.text or "") + chunk.content
                await callback(chunk)  # type: ignore[misc]

            self.callback = join_async
        else:

            def join(chunk: StreamingChunk) -> None:
                self.text = (self.text or "") + chunk.content
                callback(chunk)

            self.callback = join
        inputs["streaming_callback"] = self.callback
