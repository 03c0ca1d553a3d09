"""Hayhooks pipeline wrappers for the strategies (`serve` extra): `POST /{name}/run` and the chat endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

try:
    from fastapi import HTTPException
    from fastapi_openai_compat import ChatCompletion
    from hayhooks import BasePipelineWrapper
    from hayhooks.chainlit_events import create_custom_element_event
    from hayhooks.events import PipelineEvent, create_status_event
    from hayhooks.open_webui import create_details_tag, create_source_event
    from starlette.datastructures import Headers
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("Serving with Hayhooks needs the `serve` extra: pip install 'haystack-fusion[serve]'") from error

from haystack import Pipeline, logging
from haystack.dataclasses import StreamingChunk

from haystack_fusion.answers import validate_query
from haystack_fusion.backends import (
    SERVING_MAX_RETRIES,
    BackendConfig,
    backend_error_message,
    backend_pipeline,
    chat_generator,
    fallback_chat_generator,
    fallback_config,
    llm_server_name,
    user_error_message,
    warn_missing_logprobs,
)
from haystack_fusion.backends.checks import BackendSetupError, check_backend, reachability_problems, setup_message
from haystack_fusion.breaker import CircuitBreaker
from haystack_fusion.failures import exception_chain, failed_run
from haystack_fusion.llm import CallLimitedChatGenerator, threaded_callback
from haystack_fusion.serving.chat import Chat, answer_task, digest, read_chat, standalone_question
from haystack_fusion.serving.guards import ServingError, openai_error
from haystack_fusion.serving.presentation import (
    answered_text,
    api_result,
    evidence_element_props,
    evidence_markdown,
    evidence_summary,
    narrate,
    plural,
    source_event_data,
    streamed_component,
)
from haystack_fusion.serving.protocol import (
    CompletionStream,
    Dialect,
    check_request,
    completion,
    dialect,
    include_usage,
    source_records,
)
from haystack_fusion.settings import (
    SERVING_LIMIT_VARIABLES,
    BreakerSettings,
    chat_client_from_env,
    serving_limit_values,
)
from haystack_fusion.strategies import StrategyRun, Usage, chat_text, get_strategy, passages, sources_text, strategy_run

logger = logging.getLogger(__name__)

# the chat UI's stream ends in one EVIDENCE_ELEMENT (CHAINLIT_ELEMENTS_DIR/FusionEvidence.jsx)
EVIDENCE_ELEMENT = "FusionEvidence"
CHAINLIT_ELEMENTS_DIR = Path(__file__).parent / "chainlit_elements"

_SETUP_LOCK = threading.Lock()  # Hayhooks sets wrappers up in threads; lazy imports and model loading are not safe

# per LLM kind: requests run at once, and seconds a request waits for a slot
DEFAULT_MAX_REQUESTS = {"local": 1, "openai": 32, "ollama": 4}
DEFAULT_QUEUE_TIMEOUT = {"local": 300.0, "openai": 30.0, "ollama": 120.0}


class ServerBusyError(RuntimeError):
    """A request the admission limit refused; `retry_after`: seconds (>= 1) for `Retry-After`."""

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class ServingLimits:
    """The limits a served wrapper applies: requests at once process-wide (>= 1), waiting (>= 0), seconds waiting
    (> 0), question characters after stripping (>= 1). :raises ValueError: If one is out of range."""

    max_requests: int = DEFAULT_MAX_REQUESTS["openai"]
    max_waiting: int = 64
    queue_timeout: float = DEFAULT_QUEUE_TIMEOUT["openai"]
    max_question_chars: int = 2000

    def __post_init__(self) -> None:
        for name, low in (("max_requests", 1), ("max_waiting", 0), ("max_question_chars", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"`{name}` must be at least {low}, got {getattr(self, name)}")
        if not self.queue_timeout > 0:
            raise ValueError(f"`queue_timeout` must be a positive number of seconds, got {self.queue_timeout}")

    @classmethod
    def from_env(cls, llm: str, env: Mapping[str, str] | None = None) -> ServingLimits:
        """The limits `SERVING_LIMIT_VARIABLES` set in `env` (default `os.environ`), else the LLM kind's defaults.

        :raises ValueError: If a variable is not a number or is out of range, naming the variable."""
        values = serving_limit_values(env)
        values.setdefault("max_requests", DEFAULT_MAX_REQUESTS.get(llm, DEFAULT_MAX_REQUESTS["openai"]))
        values.setdefault("queue_timeout", DEFAULT_QUEUE_TIMEOUT.get(llm, DEFAULT_QUEUE_TIMEOUT["openai"]))
        for name, value in values.items():
            try:
                cls(**{name: value})  # type: ignore[arg-type]
            except ValueError as error:
                raise ValueError(f"{SERVING_LIMIT_VARIABLES[name]}: {error}") from None
        return cls(**values)  # type: ignore[arg-type]

    def check_question(self, question: str) -> None:
        """:raises ValueError: If the stripped question is too long, giving both lengths (not the question)."""
        if (length := len(question.strip())) > self.max_question_chars:
            raise ValueError(
                f"The question has {length} characters; this server answers questions of at most "
                f"{self.max_question_chars} characters"
            )


class AdmissionLimit:
    """At most `max_requests` requests at once; up to `max_waiting` more wait in arrival order, each at most
    `queue_timeout` seconds; the others get `ServerBusyError`. Used from the server's one event loop."""

    def __init__(self, *, max_requests: int, max_waiting: int, queue_timeout: float) -> None:
        ServingLimits(max_requests=max_requests, max_waiting=max_waiting, queue_timeout=queue_timeout)
        self.max_requests, self.max_waiting, self.queue_timeout = max_requests, max_waiting, queue_timeout
        self.running = self.waiting = 0  # requests holding a slot, waiting for one
        self._semaphore = asyncio.Semaphore(max_requests)

    @property
    def busy(self) -> bool:
        """Whether a request arriving now has to wait."""
        return self.running >= self.max_requests or self.waiting > 0

    def check_room(self) -> None:
        """:raises ServerBusyError: If a request arriving now would be refused at once (`max_waiting` wait)."""
        if self.busy and self.waiting >= self.max_waiting:
            raise self._busy(
                f"The server is busy: {self.running} requests are running and {self.waiting} waiting (the limits: "
                f"{self.max_requests} and {self.max_waiting}); retry later"
            )

    def _busy(self, message: str) -> ServerBusyError:
        return ServerBusyError(message, retry_after=max(1, math.ceil(self.queue_timeout)))

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold a slot for the block. :raises ServerBusyError: If too many wait, or none came in `queue_timeout`."""
        self.check_room()
        if not self.busy:
            await self._semaphore.acquire()  # free: taken at once, without yielding to the loop
        else:
            self.waiting += 1
            try:
                await asyncio.wait_for(self._semaphore.acquire(), self.queue_timeout)
            except TimeoutError:
                raise self._busy(
                    f"The server is busy: no request slot came free within {self.queue_timeout:g} s (the limit: "
                    f"{self.max_requests} {'request' if self.max_requests == 1 else 'requests'} at once); retry later"
                ) from None
            finally:
                self.waiting -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self._semaphore.release()


_LIMITS: list[AdmissionLimit] = []


def admission_limit(limits: ServingLimits) -> AdmissionLimit:
    """The process's one `AdmissionLimit`, made from the first `limits` given."""
    if not _LIMITS:  # wrappers are set up one at a time (`_SETUP_LOCK`)
        _LIMITS.append(AdmissionLimit(**{k: v for k, v in vars(limits).items() if k != "max_question_chars"}))
    return _LIMITS[0]


def llm_breaker(config: BackendConfig | None, settings: BreakerSettings) -> CircuitBreaker | None:
    """The shared circuit breaker of the LLM server `config` calls; None for the embedded model, no `config`, or
    breakers turned off."""
    name = None if config is None else llm_server_name(config)
    if name is None or not settings.enabled:
        return None
    return CircuitBreaker.shared(name, failure_threshold=settings.failure_threshold, cooldown=settings.cooldown)


@dataclass(frozen=True)
class StreamItem:
    """One item of `stream_strategy`: "status" (`text`, `done`), "token" (`text`, in order) or "result" (`run`)."""

    kind: Literal["status", "token", "result"]
    text: str = ""
    done: bool = False
    run: StrategyRun | None = None


async def stream_strategy(pipeline: Pipeline, query: str, *, stream_tokens: bool = True) -> AsyncIterator[StreamItem]:
    """Run a strategy pipeline asynchronously: round statuses (`narrate`), with `stream_tokens` the answer's tokens,
    then the result. :raises PipelineRuntimeError: If a component fails."""
    data: dict[str, dict[str, Any]] = {
        name: {"query": query} for name, sockets in pipeline.inputs().items() if "query" in sockets
    }
    names = {name for name, _ in pipeline.walk()}
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    target = streamed_component(pipeline) if stream_tokens else None
    if target is not None and "streaming_callback" in pipeline.inputs().get(target, {}):

        async def queue_token(chunk: StreamingChunk) -> None:
            if chunk.content:
                queue.put_nowait(("token", chunk.content))

        threaded = not hasattr(pipeline.get_component(target), "run_async")
        data.setdefault(target, {})["streaming_callback"] = (
            threaded_callback(queue_token, loop) if threaded else queue_token
        )

    async def drive() -> None:
        outputs: dict[str, dict[str, Any]] = {}
        try:
            with failed_run():  # every call of a round failed: one error with every failed call of the run
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
                    for text, done in narrate(name, output, pipeline, state):
                        yield StreamItem("status", text, done=done)
            elif kind == "error":
                raise value
            else:
                run = strategy_run(pipeline, query, value, seconds=loop.time() - start)
                yield StreamItem("result", run=run)
                return
    finally:
        if not task.done():
            task.cancel()


async def chat_events(
    pipeline: Pipeline,
    query: str,
    *,
    dialect: Dialect = "open-webui",
    finish: Callable[[StrategyRun], StrategyRun] | None = None,
) -> AsyncIterator[PipelineEvent | StreamingChunk]:
    """
    A strategy's chat reply in Hayhooks' streaming form: the answer, then by `dialect`: "openai" the `sources_text`;
    "open-webui" status and source events and a `<details>` evidence block; "chainlit" status events and one
    `EVIDENCE_ELEMENT`. `finish` is applied to the finished run before it is shown (it may raise).
    """
    streamed: list[str] = []
    async for item in stream_strategy(pipeline, query):
        if item.kind == "status":
            if dialect != "openai":
                yield create_status_event(item.text, done=item.done)
        elif item.kind == "token":
            text = item.text if streamed else item.text.lstrip()
            if text:
                streamed.append(text)
                yield StreamingChunk(content=text)
        else:
            assert item.run is not None
            run = item.run if finish is None else finish(item.run)
            answer = run.answer_text()
            reply = "".join(streamed).strip()
            if not reply:
                yield StreamingChunk(content=answer)
            elif reply != answer.strip():
                yield StreamingChunk(content=f"\n\nAnswer: {answer}")
            if dialect == "openai":
                if sources := sources_text(run):
                    yield StreamingChunk(content=f"\n\n{sources}")
                return
            yield create_status_event(answered_text(run), done=True)
            if dialect == "chainlit":
                yield create_custom_element_event(EVIDENCE_ELEMENT, evidence_element_props(run))
                return
            for index, document in enumerate(passages(run), start=1):
                yield create_source_event(source_event_data(document, index))
            details = create_details_tag("evidence", evidence_summary(run), evidence_markdown(run))
            yield StreamingChunk(content="\n\n" + details)


class StrategyPipelineWrapper(BasePipelineWrapper):
    """
    Base of the shipped Hayhooks wrappers: set `strategy`; the MCP tool's and route's description is its
    `Strategy.description`.

    ### Usage example
    ```python
    # pipelines/concat_pf/pipeline_wrapper.py (written by `haystack-fusion pipelines`)
    from haystack_fusion.serving.hayhooks import StrategyPipelineWrapper


    class PipelineWrapper(StrategyPipelineWrapper):
        strategy = "concat_pf"
    ```
    """

    strategy: ClassVar[str]
    chat_client: str = "auto"  # `HAYSTACK_FUSION_CHAT_CLIENT`, read by `setup`
    breakers: tuple[CircuitBreaker, ...] = ()  # the circuit breakers of the LLM servers it calls (`setup`)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """:raises ValueError: If `strategy` names no registered strategy."""
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
        """Build the strategy's pipeline on the checked backend, with each LLM server's breaker, and warm it up.

        :raises BackendSetupError: If the environment configures no usable backend, or a setting is out of range."""
        with _SETUP_LOCK:
            config = check_backend(probe=False)
            try:
                self.limits = ServingLimits.from_env(config.llm)
                breaker_settings = BreakerSettings.from_env()
            except ValueError as error:
                raise BackendSetupError(setup_message([str(error)])) from error
            for problem in reachability_problems(config):
                logger.warning(
                    "{strategy}: {problem}; deployed anyway, its requests get HTTP 503 until the server answers",
                    strategy=self.strategy,
                    problem=problem,
                )
            try:
                self.chat_client = chat_client_from_env()
            except ValueError as error:
                raise BackendSetupError(setup_message([str(error)])) from error
            self.config = config
            self.admission: AdmissionLimit = admission_limit(self.limits)
            self.generator = chat_generator(config, default_max_retries=SERVING_MAX_RETRIES)
            breaker = llm_breaker(config, breaker_settings)
            self.llm = CallLimitedChatGenerator(chat_generator=self.generator, breaker=breaker)
            fallback = fallback_chat_generator(config, default_max_retries=SERVING_MAX_RETRIES)
            fallback_breaker = llm_breaker(fallback_config(config), breaker_settings)
            self.breakers = tuple(dict.fromkeys(b for b in (breaker, fallback_breaker) if b is not None))
            self.pipeline = backend_pipeline(
                self.strategy,
                config,
                chat_generator=self.llm,
                fallback_chat_generator=fallback
                and CallLimitedChatGenerator(chat_generator=fallback, breaker=fallback_breaker),
            )
            self.pipeline.warm_up()

    def _check(self, question: str) -> str:
        self.limits.check_question(question)
        return validate_query(question)

    def _retry_after(self) -> float:
        """Seconds until this wrapper's LLM servers may be called again (0: no breaker is open)."""
        return max((breaker.retry_after() for breaker in self.breakers), default=0.0)

    def _unavailable(self, message: str, cause: str) -> ServingError:
        """The 503 of a failing backend: `message` for the user, `cause` for the log; `x-should-retry: false` stops
        the `openai` client's retries, `Retry-After` when a breaker is open."""
        headers = {"x-should-retry": "false"}
        if (wait := self._retry_after()) > 0:
            headers["Retry-After"] = str(max(1, math.ceil(wait)))
        return ServingError(503, message, code="backend_unavailable", headers=headers, cause=cause)

    def _failure(self, error: BaseException) -> ServingError:
        """The `ServingError` a failure answers: 400, 503 (busy or a backend), 502 (an LLM server's HTTP status) or
        500."""
        if isinstance(error, ServingError):
            return error
        if isinstance(error, HTTPException):
            return ServingError(error.status_code, str(error.detail), code=f"http_{error.status_code}")
        if isinstance(error, ServerBusyError):
            return ServingError(503, str(error), code="server_busy", headers={"Retry-After": str(error.retry_after)})
        if isinstance(error, ValueError):
            return ServingError(400, str(error), code="invalid_request")
        cause = backend_error_message(error, self.config)
        if cause is not None:
            message = user_error_message(error, self.config, retry_after=self._retry_after() or None)
            return self._unavailable(message or cause, cause)
        for link in exception_chain(error):
            status = getattr(link, "status_code", None)
            if isinstance(status, int):
                refused = f"the LLM or document store server refused a call: {type(link).__name__} (HTTP {status})"
                return ServingError(502, f"{refused}; the server log has the details", code="llm_error")
        return ServingError(
            500, f"internal error ({type(error).__name__}): the server log has the details", code="internal_error"
        )

    @contextlib.contextmanager
    def _answering(self) -> Iterator[None]:
        """Raise a failure as its `ServingError`."""
        try:
            yield
        except Exception as error:
            raise self._failure(error) from None

    def _finish(
        self, run: StrategyRun, *, asked: str | None = None, rewrite: Usage | None = None, rewrite_seconds: float = 0.0
    ) -> StrategyRun:
        """The run as served; a follow-up's gets `asked`, `standalone_question` and the rewrite's usage and time."""
        if asked is not None and rewrite is not None:
            evidence = dataclasses.replace(run.evidence, asked=asked, standalone_question=run.answer.query or asked)
            usage, seconds = run.usage + rewrite, run.seconds + rewrite_seconds
            run = dataclasses.replace(run, usage=usage, evidence=evidence, seconds=seconds)
        warn_missing_logprobs(self.generator, run.answers)  # logged once per process
        return run

    async def _standalone(self, chat: Chat | None, question: str) -> tuple[str, dict[str, Any]]:
        """The question to run and `_finish`'s keyword arguments for a follow-up's rewrite."""
        if chat is None or not chat.follow_up:
            return question, {}
        start, limit = time.perf_counter(), self.limits.max_question_chars
        standalone, usage = await standalone_question(self.llm, chat.history, question, max_chars=limit)
        return standalone, {"asked": question, "rewrite": usage, "rewrite_seconds": time.perf_counter() - start}

    async def run_api_async(self, query: str) -> dict:
        """
        Answer a question from the retrieved passages, under the process's admission limit.

        :param query: The question.
        :returns: `answer` (text), `sources` (id, title, content, score of the answer's passages, else the retrieved
            ones), `evidence` (the strategy's own: votes, candidates, notes, stages, ...) and `usage` (LLM calls,
            tokens).
        :raises ServingError: 400 for an empty, too long or invalid question; 503 when the server is busy (with
            `Retry-After`), the backend cannot be reached or refuses, its LLM server's circuit breaker is open or
            every LLM call failed (in the user's terms, with `x-should-retry: false`); 502 when an LLM server refused a
            call.
        """
        with self._answering():
            return api_result(await self._answer(self._check(query)))

    async def _answer(self, query: str, chat: Chat | None = None) -> StrategyRun:
        async with self.admission.slot():
            query, rewrite = await self._standalone(chat, query)
            async for item in stream_strategy(self.pipeline, query, stream_tokens=False):
                if item.run is not None:
                    return self._finish(item.run, **rewrite)
        raise RuntimeError("the strategy run ended without a result")  # pragma: no cover

    async def run_chat_completion_async(
        self, model: str, messages: list[dict], body: dict, headers: Headers | None = None
    ) -> ChatCompletion | AsyncIterator[PipelineEvent | StreamingChunk | str | ChatCompletion]:
        """
        Answer a chat's last user message for `/v1/chat/completions` in OpenAI's contract (`protocol`). A background
        task gets one plain LLM call outside the admission limit; a follow-up is first rewritten (one call).

        :param headers: Choose the dialect (`protocol.dialect`).
        :returns: Unstreamed, a `chat.completion` (answer and `sources_text`, `usage`, `sources`). Streamed, chunks
            for OpenAI's clients or Hayhooks' events (`chat_events`); a failure after the stream started ends it with
            an error chunk, never with an answer.
        :raises ServingError: Before anything streams: 400 for a refused field, no user message, non-text content or
            a bad question; 503 when busy; without streaming, as `run_api_async`.
        """
        with self._answering():
            check_request(body)
            chat = await asyncio.to_thread(read_chat, messages)  # a 1 MiB chat is read off the event loop
            if chat.task:
                logger.info("Answering a chat client's background task ({size})", size=digest(chat.question))
                answer, usage = await answer_task(self.llm, chat.question)
                if not body.get("stream"):
                    return completion(model, answer, usage)
            else:
                question = self._check(chat.question)
                if not body.get("stream"):
                    run = await self._answer(question, chat)
                    return completion(model, chat_text(run), run.usage, source_records(run))
                self.admission.check_room()  # refused at once, before anything streams: 503 with Retry-After
        spoken = dialect(headers, self.chat_client)
        if chat.task:
            return self._task_chunks(model, answer, usage, include_usage=include_usage(body))
        reply = CompletionStream(model, include_usage(body)) if spoken == "openai" else None
        return self._events(question, chat, model=model, dialect=spoken, reply=reply)

    async def _task_chunks(
        self, model: str, answer: str, usage: Usage, *, include_usage: bool
    ) -> AsyncIterator[ChatCompletion]:
        reply = CompletionStream(model, include_usage)
        for chunk in (reply.start(), reply.text(answer), *reply.end(usage, [])):
            yield chunk

    async def _events(
        self, question: str, chat: Chat, *, model: str, dialect: Dialect, reply: CompletionStream | None
    ) -> AsyncIterator[PipelineEvent | StreamingChunk | str | ChatCompletion]:
        """The streamed reply: Hayhooks' events (`reply` None), or each event's text as `reply`'s chunks."""
        narrated = reply is None
        finished: list[StrategyRun] = []
        try:
            if reply is not None:
                yield reply.start()
            if narrated and self.admission.busy:
                ahead = self.admission.running + self.admission.waiting
                yield create_status_event(f"Waiting for the server: {plural(ahead, 'question')} ahead", done=False)
            async with self.admission.slot():
                if narrated and chat.follow_up:
                    yield create_status_event("Reading the chat: rewriting the follow-up as a standalone question")
                question, rewrite = await self._standalone(chat, question)
                if narrated and chat.follow_up:
                    yield create_status_event(f"Standalone question: {question}", done=True)

                def finish(run: StrategyRun) -> StrategyRun:
                    finished.append(self._finish(run, **rewrite))
                    return finished[-1]

                async for event in chat_events(self.pipeline, question, dialect=dialect, finish=finish):
                    if reply is None:
                        yield event
                    elif isinstance(event, StreamingChunk) and event.content:
                        yield reply.text(event.content)
            if reply is not None:
                for chunk in reply.end(finished[-1].usage, source_records(finished[-1])):
                    yield chunk
        except Exception as error:
            failure = self._failure(error)
            log = logger.error if failure.status_code == 500 else logger.warning  # a 500 with its traceback
            log(
                "Ended a streamed reply with HTTP {status} {code}: {reason}",
                status=failure.status_code,
                code=failure.code,
                reason=failure.logged,
                exc_info=error if failure.status_code == 500 else None,
            )
            body = openai_error(str(failure.detail), status=failure.status_code, code=failure.code)
            if reply is None:  # Open WebUI and the chat UI: the status line, then the same error chunk
                yield create_status_event(f"Failed: {failure.detail}", done=True)
            yield (reply or CompletionStream(model)).error(body)
