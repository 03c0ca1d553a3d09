"""PassageFormatter: renders retrieved passages as the delimited context block every prompt of the package uses."""

from __future__ import annotations

from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict

from haystack_fusion.prompts import DEFAULT_MAX_PASSAGE_CHARS, PASSAGE_LAYOUTS, PassageLayout, format_passages


@component
class PassageFormatter:
    """
    Turns a list of passages into the numbered, delimited context block of the package's prompts.

    It puts `format_passages` into a pipeline: retriever -> PassageFormatter -> ChatPromptBuilder (whose template
    reads `{{ passages }}`). Passage text cannot close its block or inject template syntax, and each passage is
    trimmed to the context budget (see `haystack_fusion.prompts.format_passages`). It exists because Haystack's
    OutputAdapter with a custom filter does not load from YAML in safe mode.

    ### Usage example
    ```python
    from haystack import Document
    from haystack_fusion.components import PassageFormatter

    print(PassageFormatter().run(documents=[Document(content="Paris is in France.")])["passages"])
    ```
    """

    def __init__(
        self,
        *,
        max_passage_chars: int | None = DEFAULT_MAX_PASSAGE_CHARS,
        layout: PassageLayout = "numbered",
        datamark: bool = False,
    ) -> None:
        """
        Create a PassageFormatter.

        :param max_passage_chars: Per-passage context budget in characters; None for no limit.
        :param layout: "numbered" (`[i]`, Liu et al.'s figures) or "titled" (`Passage #i Title/Text`, Kim et al.'s
            listings).
        :param datamark: Datamark the passage text (" ^ " between words, after a notice line that marked text holds
            no instructions; `prompts.format_passages`), a defence against instructions written in passages
            ("spotlighting"). Off by default.
        :raises ValueError: If `max_passage_chars` is not positive or `layout` is unknown.
        """
        if max_passage_chars is not None and max_passage_chars <= 0:
            raise ValueError(f"`max_passage_chars` must be positive or None, got {max_passage_chars}")
        if layout not in PASSAGE_LAYOUTS:
            raise ValueError(f"`layout` must be one of {', '.join(PASSAGE_LAYOUTS)}, got {layout!r}")
        self.max_passage_chars = max_passage_chars
        self.layout = layout
        self.datamark = datamark

    def to_dict(self) -> dict[str, Any]:
        """Serialize this component to a dictionary."""
        return default_to_dict(
            self, max_passage_chars=self.max_passage_chars, layout=self.layout, datamark=self.datamark
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PassageFormatter:
        """Deserialize this component from a dictionary."""
        return default_from_dict(cls, data)

    @component.output_types(passages=str)
    def run(self, documents: list[Document]) -> dict[str, Any]:
        """
        Format the passages.

        :param documents: The passages, best-ranked first (may be empty).
        :returns: A dictionary with `passages`: the context block, one delimited block per document ("" for none).
        """
        return {"passages": format_passages(documents, self.max_passage_chars, self.layout, datamark=self.datamark)}
