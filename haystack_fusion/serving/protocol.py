"""
OpenAI's chat completions contract as the served chat speaks it (`serve` extra): which request fields a strategy can
honor (`check_request`, the table in docs/serving.md), which client dialect a request gets (`dialect`), and the
replies: a `chat.completion` with `usage` (`completion`) or a stream of `chat.completion.chunk`s (`CompletionStream`).

Every reply carries the passages it cites twice: as plain text after the answer ("Sources:", numbered and titled,
`strategies.chat_text`) and as structured data in a top-level `sources` list (`source_records`), on the completion and
on a stream's last content chunk. OpenAI's own `annotations` are URL citations; passages have no URL, hence a field of
its own, which OpenAI's clients keep as an extra field (`completion.sources` in the `openai` SDK).
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

Dialect = Literal["openai", "open-webui", "chainlit"]
"""What a streamed reply holds besides OpenAI's chunks: nothing ("openai"); Open WebUI's status and source events
and the `<details>` evidence block ("open-webui"); the embedded chat UI's status events and evidence element
("chainlit")."""

CHAT_UI_HEADER, CHAT_UI_CLIENT = "X-Haystack-Fusion-Client", "chainlit"
"""The header (and value) the embedded Chainlit chat UI's requests carry (`serving.app.ChatUiMiddleware` sets it)."""

OPEN_WEBUI_USER_AGENT = re.compile(r"Python/\S+ aiohttp/\S+")
"""The user agent of Open WebUI's OpenAI connections: the bare `aiohttp` client's ("Python/3.11 aiohttp/3.12.15")."""

OPEN_WEBUI_HEADER_PREFIX = "x-openwebui-"
"""The headers Open WebUI sends with `ENABLE_FORWARD_USER_INFO_HEADERS` (`x-openwebui-chat-id`, ...)."""


def dialect(headers: Mapping[str, str] | None, setting: str = "auto") -> Dialect:
    """
    The dialect a chat request gets.

    :param headers: The request's headers (lower-cased names, as Starlette's `Headers`), or None.
    :param setting: `HAYSTACK_FUSION_CHAT_CLIENT` (`settings.CHAT_CLIENTS`): "open-webui" gives every request Open
        WebUI's dialect, "openai" none; "auto" gives it to the requests that look like Open WebUI's: a header that
        starts with `OPEN_WEBUI_HEADER_PREFIX`, or the user agent `OPEN_WEBUI_USER_AGENT` (what Open WebUI 0.12's
        requests carry, tests/fixtures/open_webui). The chat UI's header wins over the setting.
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
    """
    Refuse what a strategy cannot do, before anything runs; every other field is honored or ignored as docs/serving.md
    tabulates.

    :raises ServingError: HTTP 400 in OpenAI's shape with `param` naming the field, for `n` > 1, a `tool_choice` (or
        the older `function_call`) of "required" or naming a function, a `response_format` other than text,
        `modalities` other than text, and `logprobs: true`.
    """
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
    """OpenAI's `usage` from a run's: `prompt_tokens`, `completion_tokens` and their `total_tokens`, summed over every
    LLM call the reply made (the strategy's, and a follow-up's rewrite)."""
    prompt, completion = usage.prompt_tokens, usage.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def source_records(run: StrategyRun) -> list[dict[str, Any]]:
    """
    The passages a reply cites (`cited_sources`, numbered as in its "Sources:" text): per passage `index` (from 1),
    `id`, `title` (`source_title`), `content` (the whole passage text), `score` (the retriever's, rounded; None when it
    gave none) and `supporting` (whether it voted for or holds the answer).
    """
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
    """A new completion id, in OpenAI's form ("chatcmpl-" and 24 hex digits)."""
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def completion(model: str, content: str, usage: Usage, sources: list[dict[str, Any]] | None = None) -> ChatCompletion:
    """
    An unstreamed reply: one `chat.completion` choice holding `content`, `finish_reason` "stop", `usage`
    (`openai_usage`) and, when given, `sources` (`source_records`).
    """
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
    """
    The `chat.completion.chunk`s of one streamed reply, all with the same `id`, `created` and `model`: `start` (the
    assistant role), `text` (content deltas), `end` (`finish_reason` "stop" with `sources`, then, when the request asked
    with `stream_options.include_usage`, a chunk with no choices and `usage`) and `error` (no choices and an `error`
    in OpenAI's shape, which the `openai` SDK raises as an `APIError`).
    """

    model: str
    include_usage: bool = False
    id: str = field(default_factory=completion_id)
    created: int = field(default_factory=lambda: int(time.time()))

    def _chunk(self, choices: list[Choice], **extra: Any) -> ChatCompletion:
        return ChatCompletion(
            id=self.id, object="chat.completion.chunk", created=self.created, model=self.model, choices=choices, **extra
        )

    def start(self) -> ChatCompletion:
        """The first chunk: the assistant role and empty content, as OpenAI's streams begin."""
        return self._chunk([Choice(index=0, delta=Message(role="assistant", content=""))])

    def text(self, content: str) -> ChatCompletion:
        """A content delta."""
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
        """A chunk that ends the stream with an error: no choices and `body`'s `error` (`guards.openai_error`)."""
        return self._chunk([], **body)
