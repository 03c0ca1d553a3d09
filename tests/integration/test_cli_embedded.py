"""The `haystack-fusion` command for real: index the SQuAD 2.0 dev subset, ask with the embedded model."""

from __future__ import annotations

import json

import pytest

from haystack_fusion.cli import main
from haystack_fusion.corpus import default_squad_path


@pytest.fixture
def store_path(tmp_path, squad):
    path = tmp_path / "index.json"
    assert main(["index", str(default_squad_path()), "--store", str(path)]) == 0
    return path


def test_index_then_ask_prints_answer_evidence_sources_and_cost(store_path, llm, questions, capsys):
    capsys.readouterr()
    question = questions[1].question
    assert main(["ask", question, "--strategy", "concat_pf", "--top-k", "3", "--store", str(store_path)]) == 0
    out = capsys.readouterr().out
    for heading in ("Question:", "Answer:", "Evidence: fallback fired:", "Sources (top-3):", "LLM:", "Time:"):
        assert heading in out
    assert out.count("\n  [") == 3


def test_ask_json_for_post_fusion_has_votes(store_path, llm, questions, capsys):
    capsys.readouterr()
    args = ["ask", questions[0].question, "--strategy", "post_fusion", "--json", "--store", str(store_path)]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["usage"]["calls"] == 5
    assert sum(result["evidence"]["votes"].values()) <= 5
    assert len(result["sources"]) == 5


def test_demo_answers_a_handful(tmp_path, squad, llm, capsys):
    assert main(["demo", "--questions", "2", "--store", str(tmp_path / "demo.json")]) == 0
    out = capsys.readouterr().out
    assert out.count("Question:") == 2
    assert "Gold:" in out


def test_bad_input_exits_2_with_the_reason(store_path, capsys):
    assert main(["ask", "   ", "--store", str(store_path)]) == 2
    assert "`query` must be a non-empty question" in capsys.readouterr().err
    assert main(["ask", "Who?", "--store", str(store_path.parent / "missing.json")]) == 2
    assert "haystack-fusion index" in capsys.readouterr().err


def test_hybrid_index_is_idempotent_and_answers(tmp_path, squad, llm, questions, capsys):
    pytest.importorskip("haystack_integrations.components.embedders.sentence_transformers", reason="the `dense` extra")
    path = str(tmp_path / "hybrid.json")
    for _ in range(2):
        assert main(["index", str(default_squad_path()), "--store", path, "--retriever", "hybrid"]) == 0
        assert f"({len(squad[0])} in the store)" in capsys.readouterr().out
    question = questions[2].question
    assert (
        main(["ask", question, "--strategy", "concatenation", "--retriever", "hybrid", "--store", path, "--json"]) == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert len(result["sources"]) == 5
    assert result["answer"]


def test_ask_cascade_shows_confidence_and_stages(store_path, llm, questions, capsys):
    """The embedded model returns token log-probabilities, so the cascade's first answer carries a confidence."""
    capsys.readouterr()
    question = questions[0].question
    args = ["ask", question, "--strategy", "cascade", "--top-k", "3", "--store", str(store_path), "--json"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    stages = result["evidence"]["stages"]
    assert stages[0]["stage"] == "concatenation"
    assert stages[-1]["answered"] is True
    assert all("reason" in stage for stage in stages[:-1])
    assert result["evidence"]["confidence"] is None or 0.0 <= result["evidence"]["confidence"] <= 1.0
    assert result["usage"]["calls"] >= 1
    # the first stage's reply carried log-probabilities: a fallback says why, an answer has its confidence
    assert stages[-1]["stage"] != "concatenation" or result["evidence"]["confidence"] is not None
