import json

from haystack import Document

from haystack_fusion.components.note_taker import training_record
from haystack_fusion.evaluation.export import export_notes
from haystack_fusion.evaluation.metrics import QuestionScore
from haystack_fusion.evaluation.runner import QuestionRecord
from haystack_fusion.prompts.chain_of_note import ANSWER_LEAD, STEP_5_UNKNOWN

DOCUMENTS = {
    "p": Document(id="p", content="Paris is the capital of France.", meta={"title": "Paris"}),
    "b": Document(id="b", content="Sourdough bread uses wild yeast.", meta={"title": "Bread"}),
}
NOTES = [
    {"document_id": "p", "note": "Passage #1 says Paris is the capital.", "relevance": "direct"},
    {"document_id": "b", "note": "The passage is about bread.", "relevance": "irrelevant"},
]


def record(strategy: str, prediction: str, em: float, answerable: bool = True, notes=NOTES) -> QuestionRecord:
    score = QuestionScore(
        id="q1",
        answerable=answerable,
        em=em,
        f1=em,
        accuracy=em,
        unknown=prediction == "unknown",
        pool_has_gold=None,
        majority_correct=None,
        retrieval_hit=None,
        prompt_tokens=10,
        completion_tokens=5,
        calls=1,
        seconds=0.1,
    )
    evidence = {"notes": notes} if notes is not None else {}
    return QuestionRecord(
        strategy=strategy,
        top_k=2,
        setting="retrieved",
        question_id="q1",
        question="What is the capital of France?",
        gold=["Paris"] if answerable else [],
        answerable=answerable,
        prediction=prediction,
        evidence=evidence,
        passages=["p", "b"],
        score=score,
    )


def test_training_record_format():
    example = training_record("What is the capital of France?", list(DOCUMENTS.values()), NOTES, "Paris")
    user, assistant = example["messages"]
    assert (user["role"], assistant["role"]) == ("user", "assistant")
    assert user["content"].endswith("Reading notes:")
    assert "Passage #1 Title: Paris" in user["content"]
    assert assistant["content"] == (
        f"Passage #1 says Paris is the capital. Passage #2: The passage is about bread. {ANSWER_LEAD} Paris"
    )


def test_export_skips_records_without_notes_and_filters_correct(tmp_path):
    records = [
        record("chain_of_note", "Paris", 1.0),
        record("chain_of_note", "Lyon", 0.0),
        record("chain_of_note", "unknown", 0.0, answerable=False),
        record("concatenation", "Paris", 1.0, notes=None),
    ]
    path = tmp_path / "out" / "notes.jsonl"
    assert export_notes(records, DOCUMENTS, path) == 3
    assert export_notes(records, DOCUMENTS, path, correct_only=True, allow_parametric_knowledge=False) == 2
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [line["messages"][1]["content"].rsplit(" ", 1)[-1] for line in lines] == ["Paris", "unknown"]
    assert STEP_5_UNKNOWN in lines[0]["messages"][0]["content"]
