"""The docs-block collector's parsing (tests/docs/blocks.py): fences, directives, console commands, which pages."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.blocks import (
    HANG_GUARD,
    MODEL_COMMAND_GUARD,
    Fence,
    count_model_commands,
    fences,
    is_docs_page,
    parse_directives,
    shell_commands,
)

PAGE = """# A page

<!-- docs-test: skip starts a server; it runs until stopped -->
```bash
serve
```

<!-- docs-test: needs openai-server; timeout 30 -->
```python
x = 1
```

```python continuation
print(x)
```

```text
output
```

<!-- a comment of the author's own -->
```console
$ echo one \\
  two
one two
$ echo three
three
```
"""


def test_fences_carry_their_directives():
    found = fences(PAGE)
    assert [(f.language, f.words, f.line) for f in found] == [
        ("bash", (), 4),
        ("python", (), 9),
        ("python", ("continuation",), 13),
        ("text", (), 17),
        ("console", (), 22),
    ]
    assert found[0].skip == "starts a server; it runs until stopped"
    assert found[1].needs == ("openai-server",)
    assert found[1].timeout == 30
    assert found[1].hang_guard == HANG_GUARD  # a timeout only ever raises the guard
    assert found[2].needs == ("openai-server",)  # a continuation runs the previous block's code again
    assert found[4].skip is None
    assert found[4].needs == ()
    assert [f.is_python or f.is_shell for f in found] == [True, True, True, False, True]


def test_a_comment_must_be_right_before_the_fence():
    assert fences("<!-- docs-test: skip far -->\n\ntext\n\n```bash\nls\n```\n")[0].skip is None


@pytest.mark.parametrize(
    ("comment", "expected"),
    [
        ("<!-- docs-test: needs elasticsearch -->", {"skip": None, "needs": ("elasticsearch",)}),
        ("<!-- docs-test: needs ollama; needs squad -->", {"skip": None, "needs": ("ollama", "squad")}),
        ("<!--docs-test:skip  a\n  reason -->", {"skip": "a reason", "needs": ()}),
        ("<!-- docs-test: timeout 7200 -->", {"skip": None, "needs": (), "timeout": 7200.0}),
        ("<!-- docs-test: needs squad; model-commands 4 -->", {"skip": None, "needs": ("squad",), "model_commands": 4}),
    ],
)
def test_parse_directives(comment, expected):
    assert parse_directives(comment) == {"timeout": None, "model_commands": None, **expected}


@pytest.mark.parametrize(
    "comment",
    [
        "<!-- docs-test: skip -->",
        "<!-- docs-test: needs redis -->",
        "<!-- docs-test: timeout soon -->",
        "<!-- docs-test: model-commands many -->",
        "<!-- docs-test: model-commands -1 -->",
        "<!-- docs-test: run -->",
    ],
)
def test_malformed_directives_fail_collection(comment):
    with pytest.raises(ValueError, match="unknown docs-test directive"):
        parse_directives(comment)


def test_console_blocks_run_only_their_commands():
    console = fences(PAGE)[4]
    assert shell_commands(console) == "echo one \\\n  two\necho three\n"
    bash = Fence(language="bash", words=(), line=1, source="ls\n$ not a prompt\n")
    assert shell_commands(bash) == bash.source


def test_pages(tmp_path: Path):
    assert is_docs_page(tmp_path / "README.md", tmp_path)
    assert is_docs_page(tmp_path / "docs/backends/ollama.md", tmp_path)
    assert not is_docs_page(tmp_path / "research/notes/x.md", tmp_path)
    assert not is_docs_page(tmp_path / "docs/conf.py", tmp_path)
    assert not is_docs_page(tmp_path / "sub/README.md", tmp_path)


def bash(source: str, **directives) -> Fence:
    return Fence(language="bash", words=(), line=1, source=source, **directives)


@pytest.mark.parametrize(
    ("script", "count"),
    [
        ("ls docs\n", 0),
        ("haystack-fusion index docs\nhaystack-fusion strategies\nhaystack-fusion pipelines --out p\n", 0),
        ('haystack-fusion ask "Why?"\n', 1),
        ('.venv/bin/haystack-fusion ask "A?" --strategy concat_pf\nhaystack-fusion ask "B?" \\\n  --top-k 3\n', 2),
        ("haystack-fusion demo --questions 2 && haystack-fusion eval --dataset d.json --out run\n", 2),
        ("make demo DATASET=squad.json\n", 1),
        ('# haystack-fusion ask "commented out"\nmy-haystack-fusion ask x\n', 0),
    ],
)
def test_commands_that_call_an_llm_are_counted(script, count):
    assert count_model_commands(script) == count


def test_the_hang_guard_grows_with_the_commands_that_call_an_llm():
    index_and_ask = (
        'haystack-fusion index docs\nhaystack-fusion ask "A?"\nhaystack-fusion ask "B?"\nhaystack-fusion ask "C?"\n'
    )
    assert bash("ls\n").hang_guard == HANG_GUARD
    assert bash(index_and_ask).hang_guard == HANG_GUARD + 3 * MODEL_COMMAND_GUARD
    assert bash("./my-script.sh\n", model_commands=2).hang_guard == HANG_GUARD + 2 * MODEL_COMMAND_GUARD
    assert bash(index_and_ask, model_commands=0).hang_guard == HANG_GUARD
    assert bash(index_and_ask, timeout=30).hang_guard == HANG_GUARD + 3 * MODEL_COMMAND_GUARD
    assert bash("ls\n", timeout=7200).hang_guard == 7200
    console = Fence(language="console", words=(), line=1, source='$ haystack-fusion ask "A?"\nhaystack-fusion ask\n')
    assert console.hang_guard == HANG_GUARD + MODEL_COMMAND_GUARD  # output lines are not commands


def test_the_hang_guard_is_minutes_per_llm_command():
    assert HANG_GUARD >= 300
    assert MODEL_COMMAND_GUARD >= 300  # the embedded model takes 5-60 s a call on a busy 2-core machine


def test_the_guide_blocks_that_ask_the_embedded_model_have_minutes_per_question():
    page = (Path(__file__).resolve().parents[2] / "docs/cli.md").read_text(encoding="utf-8")
    asking = [f for f in fences(page) if f.is_shell and not f.skip and count_model_commands(shell_commands(f))]
    assert asking
    for fence in asking:
        assert fence.hang_guard >= HANG_GUARD + MODEL_COMMAND_GUARD * count_model_commands(shell_commands(fence))
