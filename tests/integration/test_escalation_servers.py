"""
A small model first and a strong one for the fallback rounds, each behind its own OpenAI-compatible server on
127.0.0.1, through `haystack-fusion eval` and `ask` with the real `OpenAIChatGenerator`: only the questions the small
model passes on reach the strong one, and the records, the report and `ask --json` count each model's calls.
"""

from __future__ import annotations

import json
from typing import Any

from haystack_fusion.cli import main
from haystack_fusion.corpus import default_squad_path
from haystack_fusion.evaluation.records import RESULTS_FILE, read_records
from tests.support.openai_server import OpenAIServer

TOP_K = 2


def question_of(body: dict[str, Any]) -> str:
    """The question of a Figure 7 prompt: the text after its last "Question:"."""
    text = body["messages"][-1]["content"]
    return text.rsplit("Question:", 1)[-1].split("\n", 1)[0].strip()


def small_reply(body: dict[str, Any]) -> str:
    """Unsure of every question with an even number of characters: it says unknown."""
    return "unknown" if len(question_of(body)) % 2 == 0 else "Rollo"


def flags(small: OpenAIServer, strong: OpenAIServer) -> list[str]:
    return [
        "--llm", "openai", "--model", "small", "--api-base-url", small.base_url,
        "--fallback-llm", "openai", "--fallback-model", "strong", "--fallback-api-base-url", strong.base_url,
        "--top-k", str(TOP_K), "--max-retries", "0", "--timeout", "60",
    ]  # fmt: skip


def test_eval_sends_only_the_passed_on_questions_to_the_strong_server(squad, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", "not-needed-by-a-local-server")
    with OpenAIServer(reply=small_reply, model="small") as small, OpenAIServer(reply="Rollo", model="strong") as strong:
        out = tmp_path / "cascade"
        args = ["eval", "--dataset", str(default_squad_path()), "--strategies", "concatenation,concat_pf"]
        args += ["--sample", "6", "--price", "small=0.1,0.2", "--price", "strong=1,2", "--out", str(out)]
        assert main([*args, *flags(small, strong)]) == 0
        records = read_records(out / RESULTS_FILE)
        passed_on = [r for r in records if r.strategy == "concat_pf" and r.evidence["fallback"]]
        assert 0 < len(passed_on) < 6
        # the strong server answered post-fusion's k calls of each passed-on question, and nothing else
        assert strong.stats.first_attempts == TOP_K * len(passed_on)
        for record in records:
            by_model = record.evidence["usage_by_model"]
            expected = {"small", "strong"} if record in passed_on else {"small"}
            assert set(by_model) == expected, record.question_id
        report = (out / "results.md").read_text()
        assert "fallback: openai strong" in report.splitlines()[0]
        assert "| strong |" in report  # the calls and tokens per model table

        capsys.readouterr()
        question = "Who was the duke in the battle of Hastings?"
        store = ["--store", str(tmp_path / "index.json")]
        assert main(["index", str(default_squad_path()), *store]) == 0
        capsys.readouterr()
        assert main(["ask", question, "--strategy", "concat_pf", "--json", *store, *flags(small, strong)]) == 0
        run = json.loads(capsys.readouterr().out)
        assert set(run["usage_by_model"]) == ({"small", "strong"} if len(question) % 2 == 0 else {"small"})
