"""Hayhooks wrapper of `chain_of_note`: /chain_of_note/run, and model "chain_of_note" at /v1/chat/completions."""

from haystack_fusion.hayhooks_wrapper import StrategyPipelineWrapper


class PipelineWrapper(StrategyPipelineWrapper):
    strategy = "chain_of_note"
