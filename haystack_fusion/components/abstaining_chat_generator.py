"""AbstainingChatGenerator: a ChatGenerator whose failed call is an abstention, reported, rather than an exception."""

from __future__ import annotations

from typing import Any

from haystack import component, default_to_dict
from haystack.components.generators.chat.types import ChatGenerator
from haystack.core.serialization import component_to_dict
from haystack.dataclasses import ChatMessage

from haystack_fusion.components.base import ChatGeneratorWrapper
from haystack_fusion.llm import FanOutResult, backend_unusable, run_chat_calls, run_chat_calls_async


@component
class AbstainingChatGenerator(ChatGeneratorWrapper):
    """
    Calls a ChatGenerator once per run; a call that fails (after the generator's own retries) gives no reply and a
    report in `meta["failures"]` instead of an exception, so the pipeline goes on and a router behind it can fall back.
    A failure that says the backend itself cannot be used (it refuses the connection or the key:
    `llm.backend_unusable`) is raised as it is: every other call to that backend would fail the same way.

    The fallback strategies (`concat_pf`, `cascade`) make their concatenation call through it: post-fusion is there for
    the question the first round gives no answer to, and a failed call gives none. `UnknownRouter` routes an empty
    `replies` to its `unknown` branch (reason "no reply"). The call is the package's one fan-out with a single prompt
    (`llm.run_chat_calls`), which logs the failure and traces the call; retries and timeouts stay the generator's.

    ### Usage example
    ```python
    from haystack.components.generators.chat import OpenAIChatGenerator
    from haystack.dataclasses import ChatMessage
    from haystack.utils import Secret
    from haystack_fusion.components import AbstainingChatGenerator

    # nothing listens on the discard port: the call fails, and the failure is reported
    unreachable = OpenAIChatGenerator(
        api_key=Secret.from_token("unused"), api_base_url="http://127.0.0.1:9/v1", max_retries=0
    )
    llm = AbstainingChatGenerator(chat_generator=unreachable)
    result = llm.run(messages=[ChatMessage.from_user("What is the capital of France?")])
    print(result["replies"], result["meta"]["failures"])  # [] [{'error': 'APIConnectionError: Connection error.'}]
    ```
    """

    def __init__(self, *, chat_generator: ChatGenerator) -> None:
        """
        Create an AbstainingChatGenerator.

        :param chat_generator: The ChatGenerator to call; its retries and timeout decide when a call has failed.
        """
        self._chat_generator = chat_generator

    def to_dict(self) -> dict[str, Any]:
        """Serialize this component, with its chat generator, to a dictionary."""
        return default_to_dict(self, chat_generator=component_to_dict(obj=self._chat_generator, name="chat_generator"))

    @staticmethod
    def _outputs(calls: FanOutResult) -> dict[str, Any]:
        """The outputs of the one call's fan-out result."""
        reply = calls.replies[0]
        return {
            "replies": [] if reply is None else [reply],
            "meta": {
                "usage": dict(calls.usage, rounds=1),
                "failures": [{"error": error} for error in calls.errors if error is not None],
            },
        }

    @component.output_types(replies=list[ChatMessage], meta=dict[str, Any])
    def run(self, messages: list[ChatMessage], generation_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        """
        Make the call.

        :param messages: The conversation to send.
        :param generation_kwargs: The call's `generation_kwargs`, on top of the generator's own (None: its own only).
        :returns: A dictionary with:
            - `replies`: the generator's first reply, or an empty list when the call failed or returned no reply.
            - `meta`: `usage` (`prompt_tokens`, `completion_tokens`, `calls` = 1, `failed_calls`, `rounds` = 1,
              `cached_tokens` when the provider reports them: `llm.FanOutResult`) and `failures` (empty, or one
              `{"error": "ExceptionType: message"}`).
        :raises Exception: The generator's exception when it says the backend cannot be used (a refused connection
            or key).
        """
        calls = run_chat_calls(
            self._chat_generator, [messages], generation_kwargs=generation_kwargs, raise_if=backend_unusable
        )
        return self._outputs(calls)

    @component.output_types(replies=list[ChatMessage], meta=dict[str, Any])
    async def run_async(
        self, messages: list[ChatMessage], generation_kwargs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Async form of `run`, with the same inputs and outputs; calls the generator's `run_async` when it has one."""
        calls = await run_chat_calls_async(
            self._chat_generator, [messages], generation_kwargs=generation_kwargs, raise_if=backend_unusable
        )
        return self._outputs(calls)
