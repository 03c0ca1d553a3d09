"""Hayhooks wrapper of `sure`: /sure/run, and model "sure" at /v1/chat/completions."""

from haystack_fusion.hayhooks_wrapper import StrategyPipelineWrapper


class PipelineWrapper(StrategyPipelineWrapper):
    strategy = "sure"
