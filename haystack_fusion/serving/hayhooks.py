"""Hayhooks pipeline wrappers for the strategies (`serve` extra): `POST /{name}/run` and the chat endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
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
    backend_error_message,
    chat_generator,
    every_call_failed_message,
    fallback_chat_generator,
    retriever,
    warn_missing_logprobs,
)
from haystack_fusion.backends.checks import BackendSetupError, check_backend, reachability_problems, setup_message
from haystack_fusion.llm import CallLimitedChatGenerator, exception_chain, sum_usage, threaded_callback
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
from haystack_fusion.settings import SERVING_LIMIT_VARIABLES, serving_limit_values, strategy_defaults
from haystack_fusion.strategies import (
    StrategyRun,
    build_pipeline,
    chat_text,
    get_strategy,
    passages,
    strategy_run,
    strategy_settings,
)

logger = logging.getLogger(__name__)

# The embedded Chainlit chat UI's requests carry CHAT_UI_HEADER: CHAT_UI_CLIENT; their stream ends in one
# EVIDENCE_ELEMENT (CHAINLIT_ELEMENTS_DIR/FusionEvidence.jsx, props: `evidence_element_props`) instead of HTML.
CHAT_UI_HEADER, CHAT_UI_CLIENT = "X-Haystack-Fusion-Client", "chainlit"
EVIDENCE_ELEMENT = "FusionEvidence"
CHAINLIT_ELEMENTS_DIR = Path(__file__).parent / "chainlit_elements"

_SETUP_LOCK = threading.Lock()  # Hayhooks sets wrappers up in threads; lazy imports and model loading are not safe


# Per LLM kind: requests run at once (the embedded model answers one call at a time) and seconds a request waits for
# a slot (an embedded-model question takes 30-140 s), by default
DEFAULT_MAX_IN_FLIGHT = {"local": 1, "openai": 32, "ollama": 4}
DEFAULT_QUEUE_TIMEOUT = {"local": 300.0, "openai": 30.0, "ollama": 120.0}


class ServerBusyError(RuntimeError):
    """A request the admission limit refused; `retry_after`: seconds (>= 1) for the `Retry-After` header."""

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class ServingLimits:
    """
    The limits a served wrapper applies before it runs a question.

    :param max_in_flight: Requests that run at once, process-wide (>= 1).
    :param max_waiting: Requests that may wait for a slot (>= 0); the next ones are refused at once.
    :param queue_timeout: Seconds a request waits for a slot before it is refused (> 0).
    :param max_question_chars: The longest question served, in characters after stripping (>= 1; SQuAD 2.0 dev
        questions have at most a few hundred).
    :raises ValueError: If a value is out of its range, naming the parameter.
    """

    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT["openai"]
    max_waiting: int = 64
    queue_timeout: float = DEFAULT_QUEUE_TIMEOUT["openai"]
    max_question_chars: int = 2000

    def __post_init__(self) -> None:
        for name, low in (("max_in_flight", 1), ("max_waiting", 0), ("max_question_chars", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"`{name}` must be at least {low}, got {getattr(self, name)}")
        if not self.queue_timeout > 0:
            raise ValueError(f"`queue_timeout` must be a positive number of seconds, got {self.queue_timeout}")

    @classmethod
    def from_env(cls, llm: str, env: Mapping[str, str] | None = None) -> ServingLimits:
        """
        The limits `SERVING_LIMIT_VARIABLES` set in `env` (default `os.environ`), else the defaults for the LLM kind
        (`BackendConfig.llm`).

        :raises ValueError: If a variable is not a number or is out of range, naming the variable.
        """
        values = serving_limit_values(env)
        values.setdefault("max_in_flight", DEFAULT_MAX_IN_FLIGHT.get(llm, DEFAULT_MAX_IN_FLIGHT["openai"]))
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
    """
    At most `max_in_flight` requests at once; up to `max_waiting` more wait in arrival order, each at most
    `queue_timeout` seconds; the others are refused with `ServerBusyError`. Used from the server's one event loop.

    :raises ValueError: If a value is out of its range (as `ServingLimits`).
    """

    def __init__(self, *, max_in_flight: int, max_waiting: int, queue_timeout: float) -> None:
        ServingLimits(max_in_flight=max_in_flight, max_waiting=max_waiting, queue_timeout=queue_timeout)
        self.max_in_flight, self.max_waiting, self.queue_timeout = max_in_flight, max_waiting, queue_timeout
        self.in_flight = self.waiting = 0  # requests holding a slot, waiting for one
        self._semaphore = asyncio.Semaphore(max_in_flight)

    @property
    def busy(self) -> bool:
        """Whether a request that arrives now has to wait: every slot is taken, or others wait already."""
        return self.in_flight >= self.max_in_flight or self.waiting > 0

    def check_room(self) -> None:
        """:raises ServerBusyError: If a request arriving now would be refused at once (`max_waiting` wait)."""
        if self.busy and self.waiting >= self.max_waiting:
            raise self._busy(
                f"The server is busy: {self.in_flight} requests are running and {self.waiting} waiting (the limits: "
                f"{self.max_in_flight} and {self.max_waiting}); retry later"
            )

    def _busy(self, message: str) -> ServerBusyError:
        return ServerBusyError(message, retry_after=max(1, math.ceil(self.queue_timeout)))

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """
        Hold a slot for the block, waiting for one at most `queue_timeout` seconds.

        :raises ServerBusyError: If `max_waiting` requests already wait, or no slot came within `queue_timeout`.
        """
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
                    f"{self.max_in_flight} {'request' if self.max_in_flight == 1 else 'requests'} at once); retry later"
                ) from None
            finally:
                self.waiting -= 1
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            self._semaphore.release()


_LIMITS: list[AdmissionLimit] = []


def admission_limit(limits: ServingLimits) -> AdmissionLimit:
    """The process's one `AdmissionLimit`, made from the first `limits` given (every wrapper shares the backend)."""
    if not _LIMITS:  # wrappers are set up one at a time (`hayhooks._SETUP_LOCK`)
        _LIMITS.append(
            AdmissionLimit(
                max_in_flight=limits.max_in_flight, max_waiting=limits.max_waiting, queue_timeout=limits.queue_timeout
            )
        )
    return _LIMITS[0]


@dataclass(frozen=True)
class StreamItem:
    """One item of `stream_strategy`: "status" (`text`, `done`), "token" (`text`, in order) or "result" (`run`)."""

    kind: Literal["status", "token", "result"]
    text: str = ""
    done: bool = False
    run: StrategyRun | None = None


async def stream_strategy(pipeline: Pipeline, query: str, *, stream_tokens: bool = True) -> AsyncIterator[StreamItem]:
    """
    Run a strategy pipeline asynchronously: a status as each round starts and ends (`narrate`, from
    `Pipeline.run_async_generator`'s outputs), with `stream_tokens` the tokens of the component `streamed_component`
    names, then the result.

    :param query: The question, already checked (the wrappers check it when they parse the request).
    :raises PipelineRuntimeError: If a component fails.
    """
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

        # a component without `run_async` runs in a worker thread and calls back from there
        threaded = not hasattr(pipeline.get_component(target), "run_async")
        data.setdefault(target, {})["streaming_callback"] = (
            threaded_callback(queue_token, loop) if threaded else queue_token
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
    chat_ui: bool = False,
    finish: Callable[[StrategyRun], StrategyRun] | None = None,
) -> AsyncIterator[PipelineEvent | StreamingChunk | str]:
    """
    A strategy's chat reply in Hayhooks' streaming form: status events, the answer (token by token when
    `streamed_component` names a final call, then "Answer: ..." when the extracted answer differs), then one source
    event per passage and a `<details>` evidence block (Open WebUI), or one `EVIDENCE_ELEMENT` event (`chat_ui`).

    :param finish: Applied to the finished run before it is shown; may add to it or raise to report a failure.
    """
    streamed: list[str] = []
    async for item in stream_strategy(pipeline, query):
        if item.kind == "status":
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
            yield create_status_event(answered_text(run), done=True)
            if chat_ui:
                yield create_custom_element_event(EVIDENCE_ELEMENT, evidence_element_props(run))
                return
            for index, document in enumerate(passages(run), start=1):
                yield create_source_event(source_event_data(document, index))
            details = create_details_tag("evidence", evidence_summary(run), evidence_markdown(run))
            yield StreamingChunk(content="\n\n" + details)


class StrategyPipelineWrapper(BasePipelineWrapper):
    """
    Base of the shipped Hayhooks wrappers: set `strategy` to a registered strategy name. Its `run_api_async`
    docstring, the MCP tool's and route's description, starts with the strategy's `Strategy.description`.

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
        """
        Check the backend (`check_backend`: never another one; a server that does not answer yet is logged, and its
        requests get 503 until it does), build the strategy's pipeline on it and warm it up.

        :raises BackendSetupError: If the environment configures no backend this wrapper can run on, or a serving
            limit out of range.
        """
        with _SETUP_LOCK:
            config = check_backend(probe=False)
            try:
                self.limits = ServingLimits.from_env(config.llm)
            except ValueError as error:
                raise BackendSetupError(setup_message([str(error)])) from error
            for problem in reachability_problems(config):
                logger.warning(
                    "{strategy}: {problem}; deployed anyway, its requests get HTTP 503 until the server answers",
                    strategy=self.strategy,
                    problem=problem,
                )
            self.config = config
            self.admission: AdmissionLimit = admission_limit(self.limits)
            self.generator = chat_generator(config)
            # every call (strategy, rewrite, background task) holds a HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT slot
            self.llm = CallLimitedChatGenerator(chat_generator=self.generator)
            fallback = fallback_chat_generator(config)
            settings = {
                **strategy_defaults(config.llm),
                "fallback_chat_generator": fallback and CallLimitedChatGenerator(chat_generator=fallback),
            }
            self.pipeline = build_pipeline(
                self.strategy,
                retriever=retriever(config),
                chat_generator=self.llm,
                **strategy_settings(self.strategy, settings),
            )
            self.pipeline.warm_up()

    def _check(self, question: str) -> str:
        self.limits.check_question(question)
        return validate_query(question)

    def _failure(self, error: BaseException) -> ServingError:
        """The `ServingError` a failure answers: 400, 503 (busy, with `Retry-After`; a backend), 502 (an LLM server's
        HTTP status) or 500 (logged with its traceback)."""
        if isinstance(error, ServingError):
            return error
        if isinstance(error, HTTPException):
            return ServingError(error.status_code, str(error.detail), code=f"http_{error.status_code}")
        if isinstance(error, ServerBusyError):
            return ServingError(503, str(error), code="server_busy", headers={"Retry-After": str(error.retry_after)})
        if isinstance(error, ValueError):
            return ServingError(400, str(error), code="invalid_request")
        message = backend_error_message(error, self.config)
        if message is not None:
            return ServingError(503, message, code="backend_unavailable")
        for link in exception_chain(error):
            status = getattr(link, "status_code", None)
            if isinstance(status, int):
                return ServingError(
                    502,
                    f"the LLM or document store server refused a call: {type(link).__name__} (HTTP {status}); the "
                    "server log has the details",
                    code="llm_error",
                )
        return ServingError(
            500, f"internal error ({type(error).__name__}): the server log has the details", code="internal_error"
        )

    @contextlib.contextmanager
    def _answering(self) -> Iterator[None]:
        """Raise a failure as its `ServingError` (the app logs it: `serving.logs.RefusalLogMiddleware`)."""
        try:
            yield
        except Exception as error:
            failure = self._failure(error)
            raise failure from None

    def _finish(
        self, run: StrategyRun, *, asked: str | None = None, rewrite: dict[str, int] | None = None
    ) -> StrategyRun:
        """
        The run as served; a follow-up's gets `evidence["asked"]`, `evidence["standalone_question"]` and the rewrite's
        call in `usage`.

        :raises ServingError: 503 when every LLM call failed, naming the backend (a failure, not "unknown").
        """
        if asked is not None and rewrite is not None:
            evidence = {**run.evidence, "asked": asked, "standalone_question": run.answer.query or asked}
            run = dataclasses.replace(run, usage=sum_usage([run.usage, rewrite]), evidence=evidence)
        message = every_call_failed_message(run.usage, run.evidence, self.config)
        if message is not None:
            raise ServingError(503, message, code="backend_unavailable")
        warn_missing_logprobs(self.generator, run.answers)  # logged once per process
        return run

    async def _standalone(self, chat: Chat | None, question: str) -> tuple[str, str | None, dict[str, int] | None]:
        """The question to run, the question as asked and the rewrite's usage (both None when it is no follow-up)."""
        if chat is None or not chat.follow_up:
            return question, None, None
        limit = self.limits.max_question_chars
        standalone, usage = await standalone_question(self.llm, chat.history, question, max_chars=limit)
        return standalone, question, usage

    async def run_api_async(self, query: str) -> dict:
        """
        Answer a question from the retrieved passages, under the process's admission limit.

        :param query: The question.
        :returns: `answer` (text), `sources` (id, title, content, score of the answer's passages, else the retrieved
            ones), `evidence` (the strategy's own: votes, candidates, notes, stages, ...) and `usage` (LLM calls,
            tokens).
        :raises ServingError: 400 for an empty, too long or invalid question; 503 when the server is busy (with
            `Retry-After`), the backend cannot be reached or refuses (naming its URL and variable) or every LLM call
            failed; 502 when an LLM server refused a call.
        """
        with self._answering():
            return api_result(await self._answer(self._check(query)))

    async def _answer(self, query: str, chat: Chat | None = None) -> StrategyRun:
        async with self.admission.slot():
            query, asked, rewrite = await self._standalone(chat, query)
            async for item in stream_strategy(self.pipeline, query, stream_tokens=False):
                if item.run is not None:
                    return self._finish(item.run, asked=asked, rewrite=rewrite)
        raise RuntimeError("the strategy run ended without a result")  # pragma: no cover

    async def run_chat_completion_async(
        self, model: str, messages: list[dict], body: dict, headers: Headers | None = None
    ) -> str | AsyncIterator[PipelineEvent | StreamingChunk | str | ChatCompletion]:
        """
        Answer a chat's last user message for `/v1/chat/completions`. A client's background task (`chat.TASK_PREFIX`)
        gets one plain LLM call outside the admission limit; a follow-up is first rewritten into a standalone question
        (`chat.standalone_question`, one call, in the usage).

        :param body: The request's JSON body; `"stream": true` asks for a streamed reply.
        :param headers: `CHAT_UI_HEADER` set to `CHAT_UI_CLIENT` marks the embedded Chainlit chat UI.
        :returns: For a task, the model's reply. Streamed: a "waiting" status while the request waits for a slot, the
            standalone question of a follow-up, then `chat_events`; a failure after the stream started ends it with a
            status and an error chunk (OpenAI's shape), never with an answer. Else the answer, "Sources:" and passages.
        :raises ServingError: Before anything streams: 400 for no user message, content parts that are not text, or
            an empty, too long or invalid question; 503 when the server is busy (with `Retry-After`); without
            streaming, as `run_api_async`.
        """
        with self._answering():
            chat = read_chat(messages)
            if chat.task:
                logger.info("Answering a chat client's background task ({size})", size=digest(chat.question))
                return (await answer_task(self.llm, chat.question))[0]
            question = self._check(chat.question)
            if not body.get("stream"):
                return chat_text(await self._answer(question, chat))
            self.admission.check_room()  # refused at once, before anything streams: 503 with Retry-After
        chat_ui = headers is not None and headers.get(CHAT_UI_HEADER) == CHAT_UI_CLIENT
        return self._events(question, chat, model=model, chat_ui=chat_ui)

    async def _events(
        self, question: str, chat: Chat, *, model: str, chat_ui: bool
    ) -> AsyncIterator[PipelineEvent | StreamingChunk | str | ChatCompletion]:
        try:
            if self.admission.busy:
                ahead = self.admission.in_flight + self.admission.waiting
                yield create_status_event(f"Waiting for the server: {plural(ahead, 'question')} ahead", done=False)
            async with self.admission.slot():
                if chat.follow_up:
                    yield create_status_event("Reading the chat: rewriting the follow-up as a standalone question")
                question, asked, rewrite = await self._standalone(chat, question)
                if chat.follow_up:
                    yield create_status_event(f"Standalone question: {question}", done=True)
                finish = functools.partial(self._finish, asked=asked, rewrite=rewrite)
                async for event in chat_events(self.pipeline, question, chat_ui=chat_ui, finish=finish):
                    yield event
        except Exception as error:
            failure = self._failure(error)
            log = logger.error if failure.status_code == 500 else logger.warning  # a 500 with its traceback
            log(
                "Ended a streamed reply with HTTP {status} {code}: {reason}",
                status=failure.status_code,
                code=failure.code,
                reason=failure.detail,
                exc_info=error if failure.status_code == 500 else None,
            )
            yield create_status_event(f"Failed: {failure.detail}", done=True)
            yield ChatCompletion(
                id=f"{model}-error",
                object="chat.completion.chunk",
                created=int(time.time()),
                model=model,
                choices=[],
                **openai_error(str(failure.detail), status=failure.status_code, code=failure.code),
            )
