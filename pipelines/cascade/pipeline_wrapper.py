"""Hayhooks wrapper of `cascade`: /cascade/run, and model "cascade" at /v1/chat/completions."""

from haystack_fusion.hayhooks_wrapper import StrategyPipelineWrapper


class PipelineWrapper(StrategyPipelineWrapper):
    strategy = "cascade"
