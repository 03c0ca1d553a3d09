"""
OpenAI's chat completions contract as the served chat speaks it: the request fields a strategy can honor, the client
dialect, and the replies. Every reply cites its passages as "Sources:" text and as a top-level `sources` list (passages
have no URL for OpenAI's `annotations`; the `openai` SDK keeps it as `completion.sources`).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi_openai_compat import ChatCompletion, Choice, Message
from haystack import Document

from haystack_fusion.serving.guards import ServingError
from haystack_fusion.strategies import StrategyRun, Usage, cited_sources, rounded, source_title, supporting_ids

Dialect = Literal["openai", "open-webui", "chainlit"]  # what a stream holds besides OpenAI's chunks (`chat_events`)

CHAT_UI_HEADER, CHAT_UI_CLIENT = "X-Haystack-Fusion-Client", "chainlit"  # set by `serving.app.ChatUiMiddleware`
OPEN_WEBUI_USER_AGENT = re.compile(r"Python/\S+ aiohttp/\S+")  # Open WebUI's OpenAI connections (bare aiohttp)
OPEN_WEBUI_HEADER_PREFIX = "x-openwebui-"  # sent with Open WebUI's `ENABLE_FORWARD_USER_INFO_HEADERS`


def dialect(headers: Mapping[str, str] | None, setting: str = "auto") -> Dialect:
    """
    The dialect a chat request gets: the chat UI's header wins; else `setting` (`HAYSTACK_FUSION_CHAT_CLIENT`), and
    with "auto" Open WebUI's for a request that looks like one (`OPEN_WEBUI_HEADER_PREFIX`, `OPEN_WEBUI_USER_AGENT`).
    """
    headers = headers or {}
    if headers.get(CHAT_UI_HEADER.lower()) == CHAT_UI_CLIENT:
        return "chainlit"
    if setting != "auto":
        return "open-webui" if setting == "open-webui" else "openai"
    if any(name.lower().startswith(OPEN_WEBUI_HEADER_PREFIX) for name in headers):
        return "open-webui"
    return "open-webui" if OPEN_WEBUI_USER_AGENT.fullmatch(headers.get("user-agent", "")) else "openai"


def _refuse(param: str, message: str) -> ServingError:
    return ServingError(400, f"`{param}`: {message}", code="unsupported_parameter", param=param)


def check_request(body: Mapping[str, Any]) -> None:
    """:raises ServingError: HTTP 400 naming the field a strategy cannot honor: `n` > 1, a forced `tool_choice` /
    `function_call`, a non-text `response_format` or `modalities`, `logprobs: true` (docs/serving.md)."""
    n = body.get("n")
    if n is not None and n != 1:
        raise _refuse("n", f"this server answers with one choice per request, got n={n!r}; send n=1 or leave it out")
    for name in ("tool_choice", "function_call"):
        choice = body.get(name)
        if choice is not None and choice not in ("auto", "none"):
            raise _refuse(
                name,
                "this server answers from its passages and never calls a tool; it cannot be made to call one "
                f'(got {choice!r}): send "auto" or "none", or leave it out',
            )
    response_format = body.get("response_format")
    if response_format is not None and (
        not isinstance(response_format, Mapping) or response_format.get("type") != "text"
    ):
        raise _refuse("response_format", 'this server answers in plain text: send {"type": "text"} or leave it out')
    modalities = body.get("modalities")
    if modalities is not None and (not isinstance(modalities, list) or set(modalities) - {"text"}):
        raise _refuse("modalities", 'this server answers in text only: send ["text"] or leave it out')
    if body.get("logprobs"):
        raise _refuse("logprobs", "this server returns no token log-probabilities: leave `logprobs` out or false")


def include_usage(body: Mapping[str, Any]) -> bool:
    """Whether a streamed request asks for a last chunk with `usage` (`stream_options.include_usage`)."""
    options = body.get("stream_options")
    return isinstance(options, Mapping) and bool(options.get("include_usage"))


def openai_usage(usage: Usage) -> dict[str, int]:
    """OpenAI's `usage` (with `total_tokens`) from a run's."""
    prompt, completion = usage.prompt_tokens, usage.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def source_records(run: StrategyRun) -> list[dict[str, Any]]:
    """The passages a reply cites, numbered as in its "Sources:" text: `index`, `id`, `title`, `content`, `score`
    (rounded) and `supporting`."""
    supporting = supporting_ids(run)
    return [_record(index, document, document.id in supporting) for index, document in enumerate(cited_sources(run), 1)]


def _record(index: int, document: Document, supporting: bool) -> dict[str, Any]:
    return {
        "index": index,
        "id": document.id,
        "title": source_title(document),
        "content": document.content or "",
        "score": rounded(document.score),
        "supporting": supporting,
    }


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def completion(model: str, content: str, usage: Usage, sources: list[dict[str, Any]] | None = None) -> ChatCompletion:
    """An unstreamed `chat.completion` reply, with `sources` when given."""
    return ChatCompletion(
        id=completion_id(),
        object="chat.completion",
        created=int(time.time()),
        model=model,
        choices=[Choice(index=0, message=Message(role="assistant", content=content), finish_reason="stop")],
        usage=openai_usage(usage),
        **({"sources": sources} if sources is not None else {}),
    )


@dataclass
class CompletionStream:
    """The `chat.completion.chunk`s of one streamed reply, sharing `id`, `created` and `model`."""

    model: str
    include_usage: bool = False
    id: str = field(default_factory=completion_id)
    created: int = field(default_factory=lambda: int(time.time()))

    def _chunk(self, choices: list[Choice], **extra: Any) -> ChatCompletion:
        return ChatCompletion(
            id=self.id, object="chat.completion.chunk", created=self.created, model=self.model, choices=choices, **extra
        )

    def start(self) -> ChatCompletion:
        """The assistant role and empty content, as OpenAI's streams begin."""
        return self._chunk([Choice(index=0, delta=Message(role="assistant", content=""))])

    def text(self, content: str) -> ChatCompletion:
        return self._chunk([Choice(index=0, delta=Message(role="assistant", content=content))])

    def end(self, usage: Usage, sources: list[dict[str, Any]]) -> list[ChatCompletion]:
        """The last chunks: `finish_reason` "stop" with `sources`, then `usage` when the request asked for it."""
        chunks = [
            self._chunk([Choice(index=0, delta=Message(role="assistant"), finish_reason="stop")], sources=sources)
        ]
        if self.include_usage:
            chunks.append(self._chunk([], usage=openai_usage(usage)))
        return chunks

    def error(self, body: dict[str, Any]) -> ChatCompletion:
        """No choices and `body`'s `error`: the `openai` SDK raises it as an `APIError`."""
        return self._chunk([], **body)
