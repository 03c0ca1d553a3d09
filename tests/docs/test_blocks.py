"""The docs-block collector's parsing (tests/docs/blocks.py): fences, directives, console commands, which pages."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.blocks import DEFAULT_TIMEOUT, Fence, fences, is_docs_page, parse_directives, shell_commands

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
    ],
)
def test_parse_directives(comment, expected):
    assert parse_directives(comment) == {**expected, "timeout": DEFAULT_TIMEOUT}


@pytest.mark.parametrize(
    "comment",
    [
        "<!-- docs-test: skip -->",
        "<!-- docs-test: needs redis -->",
        "<!-- docs-test: timeout soon -->",
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
