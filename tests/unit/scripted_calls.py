"""
Scripted replies and failures for the fan-out of chat calls, shared by the fan-out, usage and tracing tests.
"""

from typing import Any

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
