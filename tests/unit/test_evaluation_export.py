import json

from haystack import Document

from haystack_fusion.corpus import Question
from haystack_fusion.evaluation.datasets import EvalDataset
from haystack_fusion.evaluation.export import export_notes, training_record
from haystack_fusion.evaluation.metrics import QuestionScore
from haystack_fusion.evaluation.records import (
    EVIDENCE_TEXT_FILE,
    RESULTS_FILE,
    QuestionRecord,
    append_line,
    split_evidence,
)
from haystack_fusion.prompts.chain_of_note import ANSWER_LEAD, STEP_5_UNKNOWN

DOCUMENTS = {
    "p": Document(id="p", content="Paris is the capital of France.", meta={"title": "Paris"}),
    "b": Document(id="b", content="Sourdough bread uses wild yeast.", meta={"title": "Bread"}),
}
NOTES = [
    {"document_id": "p", "note": "Passage #1 says Paris is the capital.", "relevance": "direct"},
    {"document_id": "b", "note": "The passage is about bread.", "relevance": "irrelevant"},
]


def record(
    strategy: str, question_id: str, prediction: str, em: float, answerable: bool = True, notes=NOTES
) -> tuple[QuestionRecord, dict]:
    score = QuestionScore(
        id=question_id,
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
    evidence, text = split_evidence({"notes": notes} if notes is not None else {})
    question_record = QuestionRecord(
        strategy=strategy,
        top_k=2,
        setting="retrieved",
        question_id=question_id,
        answerable=answerable,
        prediction=prediction,
        evidence=evidence,
        passages=["p", "b"],
        score=score,
    )
    return question_record, text


def write_run(folder, records) -> None:
    """A run folder as `Evaluator` writes it: the records, and the note texts beside them."""
    folder.mkdir(parents=True)
    for question_record, text in records:
        append_line(folder / RESULTS_FILE, question_record.to_json())
        if text:
            append_line(folder / EVIDENCE_TEXT_FILE, json.dumps({"key": list(question_record.key()), **text}))


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
    write_run(
        tmp_path / "run",
        [
            record("chain_of_note", "q1", "Paris", 1.0),
            record("chain_of_note", "q2", "Lyon", 0.0),
            record("chain_of_note", "q3", "unknown", 0.0, answerable=False),
            record("concatenation", "q1", "Paris", 1.0, notes=None),
        ],
    )
    questions = [
        Question("q1", "What is the capital of France?", ("Paris",), False, "p"),
        Question("q2", "What is the capital of France, again?", ("Paris",), False, "p"),
        Question("q3", "What is the capital of Mars?", (), True, None),
    ]
    dataset = EvalDataset("capitals", list(DOCUMENTS.values()), questions)
    path = tmp_path / "out" / "notes.jsonl"
    assert "Passage #1 says" not in (tmp_path / "run" / RESULTS_FILE).read_text()  # note texts stay apart
    assert export_notes(tmp_path / "run", dataset, path) == 3
    assert export_notes(tmp_path / "run", dataset, path, correct_only=True, allow_parametric_knowledge=False) == 2
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [line["messages"][1]["content"].rsplit(" ", 1)[-1] for line in lines] == ["Paris", "unknown"]
    assert STEP_5_UNKNOWN in lines[0]["messages"][0]["content"]
