"""
The strategy registry: names in paper order, lookup and the errors that list the names.
"""

import pytest
from haystack.components.generators.chat import MockChatGenerator

import haystack_fusion  # noqa: F401  (allowlists the package for deserialization)
from haystack_fusion.strategies import (
    STRATEGIES,
    Strategy,
    get_strategy,
)
from tests.unit.scripted_pipelines import (
    make_pipeline,
)


class TestRegistry:
    def test_names_in_paper_order(self):
        assert list(STRATEGIES) == [
            "concatenation",
            "post_fusion",
            "pruning",
            "summary_cot",
            "concat_pf",
            "pf_concat",
            "cascade",
            "base",
            "sure",
            "sure_rank_only",
            "sure_sum_all",
            "mcq",
            "generic_summary",
            "chain_of_note",
            "chain_of_note_per_document",
        ]

    @pytest.mark.parametrize("name", list(STRATEGIES))
    def test_get_strategy(self, name):
        strategy = get_strategy(name)
        assert isinstance(strategy, Strategy)
        assert strategy.name == name
        paper_002 = {"base", "sure", "sure_rank_only", "sure_sum_all", "mcq", "generic_summary"}
        paper = "Kim et al." if name in paper_002 else "Yu et al." if name.startswith("chain_of_note") else "Liu et al."
        assert strategy.source.startswith(paper)

    def test_unknown_strategy_lists_names(self):
        with pytest.raises(ValueError, match="nope") as error:
            get_strategy("nope")
        for name in STRATEGIES:
            assert name in str(error.value)

    def test_build_pipeline_unknown_strategy(self):
        with pytest.raises(ValueError, match="registered strategies"):
            make_pipeline("nope", MockChatGenerator(responses="Paris"))
