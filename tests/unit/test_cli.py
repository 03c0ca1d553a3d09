import argparse
import json

import pytest

from haystack_fusion import corpus
from haystack_fusion.cli import build_parser, main
from haystack_fusion.testing import ScriptedChatGenerator
from tests.file_server import closed_port_url


def test_strategy_options_parse():
    args = build_parser().parse_args(
        ["ask", "Who?", "--strategy", "sure", "--num-candidates", "3", "--candidate-prompt", "zero-shot"]
    )
    assert (args.num_candidates, args.candidate_prompt, args.parametric_knowledge) == (3, "zero-shot", "on")
    args = build_parser().parse_args(
        ["eval", "--dataset", "x.json", "--out", "o", "--export-notes", "n.jsonl", "--parametric-knowledge", "off"]
    )
    assert (args.export_notes, args.parametric_knowledge, args.note_max_tokens) == ("n.jsonl", "off", None)


def test_strategy_defaults_depend_on_the_llm():
    from haystack_fusion.cli import _strategy_options

    args = build_parser().parse_args(["ask", "Who?", "--strategy", "sure"])
    local = _strategy_options(args, "local")
    assert (local["few_shot"], local["note_generation_kwargs"]) == (True, {"max_tokens": 400})
    assert "few_shot" not in _strategy_options(args, "openai")
    args = build_parser().parse_args(["ask", "Who?", "--candidate-prompt", "zero-shot", "--note-max-tokens", "99"])
    local = _strategy_options(args, "local")
    assert (local["few_shot"], local["note_generation_kwargs"]) == (False, {"max_tokens": 99})


def test_uncertainty_options_parse():
    from haystack_fusion.cli import _backends, _strategy_options

    args = build_parser().parse_args(
        [
            "ask",
            "q",
            "--strategy",
            "cascade",
            "--min-confidence",
            "0.3",
            "--min-vote-share",
            "0.6",
            "--verifier-scoring",
            "text",
            "--llm",
            "openai",
            "--logprobs",
        ]
    )
    options = _strategy_options(args, "openai")
    assert (options["min_confidence"], options["min_vote_share"], options["verifier_scoring"]) == (0.3, 0.6, "text")
    assert _backends(args).logprobs is True


DEMO_SQUAD = {
    "version": "v2.0",
    "data": [
        {
            "title": "Paris",
            "paragraphs": [
                {
                    "context": "Paris is the capital of France.",
                    "qas": [
                        {"id": "a", "question": "What is the capital of France?", "is_impossible": False,
                         "answers": [{"text": "Paris", "answer_start": 0}]},
                        {"id": "u", "question": "What is the capital of Mars?", "is_impossible": True, "answers": []},
                    ],
                }
            ],
        }
    ],
}  # fmt: skip


def test_demo_offline_says_what_to_pass_in_one_line(tmp_path, monkeypatch, capfd):
    monkeypatch.delenv("HAYSTACK_FUSION_SQUAD", raising=False)
    monkeypatch.setattr(corpus, "SQUAD_DEV_URL", closed_port_url())

    status = main(["demo", "--cache-dir", str(tmp_path / "cache"), "--store", str(tmp_path / "demo.json")])

    out, err = capfd.readouterr()
    assert status == 2
    assert out == ""
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"haystack-fusion: cannot download the SQuAD 2.0 dev set from {corpus.SQUAD_DEV_URL} (")
    assert "haystack-fusion demo --dataset PATH" in err
    assert "make demo DATASET=PATH" in err
    assert "$HAYSTACK_FUSION_SQUAD" in err
    assert not (tmp_path / "demo.json").exists()


LOCAL_PATH_HINT = (
    "pass a local SQuAD JSON file: haystack-fusion demo --dataset PATH (in a checkout: make demo DATASET=PATH)"
)


def test_demo_with_an_unreachable_dataset_url_names_a_local_path(tmp_path, capfd):
    url = closed_port_url("/squad.json")

    assert main(["demo", "--dataset", url, "--cache-dir", str(tmp_path)]) == 2

    err = capfd.readouterr().err
    assert err == f"haystack-fusion: cannot download {url} (Connection refused): {LOCAL_PATH_HINT}\n"


def test_demo_store_is_not_the_index_store(monkeypatch, capsys):
    from haystack_fusion.cli import DEFAULT_STORE, DEMO_ES_INDEX, DEMO_STORE, _backends

    monkeypatch.setenv("HAYSTACK_FUSION_STORE", "/tmp/my-index.json")
    demo = _backends(build_parser().parse_args(["demo"]))
    index = _backends(build_parser().parse_args(["index", "data.json"]))

    assert demo.index_path == str(DEMO_STORE.expanduser())
    assert index.index_path == "/tmp/my-index.json"
    monkeypatch.delenv("HAYSTACK_FUSION_STORE")
    assert _backends(build_parser().parse_args(["index", "data.json"])).index_path == str(DEFAULT_STORE.expanduser())
    assert demo.index_path != str(DEFAULT_STORE.expanduser())
    assert (demo.elasticsearch_index, index.elasticsearch_index) == (DEMO_ES_INDEX, "haystack_fusion")
    assert _backends(build_parser().parse_args(["demo", "--store", "/tmp/d.json"])).index_path == "/tmp/d.json"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--help"])
    assert f"(default: {DEMO_STORE}; never the `index` command's" in " ".join(capsys.readouterr().out.split())


def test_demo_leaves_the_index_store_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))  # the default stores are under ~/.cache/haystack_fusion
    monkeypatch.delenv("HAYSTACK_FUSION_STORE", raising=False)
    monkeypatch.setattr("haystack_fusion.backends.config.chat_generator", lambda config: ScriptedChatGenerator("Paris"))
    user_index = tmp_path / ".cache/haystack_fusion/index.json"
    user_index.parent.mkdir(parents=True)
    user_index.write_text("the user's index", encoding="utf-8")
    dataset = tmp_path / "squad.json"
    dataset.write_text(json.dumps(DEMO_SQUAD), encoding="utf-8")

    status = main(["demo", "--dataset", str(dataset), "--strategy", "concatenation", "--questions", "2"])

    assert status == 0
    assert user_index.read_text(encoding="utf-8") == "the user's index"
    assert (tmp_path / ".cache/haystack_fusion/demo-index.json").is_file()
    assert f"into {tmp_path / '.cache/haystack_fusion/demo-index.json'}" in capsys.readouterr().out


class TestIndexCommand:
    def test_index_says_what_it_skipped(self, tmp_path, capsys):
        folder = tmp_path / "docs"
        folder.mkdir()
        (folder / "good.txt").write_text("Paris is the capital of France.", encoding="utf-8")
        (folder / "empty.txt").write_bytes(b"")
        (folder / "latin1.txt").write_bytes(LATIN1)

        assert main(["index", str(folder), "--store", str(tmp_path / "index.json")]) == 0

        out = capsys.readouterr().out
        assert "Indexed 1 passages" in out
        assert out.rstrip().endswith("; skipped 2 files: empty.txt (empty), latin1.txt (not UTF-8)")

    def test_index_of_only_bad_files_exits_2_with_one_line(self, tmp_path, capsys):
        (tmp_path / "latin1.txt").write_bytes(LATIN1)

        assert main(["index", str(tmp_path), "--store", str(tmp_path / "index.json")]) == 2

        err = capsys.readouterr().err
        assert (
            err.strip().splitlines()[-1]
            == f"haystack-fusion: {tmp_path}: no passages found in .txt or .md files (1 skipped)"
        )


LATIN1 = "Caf\u00e9 na\u00efve fa\u00e7ade".encode("latin-1")


def subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (commands,) = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    return dict(commands.choices)


STATED_DEFAULTS = {"--strategies": "all"}
"""Options whose help states their default in words other than its value."""


@pytest.mark.parametrize("command", sorted(subcommand_parsers()))
def test_every_option_states_its_default(command):
    for action in subcommand_parsers()[command]._actions:
        if not action.option_strings or action.required or action.nargs == 0:  # positional, required, a flag
            continue
        option = action.option_strings[-1]
        assert action.help, f"{command} {option} has no help"
        assert "default" in action.help, f"{command} {option}: its help states no default"
        if action.default is not None:
            stated = STATED_DEFAULTS.get(option, str(action.default))
            assert stated in action.help, f"{command} {option}: its help does not name its default {stated!r}"


def test_ask_help_names_the_strategy_and_its_default(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["ask", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--strategy NAME the strategy: concatenation, post_fusion," in text
    assert "(default: concat_pf;" in text


def test_llama_log_is_asked_for(monkeypatch):
    from haystack_fusion.cli import _backends

    monkeypatch.delenv("HAYSTACK_FUSION_LLAMA_LOG", raising=False)
    assert _backends(build_parser().parse_args(["ask", "Who?"])).llama_log is False
    assert _backends(build_parser().parse_args(["ask", "Who?", "--llama-log"])).llama_log is True
    assert _backends(build_parser().parse_args(["demo", "--llama-log"])).llama_log is True


def test_eval_concurrency_is_a_deprecated_name_of_parallel_questions():
    from haystack_fusion.cli import _parallel_questions

    args = build_parser().parse_args(["eval", "--dataset", "d.json", "--out", "o", "--concurrency", "3"])
    with pytest.warns(FutureWarning, match="--concurrency is deprecated.*--parallel-questions"):
        assert _parallel_questions(args, "openai") == 3
    args = build_parser().parse_args(["eval", "--dataset", "d.json", "--out", "o", "--parallel-questions", "2"])
    assert _parallel_questions(args, "openai") == 2
    args = build_parser().parse_args(["eval", "--dataset", "d.json", "--out", "o"])
    assert (_parallel_questions(args, "local"), _parallel_questions(args, "openai")) == (1, 4)


def test_report_target_escalation_is_a_deprecated_name_of_target_fallback():
    from haystack_fusion.cli import _target_fallback

    args = build_parser().parse_args(["report", "runs", "--out", "o", "--target-escalation", "40"])
    with pytest.warns(FutureWarning, match="--target-escalation is deprecated.*--target-fallback"):
        assert _target_fallback(args) == 40
    assert _target_fallback(build_parser().parse_args(["report", "runs", "--out", "o", "--target-fallback", "0"])) == 0
    assert _target_fallback(build_parser().parse_args(["report", "runs", "--out", "o"])) is None
