"""The `RunSettings` an evaluation would fingerprint a strategy's records with, for tests of fingerprints."""

from haystack.components.generators.chat import MockChatGenerator

from haystack_fusion.evaluation.datasets import EvalDataset
from haystack_fusion.evaluation.passages import PassageSetting
from haystack_fusion.evaluation.records import RunSettings
from haystack_fusion.evaluation.runner import EvalConfig, Evaluator


def run_settings(strategy: str, options: dict, top_k: int = 5) -> RunSettings:
    """
    The settings of `strategy` at `top_k` under `strategy_options=options` (no dataset, a mock LLM).

    :param strategy: A registered strategy.
    :param options: `EvalConfig.strategy_options` (`StrategyConfig` fields).
    :param top_k: Passages retrieved.
    :returns: `Evaluator.settings(...)`; `.fingerprint()` is what its records would carry.
    """
    evaluator = Evaluator(
        EvalDataset(name="pin", documents=[], questions=[]),
        EvalConfig(strategies=[strategy], strategy_options=options),
        "unused",
        retriever_factory=lambda: None,
        generator_factory=lambda: None,
    )
    return evaluator.settings(strategy, top_k, PassageSetting(), MockChatGenerator(responses=["a"]))
