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
    """

    _chat_generator: ChatGenerator

    def warm_up(self) -> None:
        """Warm up the wrapped chat generator (idempotent)."""
        if hasattr(self._chat_generator, "warm_up"):
            self._chat_generator.warm_up()

    def close(self) -> None:
        """Release the wrapped chat generator's resources."""
        if hasattr(self._chat_generator, "close"):
            self._chat_generator.close()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        """Deserialize this component, with its chat generator, from a dictionary."""
        deserialize_chatgenerator_inplace(data["init_parameters"], key="chat_generator")
        return default_from_dict(cls, data)
