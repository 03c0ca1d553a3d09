"""
haystack-fusion: Haystack components that combine retrieved passages with an LLM.

Strategies from three papers: post-fusion as fallback and its relatives (Liu et al.), SuRe (Kim et al.) and
Chain-of-Note (Yu et al.). Importing the package admits its own modules to Haystack's deserialization allowlist,
so YAML pipelines that use its components load with `Pipeline.loads`.
"""

from haystack.core.serialization_security import allow_deserialization_module

from haystack_fusion.__about__ import __version__
from haystack_fusion.components import (
    AbstainingChatGenerator,
    CandidateSummarizer,
    CheckedAnswerBuilder,
    NoteTaker,
    PassageFormatter,
    PostFusionVoter,
    SummaryVerifier,
    UnknownRouter,
)
from haystack_fusion.strategies import FusionAnswerer

allow_deserialization_module("haystack_fusion")

__all__ = [
    "AbstainingChatGenerator",
    "CandidateSummarizer",
    "CheckedAnswerBuilder",
    "FusionAnswerer",
    "NoteTaker",
    "PassageFormatter",
    "PostFusionVoter",
    "SummaryVerifier",
    "UnknownRouter",
    "__version__",
]
