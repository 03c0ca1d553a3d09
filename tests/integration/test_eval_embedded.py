"""`haystack-fusion eval` for real: the embedded model on the first questions of the SQuAD 2.0 dev subset."""

from __future__ import annotations

from haystack_fusion.cli import main
from haystack_fusion.corpus import default_squad_path
from haystack_fusion.evaluation.records import RESULTS_FILE, read_records


def test_eval_is_deterministic_and_resumes(tmp_path, squad, llm, capsys):
    dataset = str(default_squad_path())
    args = ["eval", "--dataset", dataset, "--strategies", "concatenation", "--limit", "3"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b"), "--parallel-questions", "2"]) == 0
    first, second = (read_records(tmp_path / run / RESULTS_FILE) for run in ("a", "b"))
    assert len(first) == 3
    assert {r.question_id: r.prediction for r in first} == {r.question_id: r.prediction for r in second}
    lines = (tmp_path / "a" / RESULTS_FILE).read_text().splitlines()
    assert main([*args, "--out", str(tmp_path / "a")]) == 0  # resume: nothing left to ask
    assert (tmp_path / "a" / RESULTS_FILE).read_text().splitlines() == lines
    assert "| concatenation | 5 |" in capsys.readouterr().out
    assert (tmp_path / "a" / "em_vs_tokens.png").is_file()


def test_eval_settings_on_the_real_subset(tmp_path, squad, llm):
    """Gold passage first, a noise ratio and the closed-book filter, end to end with the embedded model."""
    dataset = str(default_squad_path())
    base = ["eval", "--dataset", dataset, "--strategies", "concatenation", "--limit", "4", "--top-k", "3"]
    assert main([*base, "--gold-passage", "first", "--out", str(tmp_path / "gold")]) == 0
    gold_by_question = {q.id: q.gold_document_id for q in squad[1][:4]}
    for record in read_records(tmp_path / "gold" / RESULTS_FILE):
        assert record.passages[0] == gold_by_question[record.question_id]
        assert len(record.passages) == 3
    assert main([*base, "--noise-ratio", "0.67", "--out", str(tmp_path / "noise")]) == 0
    documents = {d.id: d.content or "" for d in squad[0]}
    golds = {q.id: q.answers for q in squad[1]}
    for record in read_records(tmp_path / "noise" / RESULTS_FILE):
        if record.answerable:
            gold = golds[record.question_id]
            with_answer = [p for p in record.passages if any(g.lower() in documents[p].lower() for g in gold)]
            assert len(record.passages) - len(with_answer) == 2  # round(3 * 0.67) irrelevant passages
    assert main([*base, "--closed-book-filter", "--out", str(tmp_path / "closed")]) == 0
    closed_book = read_records(tmp_path / "closed" / "closed_book.jsonl")
    assert closed_book
    assert all(record.passages == [] for record in closed_book)
