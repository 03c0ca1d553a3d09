"""
A fake ChatGenerator for unit tests that replies by prompt and records every call.

One base for the tests' scripted generators: extend it here rather than writing another. A test file subclasses
`ScriptedChatGenerator` with its own reply logic (`reply`) and, where a failure should only be triggered by part of
the prompt, `fail_on_text`; the base records each call's prompt and `generation_kwargs` under a lock (the components
fan calls out in threads) and raises `RuntimeError(error)` for a call whose prompt contains `fail_on`.

Haystack's `@component` recreates the class it decorates, so a zero-argument `super()` inside a decorated subclass
fails (`super(type, obj): obj must be an instance or subtype of type`): call `ScriptedChatGenerator.__init__(self, ...)`
instead. Decorate each subclass with `@component` too, so it is registered as a component of its own.

### Usage
```python
from haystack import component
from haystack.dataclasses import ChatMessage

from tests.scripted import ScriptedChatGenerator


@component
class Echo(ScriptedChatGenerator):
    def reply(self, prompt: str) -> str:
        return prompt.upper()


llm = Echo(fail_on="boom")
llm.run([ChatMessage.from_user("hi")])  # {"replies": [ChatMessage.from_assistant("HI")]}
assert llm.prompts == ["hi"] and llm.kwargs == [None] and llm.calls == 1
```
"""

import threading
from typing import Any

from haystack import component
from haystack.dataclasses import ChatMessage


@component
class ScriptedChatGenerator:
    """
    Replies with `reply(prompt)` to the last message's text and records every call, failed ones included.

    - `prompts`: each call's prompt (the last message's text), in call order.
    - `messages`: each call's whole conversation, in call order.
    - `kwargs`: each call's `generation_kwargs` (None when the caller passed none).
    - `calls`: how many calls were made.
    - `generation_kwargs`: the generator's own settings, as a real ChatGenerator's (where the components add stop
      sequences and look for `logprobs`); None, the default, makes it a generator without settings, like a mock.
    """

    error = "backend exploded"
    """The message of the `RuntimeError` a call raises when `fail_on` is found."""

    def __init__(self, fail_on: str | None = None, generation_kwargs: dict[str, Any] | None = None) -> None:
        """
        :param fail_on: A call raises `RuntimeError(error)` when its `fail_on_text` contains this; None or "" never.
        :param generation_kwargs: The generator's own settings (not the calls' kwargs, which `kwargs` records).
        """
        self.fail_on = fail_on
        self.generation_kwargs = generation_kwargs
        self.prompts: list[str] = []
        self.messages: list[list[ChatMessage]] = []
        self.kwargs: list[dict[str, Any] | None] = []
        self._lock = threading.Lock()

    @property
    def calls(self) -> int:
        """How many calls were made (failed ones included)."""
        return len(self.prompts)

    def reply(self, prompt: str) -> str:
        """The reply text to `prompt`; subclasses define it."""
        raise NotImplementedError(f"{type(self).__name__} must define reply(prompt)")

    def fail_on_text(self, prompt: str) -> str:
        """The part of `prompt` that `fail_on` is looked for in: all of it, unless a subclass narrows it."""
        return prompt

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], generation_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        """
        Record the call, then fail or reply.

        :param messages: The conversation; only the last message's text is read.
        :param generation_kwargs: The call's kwargs; recorded, otherwise ignored.
        :returns: `{"replies": [ChatMessage.from_assistant(reply(prompt))]}`.
        :raises RuntimeError: With `error`, when `fail_on` is in `fail_on_text(prompt)`.
        """
        prompt = messages[-1].text or ""
        with self._lock:
            self.prompts.append(prompt)
            self.messages.append(list(messages))
            self.kwargs.append(generation_kwargs)
        if self.fail_on and self.fail_on in self.fail_on_text(prompt):
            raise RuntimeError(self.error)
        return {"replies": [ChatMessage.from_assistant(self.reply(prompt))]}
