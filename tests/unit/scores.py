"""
A QuestionScore of a correct answer with changes, shared by the metrics, records and report tests.
"""

from haystack_fusion.evaluation.metrics import (
    QuestionScore,
)
from haystack_fusion.prompts import PROMPTS


def outcome_score(**changes) -> QuestionScore:
    """A score with `changes` over a correct answer's."""
    fields = {
        "id": "q",
        "answerable": True,
        "em": 1.0,
        "f1": 1.0,
        "accuracy": 1.0,
        "unknown": False,
        "pool_has_gold": None,
        "majority_correct": None,
        "retrieval_hit": None,
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "calls": 1,
        "seconds": 0.5,
    }
    return QuestionScore(**{**fields, **changes})


DEMO = PROMPTS["figure7"].demonstrations[-1]
