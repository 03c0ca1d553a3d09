"""
pyproject.toml's requirements are what the package needs and accepts:

- every third-party module `haystack_fusion` imports (a lazy import inside a function too) comes from a distribution
  pyproject.toml declares, in the core dependencies or a feature's extra (not the tool extras, `TOOL_EXTRAS`); a
  module not installed here (an extra left out) is skipped by name;
- each library `backends.pinned` uses internals of is required at exactly the version it accepts (`PINNED_VERSIONS`),
  wherever pyproject.toml names it, and the Makefile and the constraints files install that version too.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from haystack_fusion.backends import pinned

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "haystack_fusion"

TOOL_EXTRAS = frozenset({"dev", "docs", "bench"})
"""The extras of the project's tools (tests, the docs site, the research bench): a user of a feature installs none,
so a module the package imports is declared elsewhere."""


def declared_requirements() -> dict[str, list[tuple[str, Requirement]]]:
    """Each distribution pyproject.toml requires (canonical name), with the groups (`core` or an extra) naming it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    groups = {"core": project["dependencies"], **project["optional-dependencies"]}
    declared: dict[str, list[tuple[str, Requirement]]] = {}
    for group, requirements in groups.items():
        for text in requirements:
            requirement = Requirement(text)
            declared.setdefault(canonicalize_name(requirement.name), []).append((group, requirement))
    return declared


def imported_modules() -> dict[str, list[str]]:
    """Each third-party top-level module the package imports, with the files importing it."""
    modules: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                if top in sys.stdlib_module_names or top == "haystack_fusion":
                    continue
                modules.setdefault(top, []).append(path.relative_to(ROOT).as_posix())
    return modules


IMPORTED = imported_modules()


def test_the_scan_finds_the_package_imports():
    assert {"haystack", "jinja2", "numpy", "yaml", "hayhooks", "llama_cpp"} <= set(IMPORTED)
    assert not {"os", "typing", "haystack_fusion", "__future__"} & set(IMPORTED)


@pytest.mark.parametrize("module", sorted(IMPORTED))
def test_every_imported_module_is_declared(module):
    distributions = importlib.metadata.packages_distributions().get(module)
    if not distributions:
        pytest.skip(f"{module} is not installed here (an extra left out): its distribution is unknown")
    names = sorted({canonicalize_name(name) for name in distributions})
    groups = {group for name in names for group, _ in declared_requirements().get(name, [])} - TOOL_EXTRAS
    assert groups, (
        f"{module} (imported by {', '.join(sorted(set(IMPORTED[module])))}) comes from {', '.join(names)}, "
        "which pyproject.toml declares neither in `dependencies` nor in a feature's extra"
    )


def test_every_pinned_version_constant_is_in_pinned_versions():
    """A new `*_VERSION` constant in `backends.pinned` cannot be left out of the pyproject check below."""
    tree = ast.parse((PACKAGE / "backends" / "pinned.py").read_text(encoding="utf-8"))
    constants = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id.endswith("_VERSION")
        and isinstance(node.value, ast.Constant)
    }
    assert constants  # LLAMA_CPP_VERSION, HAYHOOKS_VERSION
    assert sorted(constants.values()) == sorted(pinned.PINNED_VERSIONS.values()), constants


@pytest.mark.parametrize("distribution", sorted(pinned.PINNED_VERSIONS))
def test_pyproject_pins_the_version_backends_pinned_accepts(distribution):
    version = pinned.PINNED_VERSIONS[distribution]
    requirements = declared_requirements().get(canonicalize_name(distribution))
    assert requirements, f"pyproject.toml does not require {distribution}"
    for group, requirement in requirements:
        assert str(requirement.specifier) == f"=={version}", (
            f"pyproject.toml's `{group}` requires {requirement}, and backends.pinned accepts {distribution} "
            f"{version} only: pin {distribution}=={version}"
        )


def test_the_makefile_builds_the_pinned_llama_cpp_python():
    match = re.search(r"^LLAMA_CPP_PYTHON \?= (\S+)$", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)
    assert match, "the Makefile sets no LLAMA_CPP_PYTHON"
    assert match.group(1) == pinned.PINNED_VERSIONS["llama-cpp-python"]


@pytest.mark.parametrize("path", sorted((ROOT / "constraints").glob("*.txt")), ids=lambda path: path.name)
def test_the_constraints_hold_the_pinned_versions(path):
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.partition("#")[0].strip()
        if not text:
            continue
        requirement = Requirement(text)
        version = pinned.PINNED_VERSIONS.get(canonicalize_name(requirement.name))
        if version is not None:
            assert str(requirement.specifier) == f"=={version}", f"{path.name}: {text}"
