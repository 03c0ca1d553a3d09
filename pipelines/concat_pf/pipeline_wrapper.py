"""Hayhooks wrapper of `concat_pf`: /concat_pf/run, and model "concat_pf" at /v1/chat/completions."""

from haystack_fusion.hayhooks_wrapper import StrategyPipelineWrapper


class PipelineWrapper(StrategyPipelineWrapper):
    strategy = "concat_pf"
