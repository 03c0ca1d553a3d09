"""
PassageFormatter: the passages block of a prompt as a pipeline component.
"""

import pytest
from haystack import Document
from haystack.core.serialization import component_from_dict, component_to_dict

from haystack_fusion.components import PassageFormatter
from haystack_fusion.prompts import (
    DEFAULT_MAX_PASSAGE_CHARS,
    format_passages,
)


class TestPassageFormatter:
    def test_run(self):
        documents = [Document(content="Paris is in France."), Document(content="Lyon too.")]
        assert PassageFormatter().run(documents=documents) == {"passages": format_passages(documents)}
        assert PassageFormatter(max_passage_chars=5).run(documents=documents) == {
            "passages": format_passages(documents, max_chars=5)
        }

    def test_serialization(self):
        formatter = PassageFormatter(max_passage_chars=None)
        data = component_to_dict(formatter, "formatter")
        assert data == {
            "type": "haystack_fusion.components.concatenation.PassageFormatter",
            "init_parameters": {"max_passage_chars": None, "layout": "numbered", "datamark": False},
        }
        assert component_from_dict(PassageFormatter, data, "formatter").max_passage_chars is None
        assert component_to_dict(PassageFormatter(), "formatter")["init_parameters"] == {
            "max_passage_chars": DEFAULT_MAX_PASSAGE_CHARS,
            "layout": "numbered",
            "datamark": False,
        }
        titled = component_to_dict(PassageFormatter(layout="titled"), "formatter")
        assert component_from_dict(PassageFormatter, titled, "formatter").layout == "titled"

    def test_invalid_layout(self):
        with pytest.raises(ValueError, match="layout"):
            PassageFormatter(layout="fancy")  # type: ignore[arg-type]

    def test_invalid(self):
        with pytest.raises(ValueError, match="max_passage_chars"):
            PassageFormatter(max_passage_chars=0)
