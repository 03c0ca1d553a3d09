"""`haystack-fusion eval` for real: the embedded model on the first questions of the SQuAD 2.0 dev subset."""

from __future__ import annotations

from haystack_fusion.cli import main
from haystack_fusion.corpus import default_squad_path
from haystack_fusion.evaluation.runner import RESULTS_FILE, read_records


def test_eval_is_deterministic_and_resumes(tmp_path, squad, llm, capsys):
    dataset = str(default_squad_path())
    args = ["eval", "--dataset", dataset, "--strategies", "concatenation", "--limit", "3"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b"), "--concurrency", "2"]) == 0
    first, second = (read_records(tmp_path / run / RESULTS_FILE) for run in ("a", "b"))
    assert len(first) == 3
    assert {r.question_id: r.prediction for r in first} == {r.question_id: r.prediction for r in second}
    lines = (tmp_path / "a" / RESULTS_FILE).read_text().splitlines()
    assert main([*args, "--out", str(tmp_path / "a")]) == 0  # resume: nothing left to ask
    assert (tmp_path / "a" / RESULTS_FILE).read_text().splitlines() == lines
    assert "| concatenation | 5 |" in capsys.readouterr().out
    assert (tmp_path / "a" / "em_vs_tokens.png").is_file()
