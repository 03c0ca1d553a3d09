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
  LLM call whose reply nothing can replace), then the sources and evidence in the client's own form. Open WebUI (and
  any other streaming client) gets one source event per supporting passage and a collapsible `<details>` block; the
  embedded Chainlit chat UI, whose requests carry `CHAT_UI_HEADER` (`haystack-fusion serve --with-chainlit` gives
  them the header), gets one custom element event that its `EVIDENCE_ELEMENT` component (`CHAINLIT_ELEMENTS_DIR`)
  renders, so its message is the answer alone. Non-streaming clients get the answer, a blank line, "Sources:" and the
  numbered passages, as plain text;
- refuses what it should not run, each with one line and no traceback: 400 for a question that is empty, too long
  (`HAYSTACK_FUSION_MAX_QUESTION_CHARS`) or missing from the messages; 503 with `Retry-After` beyond the process's
  admission limit (`serving.limits`); 503 naming the URL and variable when a backend cannot be reached or refuses
  (`backends.errors`), including a configured Elasticsearch or Ollama server that did not answer at setup.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

try:
    from fastapi import HTTPException
    from hayhooks import BasePipelineWrapper, get_last_user_message
    from hayhooks.chainlit_events import create_custom_element_event
    from hayhooks.events import PipelineEvent, create_status_event
    from hayhooks.open_webui import create_details_tag, create_source_event
    from starlette.datastructures import Headers
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("Serving with Hayhooks needs the `serve` extra: pip install 'haystack-fusion[serve]'") from error

from haystack import Pipeline, logging
from haystack.dataclasses import StreamingChunk

from haystack_fusion.backends import (
    LocalChatGenerator,
    backend_error_message,
    chat_generator,
    every_call_failed_message,
    retriever,
    warn_missing_logprobs,
)
from haystack_fusion.backends.checks import BackendSetupError, check_backend, reachability_problems, setup_message
from haystack_fusion.llm import CallLimitedChatGenerator, unwrap_call_limit
from haystack_fusion.serving.limits import (
    AdmissionLimit,
    ServerBusyError,
    ServingLimits,
    Slot,
    admission_limit,
)
from haystack_fusion.settings import strategy_defaults
from haystack_fusion.strategies import StrategyRun, build_pipeline, get_strategy, run_strategy, strategy_run
from haystack_fusion.strategies.presentation import (
    api_result,
    chat_text,
    evidence_element_props,
    evidence_markdown,
    evidence_summary,
    narrate,
    plural,
    source_event_data,
    sources,
    streamed_component,
)
from haystack_fusion.validation import validate_query

logger = logging.getLogger(__name__)

CHAT_UI_HEADER = "X-Haystack-Fusion-Client"
"""The request header that marks the embedded Chainlit chat UI's requests (value `CHAT_UI_CLIENT`): with it, a streamed
reply ends in the `EVIDENCE_ELEMENT` custom element instead of Open WebUI's source events and details block."""

CHAT_UI_CLIENT = "chainlit"
"""The value of `CHAT_UI_HEADER` on the chat UI's requests."""

EVIDENCE_ELEMENT = "FusionEvidence"
"""The chat UI's custom element for a reply's sources and evidence: `CHAINLIT_ELEMENTS_DIR/FusionEvidence.jsx`, with
`evidence_element_props` as its props."""

CHAINLIT_ELEMENTS_DIR = Path(__file__).parent / "chainlit_elements"
"""The folder of the chat UI's custom elements (`.jsx`), shipped in the package: `HAYHOOKS_CHAINLIT_CUSTOM_ELEMENTS_DIR`
names it when `haystack-fusion serve --with-chainlit` runs."""

_SETUP_LOCK = threading.Lock()
"""Hayhooks sets wrappers up in parallel threads; Haystack's lazy imports and the model's loading are not meant for
that, so one wrapper is set up at a time."""


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


def _generator_of(instance: Any) -> Any:
    return unwrap_call_limit(getattr(instance, "_chat_generator", instance))


def _needs_sync_callback(instance: Any) -> bool:
    """
    Whether the streaming component's generator calls its callback from a worker thread (a sync callback): the
    embedded model (its `run_async` runs `run` in a thread) and generators without `run_async`.
    """
    generator = _generator_of(instance)
    if LocalChatGenerator is not None and isinstance(generator, LocalChatGenerator):
        return True
    return not hasattr(generator, "run_async")


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
                    for text, done in narrate(strategy, name, output, pipeline, state):
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


def _client_error(error: ValueError) -> HTTPException:
    return HTTPException(status_code=400, detail=str(error))


async def chat_events(
    strategy: str, pipeline: Pipeline, query: str, *, chat_ui: bool = False
) -> AsyncIterator[PipelineEvent | StreamingChunk | str]:
    """
    A strategy's chat reply in Hayhooks' streaming form: status events, the answer, then its sources and evidence.

    Status events (`hayhooks.events.create_status_event`) come as each round starts (done False) and ends (done
    True). The answer follows: token by token when `streamed_component` names a final call (then, if the answer the
    strategy extracted differs from the streamed reply, "Answer: ..." on a line of its own), else whole once the
    strategy has decided it. Then, for Open WebUI, one source event per supporting passage
    (`hayhooks.open_webui.create_source_event`, `source_event_data`) and the sources and evidence in a collapsible
    block (`create_details_tag`, `evidence_markdown`) after the answer's text; for the embedded Chainlit chat UI
    (`chat_ui`), which shows every text chunk as it comes and renders no HTML, one custom element event instead
    (`hayhooks.chainlit_events.create_custom_element_event`, `EVIDENCE_ELEMENT` with `evidence_element_props`), so
    the message's text is the answer alone.

    :param strategy: The registered strategy the pipeline was built for.
    :param pipeline: Its pipeline (`build_pipeline`).
    :param query: The question.
    :param chat_ui: End in the chat UI's custom element instead of Open WebUI's source events and details block.
    :returns: An async iterator of status events, `StreamingChunk`s and, last, source events and the details chunk
        (Open WebUI) or the custom element event (`chat_ui`).
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
            answered = f"Answered in {run.seconds:.1f} s from {plural(len(sources(run)), 'source')}"
            yield create_status_event(answered, done=True)
            if chat_ui:
                yield create_custom_element_event(EVIDENCE_ELEMENT, evidence_element_props(run))
                return
            for index, document in enumerate(sources(run), start=1):
                yield create_source_event(source_event_data(document, index))
            details = create_details_tag("evidence", evidence_summary(run), evidence_markdown(run))
            yield StreamingChunk(content="\n\n" + details)


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
            self.pipeline = build_pipeline(
                self.strategy,
                retriever=retriever(config),
                # each call holds a slot of HAYSTACK_FUSION_MAX_CALLS_IN_FLIGHT, when set, as the fan-outs' calls do
                chat_generator=CallLimitedChatGenerator(chat_generator=self.generator),
                **strategy_defaults(config.llm),
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
        return api_result(self._run(query))

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
        return api_result(await self._run_async(query))

    def run_chat_completion(self, model: str, messages: list[dict], body: dict) -> str:
        """Answer the last user message: the answer, a blank line, "Sources:" and the numbered passages."""
        return chat_text(self._run(_last_user_message(messages)))

    async def run_chat_completion_async(
        self, model: str, messages: list[dict], body: dict, headers: Headers | None = None
    ) -> str | AsyncIterator[PipelineEvent | StreamingChunk | str]:
        """
        Answer the last user message for `/v1/chat/completions`, under the process's admission limit.

        :param model: The wrapper's name.
        :param messages: The chat's messages; the last user message is the question.
        :param body: The request's JSON body; `"stream": true` asks for a streamed reply.
        :param headers: The request's headers (Hayhooks passes them): `CHAT_UI_HEADER` set to `CHAT_UI_CLIENT` marks
            the embedded Chainlit chat UI.
        :returns: With `"stream": true` in the request, an async generator (`chat_events`): status events, the
            answer (token by token where the final round is one call), then, for Open WebUI, a source event per
            supporting passage and the sources and evidence in a `<details>` block, or, for the chat UI, one custom
            element event with them. A backend failure while streaming ends the stream with a status event and the
            one-line message. Otherwise the text of `run_chat_completion`.
        :raises HTTPException: Before anything streams: 400 for no user message, an empty or too long question;
            503 when the server is busy (with `Retry-After`) or, without streaming, when the backend cannot be
            reached or refuses (naming its URL and variable).
        """
        question = _last_user_message(messages)
        if not body.get("stream"):
            return chat_text(await self._run_async(question))
        question = self._check(question)
        chat_ui = headers is not None and headers.get(CHAT_UI_HEADER) == CHAT_UI_CLIENT
        slot = await self._slot()
        events = self._guarded_events(question, slot, chat_ui=chat_ui)
        weakref.finalize(events, slot.release)  # a stream never started (client gone) still gives its slot back
        return events

    async def _guarded_events(
        self, question: str, slot: Slot, *, chat_ui: bool = False
    ) -> AsyncIterator[PipelineEvent | StreamingChunk | str]:
        try:
            async for event in chat_events(self.strategy, self.pipeline, question, chat_ui=chat_ui):
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
