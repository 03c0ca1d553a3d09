"""What every component of the package that wraps a ChatGenerator shares: warm-up, close, deserialization."""

from __future__ import annotations

from typing import Any

from haystack import default_from_dict
from haystack.components.generators.chat.types import ChatGenerator
from haystack.utils import deserialize_chatgenerator_inplace


class ChatGeneratorWrapper:
    """
    Mixin for components that keep a ChatGenerator in `self._chat_generator` and serialize it as `chat_generator`
    (PostFusionVoter, CandidateSummarizer, SummaryVerifier, NoteTaker), as Haystack's own LLM components do.

    Its lifecycle methods delegate to the wrapped parts as Haystack's wrappers (`LLMRanker`, `FallbackChatGenerator`)
    do: `warm_up_async` / `close_async` prefer a part's async method and fall back to its sync one, so a
    `Pipeline.run_async` builds and releases async clients on the loop that uses them.
    """

    _chat_generator: ChatGenerator

    def _wrapped_parts(self) -> list[Any]:
        """The components this one warms up and closes: its chat generator (SummaryVerifier adds its ranker)."""
        return [self._chat_generator]

    def warm_up(self) -> None:
        """Warm up the wrapped chat generator (idempotent)."""
        for part in self._wrapped_parts():
            if hasattr(part, "warm_up"):
                part.warm_up()

    async def warm_up_async(self) -> None:
        """Warm up the wrapped chat generator on the serving event loop (idempotent)."""
        for part in self._wrapped_parts():
            if hasattr(part, "warm_up_async"):
                await part.warm_up_async()
            elif hasattr(part, "warm_up"):
                part.warm_up()

    def close(self) -> None:
        """Release the wrapped chat generator's resources."""
        for part in self._wrapped_parts():
            if hasattr(part, "close"):
                part.close()

    async def close_async(self) -> None:
        """Release the wrapped chat generator's async resources."""
        for part in self._wrapped_parts():
            if hasattr(part, "close_async"):
                await part.close_async()
            elif hasattr(part, "close"):
                part.close()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        """Deserialize this component, with its chat generator, from a dictionary."""
        deserialize_chatgenerator_inplace(data["init_parameters"], key="chat_generator")
        return default_from_dict(cls, data)
