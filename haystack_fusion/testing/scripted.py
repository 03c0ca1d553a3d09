"""
A ChatGenerator that replies from a script and records every call: for tests of pipelines built on the components.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from haystack import component, default_from_dict, default_to_dict
from haystack.dataclasses import ChatMessage
from haystack.utils import deserialize_callable, serialize_callable

Reply = str | Sequence[str] | Callable[[str], str]
"""A fixed reply text, the replies of successive calls in order, or a function of the prompt text."""


@component
class ScriptedChatGenerator:
    """
    Replies to the last message's text from a script and records every call, failed ones included.

    It takes the place of a real ChatGenerator (`OpenAIChatGenerator`, `LocalChatGenerator`, ...) in a pipeline or
    a component, without a model or a network. Calls may come from several threads at once (the components fan calls
    out): recording is done under a lock. A call fails with `RuntimeError(error)` when `fail_on` matches its prompt, as
    a backend error would.

    What it records, in call order:
    - `prompts`: each call's prompt (the last message's text),
    - `messages`: each call's whole conversation,
    - `kwargs`: each call's `generation_kwargs` (None when the caller passed none),
    - `calls`: how many calls were made.

    ### Usage example
    ```python
    from haystack.dataclasses import ChatMessage
    from haystack_fusion.testing import ScriptedChatGenerator

    llm = ScriptedChatGenerator(reply=lambda prompt: prompt.upper(), fail_on="boom")
    llm.run([ChatMessage.from_user("hi")])  # {"replies": [ChatMessage.from_assistant("HI")]}
    assert llm.prompts == ["hi"] and llm.kwargs == [None] and llm.calls == 1

    ScriptedChatGenerator(reply=["(a) Paris, (b) Lyon", "True"])  # one reply per call, in order
    ScriptedChatGenerator(reply="unknown", fail_on=lambda prompt: prompt.count("<passage ") > 1)
    ```
    """

    def __init__(
        self,
        reply: Reply = "Paris",
        *,
        fail_on: str | Callable[[str], bool] | None = None,
        error: str = "backend exploded",
        generation_kwargs: dict[str, Any] | None = None,
        latency: float = 0.0,
    ) -> None:
        """
        Create a scripted generator.

        :param reply: The reply text of every call; a list of texts, one per call in call order (a call after the last
            raises `RuntimeError`); or a function of the prompt text that returns the reply text (it may raise, as a
            failing backend does).
        :param fail_on: Calls whose prompt contains this text (or for whose prompt this function returns True) raise
            `RuntimeError(error)`; None or "" never.
        :param error: The message of that `RuntimeError`.
        :param generation_kwargs: The generator's own settings, as a real ChatGenerator's (where the components add
            stop sequences and look for `logprobs`); not the calls' kwargs, which `kwargs` records. None, the default,
            makes it a generator without settings, like a mock.
        :param latency: Seconds each call waits before replying (`time.sleep` in `run`, `asyncio.sleep` in
            `run_async` of `AsyncScriptedChatGenerator`), as a hosted API's round trip would take.
        :raises ValueError: For a negative latency.
        """
        if latency < 0:
            raise ValueError(f"`latency` must be >= 0, got {latency}")
        self.reply = reply
        self.fail_on = fail_on
        self.error = error
        self.generation_kwargs = generation_kwargs
        self.latency = latency
        self.prompts: list[str] = []
        self.messages: list[list[ChatMessage]] = []
        self.kwargs: list[dict[str, Any] | None] = []
        self._lock = threading.Lock()

    def to_dict(self) -> dict[str, Any]:
        """
        Serialize the generator's settings (not its record of calls).

        A function given as `reply` or `fail_on` is written as its import path, so it must be a module-level function
        (a lambda or a nested function raises, as Haystack's `serialize_callable` does).

        :returns: The dictionary Haystack's `default_to_dict` writes.
        :raises SerializationError: For a lambda or a nested function.
        """
        return default_to_dict(
            self,
            reply=_callable_to_dict(self.reply),
            fail_on=_callable_to_dict(self.fail_on),
            error=self.error,
            generation_kwargs=self.generation_kwargs,
            latency=self.latency,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScriptedChatGenerator:
        """
        Rebuild a generator from `to_dict`'s dictionary (functions imported from their paths).

        :param data: The dictionary.
        :returns: The generator, with no calls recorded.
        """
        parameters = data["init_parameters"]
        for key in ("reply", "fail_on"):
            parameters[key] = _callable_from_dict(parameters.get(key))
        return default_from_dict(cls, data)

    @property
    def calls(self) -> int:
        """How many calls were made (failed ones included)."""
        return len(self.prompts)

    def _answer(self, messages: list[ChatMessage], generation_kwargs: dict[str, Any] | None) -> dict[str, Any]:
        prompt = messages[-1].text or ""
        with self._lock:
            index = len(self.prompts)
            self.prompts.append(prompt)
            self.messages.append(list(messages))
            self.kwargs.append(generation_kwargs)
        fail_on = self.fail_on
        if fail_on and (fail_on(prompt) if callable(fail_on) else fail_on in prompt):
            raise RuntimeError(self.error)
        if isinstance(self.reply, str):
            text = self.reply
        elif callable(self.reply):
            text = self.reply(prompt)
        elif index < len(self.reply):
            text = self.reply[index]
        else:
            raise RuntimeError(f"no scripted reply left for call {index + 1} (the script holds {len(self.reply)})")
        return {"replies": [ChatMessage.from_assistant(text)]}

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], generation_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        """
        Record the call, then fail or reply.

        :param messages: The conversation; the last message's text is the prompt.
        :param generation_kwargs: The call's kwargs; recorded, otherwise ignored.
        :returns: `{"replies": [ChatMessage.from_assistant(<reply>)]}`.
        :raises RuntimeError: With `error` when `fail_on` matches the prompt; when a list of replies is used up.
        """
        if self.latency:
            time.sleep(self.latency)
        return self._answer(messages, generation_kwargs)


def _callable_to_dict(value: Any) -> Any:
    return {"callable": serialize_callable(value)} if callable(value) else value


def _callable_from_dict(value: Any) -> Any:
    return deserialize_callable(value["callable"]) if isinstance(value, dict) and "callable" in value else value


@component
class AsyncScriptedChatGenerator(ScriptedChatGenerator):
    """
    A `ScriptedChatGenerator` with a `run_async` too, so components call it on their event loop, not in threads.

    ### Usage example
    ```python
    from haystack_fusion import PostFusionVoter
    from haystack_fusion.testing import AsyncScriptedChatGenerator

    llm = AsyncScriptedChatGenerator(reply="Paris", latency=0.2)  # 200 ms per call, overlapping on the loop
    voter = PostFusionVoter(chat_generator=llm)
    ```
    """

    @component.output_types(replies=list[ChatMessage])
    async def run_async(
        self, messages: list[ChatMessage], generation_kwargs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """
        As `run`, waiting `latency` seconds with `asyncio.sleep` (so concurrent calls overlap).

        :param messages: The conversation; the last message's text is the prompt.
        :param generation_kwargs: The call's kwargs; recorded, otherwise ignored.
        :returns: `{"replies": [ChatMessage.from_assistant(<reply>)]}`.
        :raises RuntimeError: As `run`.
        """
        await asyncio.sleep(self.latency)
        return self._answer(messages, generation_kwargs)
