"""
The code blocks of README.md and docs/**/*.md as tests (a pytest plugin, loaded by the root `conftest.py`).

Python fences (`python`, `py`, `python3`) run through pytest-markdown-docs (its `continuation` word keeps the
previous Python block's names); shell fences (`bash`, `sh`, `shell`, `console`) run here, with bash, one session per
page: the working directory, files and exported variables carry over from one shell block of the page to the next.
Each page runs, in document order, in a temp directory holding copies of the repository's `docs/`, `pipelines/` and
`README.md`, with its own `HOME` (so `~/.cache/haystack_fusion`) and caches, so no block touches `~/.cache`.

Directives go in an HTML comment on the line right before a fence (`<!-- docs-test: skip starts a server -->`),
separated by `;`: `skip REASON`, `needs openai-server` (a local `tests.support.openai_server`, no model,
with `OPENAI_BASE_URL`, `OPENAI_API_KEY` and `HAYSTACK_FUSION_LLM=openai` set), `needs elasticsearch` (runs when
`ELASTICSEARCH_URL` is set), `needs ollama` (runs when `OLLAMA_HOST` is set), `needs squad` (a SQuAD 2.0 file:
$HAYSTACK_FUSION_SQUAD, else the subset in ../shared), `model-commands N` and `timeout SECONDS` (below).
docs/design.md ("Testing") describes the convention for docs authors.

A shell block that runs past its hang guard is stopped and fails. The guard catches a block that hangs; it is no
budget, so it sits far above any normal run, on a busy machine too: `HANG_GUARD` (10 minutes) plus
`MODEL_COMMAND_GUARD` (10 minutes) for each command that calls an LLM, which the embedded model answers in 5 to 60 s
a call. Those commands are counted in the block's text (`haystack-fusion ask|demo|eval`, `make demo`:
`count_model_commands`); `model-commands N` gives the number instead, for commands the text does not show (a loop, a
script). `timeout SECONDS` raises the guard of a block that needs more still (a long evaluation); it never lowers it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt
from pytest_markdown_docs.definitions import FenceTestDefinition
from pytest_markdown_docs.plugin import MarkdownInlinePythonItem, MarkdownTextFile

from haystack_fusion.settings import SQUAD_VARIABLE

ROOT = Path(__file__).resolve().parents[2]
PYTHON_LANGUAGES = frozenset({"py", "python", "python3"})
SHELL_LANGUAGES = frozenset({"bash", "sh", "shell", "console"})
SERVERS = {"elasticsearch": "ELASTICSEARCH_URL", "ollama": "OLLAMA_HOST"}
"""`needs NAME` for a server the tests do not start: the variable that must point at it."""
SHARED_SQUAD = ROOT.parent / "shared/data/squad2-dev-subset/squad2_dev_subset.json"
"""`needs squad`: a SQuAD 2.0 file at $HAYSTACK_FUSION_SQUAD, else this subset beside the checkout."""
HANG_GUARD = 600.0
"""Seconds any shell block may run before it counts as hung (`Fence.hang_guard`)."""
MODEL_COMMAND_GUARD = 600.0
"""Seconds more per command of the block that calls an LLM (`count_model_commands`)."""
MODEL_COMMAND = re.compile(r"(?<![\w.-])(?:haystack-fusion\s+(?:ask|demo|eval)|make\s+demo)\b")
"""A command that calls an LLM: `haystack-fusion ask|demo|eval` (any path before it, `.venv/bin/...`) or `make demo`."""
COPIED = ("docs", "pipelines", "README.md")
"""What each page's working directory holds, copied from the repository (blocks use `docs`, `pipelines/yaml/...`);
`.venv` is a link to the repository's (blocks run `.venv/bin/haystack-fusion` as a checkout would)."""
UNSET = ("HAYSTACK_FUSION_STORE", "HAYSTACK_FUSION_LLM", "HAYSTACK_FUSION_DOCUMENT_STORE", "OPENAI_BASE_URL")
"""Variables of the developer's environment the blocks must not see: each page starts from the defaults."""
DIRECTIVE = re.compile(r"<!--\s*docs-test:(?P<body>.*?)-->", re.DOTALL)


@dataclass(frozen=True)
class Fence:
    """
    One fenced code block of a Markdown page.

    :param language: The info string's first word, lowercased (`""` when untagged).
    :param words: The info string's other words (`continuation`, `notest`, ...).
    :param line: The 1-based line of the opening fence (pytest-markdown-docs' `start_line`).
    :param source: The block's text.
    :param skip: The reason of a `skip` directive, else None.
    :param needs: The servers of `needs` directives (`openai-server`, `elasticsearch`, `ollama`).
    :param timeout: A `timeout` directive's seconds, else None.
    :param model_commands: A `model-commands` directive's number, else None (counted from the text).
    """

    language: str
    words: tuple[str, ...]
    line: int
    source: str
    skip: str | None = None
    needs: tuple[str, ...] = ()
    timeout: float | None = None
    model_commands: int | None = None

    @property
    def hang_guard(self) -> float:
        """
        Seconds a shell block may run before it counts as hung: `HANG_GUARD` plus `MODEL_COMMAND_GUARD` per command
        that calls an LLM (`model_commands`, else `count_model_commands`), or the `timeout` directive's seconds when
        that is more.
        """
        commands = self.model_commands
        if commands is None:
            commands = count_model_commands(shell_commands(self))
        return max(HANG_GUARD + MODEL_COMMAND_GUARD * commands, self.timeout or 0.0)

    @property
    def is_python(self) -> bool:
        return self.language in PYTHON_LANGUAGES

    @property
    def is_shell(self) -> bool:
        return self.language in SHELL_LANGUAGES


def parse_directives(comment: str) -> dict[str, Any]:
    """
    The directives of a `<!-- docs-test: ... -->` comment.

    :param comment: The comment's text (an HTML block).
    :returns: `{"skip": str | None, "needs": tuple[str, ...], "timeout": float | None, "model_commands": int |
        None}`.
    :raises ValueError: For an unknown directive, an unknown server, a `skip` without a reason, a bad timeout or a
        bad number of model commands.
    """
    found: dict[str, Any] = {"skip": None, "needs": (), "timeout": None, "model_commands": None}
    match = DIRECTIVE.search(comment)
    if match is None:
        return found
    parts = re.split(r";\s*(?=(?:skip|needs|timeout|model-commands)\b)", match.group("body"))  # a reason may hold ";"
    for part in parts:
        name, _, value = part.strip().partition(" ")
        value = " ".join(value.split())
        if name == "skip" and value:
            found["skip"] = value
        elif name == "needs" and value in {"openai-server", "squad", *SERVERS}:
            found["needs"] = (*found["needs"], value)
        elif name == "timeout" and value.replace(".", "", 1).isdigit() and float(value) > 0:
            found["timeout"] = float(value)
        elif name == "model-commands" and value.isdigit():
            found["model_commands"] = int(value)
        else:
            raise ValueError(f"unknown docs-test directive {part.strip()!r} in {comment.strip()!r}")
    return found


def fences(text: str) -> list[Fence]:
    """
    Every fenced code block of a Markdown text, with the directives of the comment right before it.

    A Python block marked `continuation` inherits the `skip` and `needs` of the Python block it continues, since it
    runs that block's code again.

    :param text: The Markdown page.
    :returns: The fences in document order.
    :raises ValueError: For a malformed directive (`parse_directives`).
    """
    tokens = MarkdownIt("commonmark").parse(text)
    found: list[Fence] = []
    previous_python: Fence | None = None
    for index, token in enumerate(tokens):
        if token.type != "fence" or not token.map:
            continue
        info = token.info.split()
        before = tokens[index - 1] if index else None
        comment = ""  # the HTML block on the line right before the fence, if any
        if before is not None and before.type == "html_block" and before.map and before.map[1] == token.map[0]:
            comment = before.content
        directives = parse_directives(comment)
        fence = Fence(
            language=info[0].lower() if info else "",
            words=tuple(info[1:]),
            line=token.map[0] + 1,
            source=token.content,
            **directives,
        )
        if fence.is_python:
            if "continuation" in fence.words and previous_python is not None:
                fence = Fence(
                    **{
                        **fence.__dict__,
                        "skip": fence.skip or previous_python.skip,
                        "needs": tuple(dict.fromkeys(previous_python.needs + fence.needs)),
                    }
                )
            previous_python = fence
        found.append(fence)
    return found


def shell_commands(fence: Fence) -> str:
    """
    The script a shell fence runs: the whole block, or for `console` only the `$ ` lines (and the lines a trailing
    backslash continues); the rest of a console block is output.
    """
    if fence.language != "console":
        return fence.source
    lines: list[str] = []
    continued = False
    for line in fence.source.splitlines():
        if continued or line.startswith("$ "):
            lines.append(line[2:] if line.startswith("$ ") and not continued else line)
            continued = line.rstrip().endswith("\\")
    return "\n".join(lines) + "\n"


def count_model_commands(script: str) -> int:
    """The commands of a shell script that call an LLM (`MODEL_COMMAND`), comment lines left out."""
    lines = (line for line in script.splitlines() if not line.lstrip().startswith("#"))
    return sum(len(MODEL_COMMAND.findall(line)) for line in lines)


def is_docs_page(path: Path, root: Path) -> bool:
    """README.md at the repository's root and every .md file under docs/."""
    if path.suffix != ".md":
        return False
    return path == root / "README.md" or (root / "docs") in path.parents


@dataclass
class PageSession:
    """A page's working directory, its environment and what its shell blocks exported so far."""

    workdir: Path
    env: dict[str, str]
    exported: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None


class DocsPage(MarkdownTextFile):
    """A Markdown page: its Python blocks (pytest-markdown-docs' items) and shell blocks, in document order."""

    docs_session: PageSession | None = None

    def collect(self) -> Iterator[pytest.Item]:
        page_fences = fences(self.path.read_text(encoding="utf-8"))
        python = {fence.line: fence for fence in page_fences if fence.is_python}
        items: list[tuple[int, pytest.Item]] = []
        for item in super().collect():
            assert isinstance(item, MarkdownInlinePythonItem)
            fence = python[item.start_line]
            mark(item, fence)
            items.append((fence.line, item))
        for number, fence in enumerate((fence for fence in page_fences if fence.is_shell), start=1):
            fixtures = ("docs_page", *(["docs_openai_server"] if "openai-server" in fence.needs else []))
            definition = FenceTestDefinition(shell_commands(fence), fixtures, fence.line, self.path, None)
            name = f"[ShellFence#{number}][line:{fence.line}]"
            shell = ShellBlock.from_parent(self, name=name, test_definition=definition, fence=fence)
            mark(shell, fence)
            items.append((fence.line, shell))
        for _, item in sorted(items, key=lambda pair: pair[0]):
            yield item


def mark(item: pytest.Item, fence: Fence) -> None:
    """Give a block's item its page environment, its servers and its skip reason."""
    item.add_marker(pytest.mark.docs)
    item.add_marker(pytest.mark.usefixtures("docs_page"))
    if fence.skip:
        item.add_marker(pytest.mark.skip(reason=fence.skip))
    for server in fence.needs:
        if server == "openai-server":
            item.add_marker(pytest.mark.usefixtures("docs_openai_server"))
        elif server == "squad":
            missing = not os.environ.get(SQUAD_VARIABLE) and not SHARED_SQUAD.is_file()
            item.add_marker(pytest.mark.skipif(missing, reason=f"{SQUAD_VARIABLE} is not set (no SQuAD 2.0 file)"))
        else:
            variable = SERVERS[server]
            item.add_marker(getattr(pytest.mark, server))
            item.add_marker(pytest.mark.skipif(not os.environ.get(variable), reason=f"{variable} is not set"))


class ShellBlockError(Exception):
    """A shell block exited with a status other than 0, or ran past its hang guard."""


class ShellBlock(MarkdownInlinePythonItem):
    """
    One shell fence, run with bash in its page's session: pytest-markdown-docs' item (its fixtures, named in the
    test definition, are set up before the block runs), with a shell `runtest`.
    """

    def __init__(self, *, fence: Fence, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fence = fence

    def runtest(self) -> None:
        page = self.parent
        assert isinstance(page, DocsPage)
        assert page.docs_session is not None
        session = page.docs_session
        state = session.workdir.parent / f"{session.workdir.name}-state"
        state.mkdir(exist_ok=True)
        before = {**os.environ, **session.exported}
        script = f'set -e -o pipefail\n{self.test_definition.source}\npwd > "{state}/cwd"\nenv -0 > "{state}/env"\n'
        process = subprocess.Popen(
            ["bash", "-c", script],
            cwd=session.cwd or session.workdir,
            env=before,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: whatever it left running is stopped below
        )
        try:
            output, _ = process.communicate(timeout=self.fence.hang_guard)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            raise ShellBlockError(
                f"hung: still running after {self.fence.hang_guard:g} s (its hang guard)\n{output}"
            ) from None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        if process.returncode != 0:
            raise ShellBlockError(f"exit status {process.returncode}\n{output}")
        after = dict(entry.split("=", 1) for entry in (state / "env").read_text().split("\0") if "=" in entry)
        session.exported.update({k: v for k, v in after.items() if before.get(k) != v and not k.startswith("BASH")})
        session.cwd = Path((state / "cwd").read_text().strip())

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, ShellBlockError):
            tail = "\n".join(str(excinfo.value).splitlines()[-60:])
            return f"shell block at {self.path.name}:{self.fence.line} failed:\n{self.fence.source}\n--- {tail}"
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, self.fence.line, self.name


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if is_docs_page(Path(file_path), Path(str(parent.config.rootpath))):
        return DocsPage.from_parent(parent, path=Path(file_path))
    return None


@pytest.fixture
def docs_page(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> PageSession:
    """
    The block's page session (made at its first block): the working directory (cwd for Python blocks too) and the
    environment every block of the page runs with.
    """
    page = request.node.parent
    assert isinstance(page, DocsPage)
    if page.docs_session is None:
        workdir = tmp_path_factory.mktemp(re.sub(r"\W", "_", page.path.stem)) / "work"
        workdir.mkdir()
        for name in COPIED:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, workdir / name)
            elif source.is_file():
                shutil.copy2(source, workdir / name)
        if (ROOT / ".venv").is_dir():
            (workdir / ".venv").symlink_to(ROOT / ".venv", target_is_directory=True)
        cache = workdir.parent / "cache"
        env = {
            "HAYSTACK_TELEMETRY_ENABLED": "False",
            # `~/.cache/haystack_fusion` (the default index, the YAML files' `index_path`) in the temp directory
            "HOME": str(workdir.parent / "home"),
            "XDG_CACHE_HOME": str(cache),
            "HF_HOME": str(cache / "huggingface"),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        if not os.environ.get(SQUAD_VARIABLE) and SHARED_SQUAD.is_file():
            env[SQUAD_VARIABLE] = str(SHARED_SQUAD)
        page.docs_session = PageSession(workdir=workdir, env=env)
    for name, value in page.docs_session.env.items():
        monkeypatch.setenv(name, value)
    for name in UNSET:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(page.docs_session.cwd or page.docs_session.workdir)
    return page.docs_session


@pytest.fixture(scope="session")
def docs_openai_server_process() -> Iterator[Any]:
    """One OpenAI-compatible test server (`tests.support.openai_server`, no model) for all blocks."""
    from tests.support.openai_server import OpenAIServer

    server = OpenAIServer(lifetime=3600, max_requests=100_000).start()
    yield server
    server.stop()


@pytest.fixture
def docs_openai_server(docs_openai_server_process: Any, docs_page: PageSession, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The block's environment points the OpenAI client and the `openai` backend at the test server."""
    monkeypatch.setenv("OPENAI_BASE_URL", docs_openai_server_process.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    monkeypatch.setenv("HAYSTACK_FUSION_LLM", "openai")
    return docs_openai_server_process
