"""
Scripted replies and failures for the fan-out of chat calls, shared by the fan-out, usage and tracing tests.
"""

from typing import Any

from haystack import Document
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage

from haystack_fusion.testing import AsyncScriptedChatGenerator, ScriptedChatGenerator


def echo_prompt(messages: list[ChatMessage]) -> str:
    """A MockChatGenerator response_fn: replies with the prompt text, prefixed."""
    return f"echo:{messages[-1].text}"


def prompts_of(texts: list[str]) -> list[list[ChatMessage]]:
    return [[ChatMessage.from_user(text)] for text in texts]


def failing_sync_generator(fail_on: str = "boom") -> ScriptedChatGenerator:
    """Echoes the prompt, but raises for a prompt containing `fail_on`. Only a sync `run`: the threads path."""
    return ScriptedChatGenerator(lambda prompt: f"echo:{prompt}", fail_on=fail_on, error="cannot answer boom")


def failing_async_generator(fail_on: str = "boom") -> AsyncScriptedChatGenerator:
    """Like `failing_sync_generator`, with a `run_async` (the same reply, after a yield): the event-loop path."""
    return AsyncScriptedChatGenerator(lambda prompt: f"echo:{prompt}", fail_on=fail_on, error="cannot answer boom")


def kwargs_recording_generator(generation_kwargs: dict[str, Any] | None = None) -> ScriptedChatGenerator:
    """A chat generator that answers "Paris" and records each call's `generation_kwargs` (in `kwargs`)."""
    # a generator with settings (a dict, even empty), as a real one: the components add their stops to it
    return ScriptedChatGenerator("Paris", generation_kwargs=generation_kwargs or {})


def fake_llm(concatenation_reply: str = "unknown") -> MockChatGenerator:
    """Replies `concatenation_reply` to a prompt showing both passages, "Paris" to one showing a single passage."""

    def reply(messages: list[ChatMessage]) -> str:
        text = " ".join(message.text or "" for message in messages)
        return concatenation_reply if all(d.content in text for d in DOCUMENTS) else "Paris"

    return MockChatGenerator(response_fn=reply)


DOCUMENTS = [
    Document(content="Paris is the capital and largest city of France.", meta={"title": "Paris"}),
    Document(content="France is a country in Western Europe; its capital is Paris.", meta={"title": "France"}),
]
