"""The package's Haystack components: the concatenation stage's in `concatenation`, the others one file each."""

from haystack_fusion.components.candidate_summarizer import CandidateSummarizer
from haystack_fusion.components.concatenation import AbstainingChatGenerator, CheckedAnswerBuilder, PassageFormatter
from haystack_fusion.components.note_taker import NoteTaker
from haystack_fusion.components.post_fusion_voter import PostFusionVoter
from haystack_fusion.components.speculation import PostFusionSpeculator
from haystack_fusion.components.split_vote_router import SplitVoteRouter
from haystack_fusion.components.summary_verifier import SummaryVerifier
from haystack_fusion.components.unknown_router import UnknownRouter

__all__ = [
    "AbstainingChatGenerator",
    "CandidateSummarizer",
    "CheckedAnswerBuilder",
    "NoteTaker",
    "PassageFormatter",
    "PostFusionSpeculator",
    "PostFusionVoter",
    "SplitVoteRouter",
    "SummaryVerifier",
    "UnknownRouter",
]
