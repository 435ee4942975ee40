"""The house keeps its shape: every package is installed, no module or function outgrows the limits
(docs/library.md, "Layout"), and tui/ and models/ install inside edgespec."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (the CI's); 3.10 has no TOML parser


ROOT = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
MAPPED = {"tui": "edgespec.tui", "models": "edgespec.models"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _package_name(folder: Path) -> str:
    rel = folder.relative_to(ROOT).parts
    head = MAPPED.get(rel[0], rel[0])
    return ".".join([head, *rel[1:]])


def test_every_package_folder_is_installed_under_edgespec():
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    found = {
        _package_name(init.parent)
        for top in ("edgespec", "tui", "models")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert found == listed, f"missing from pyproject: {found - listed}; stale: {listed - found}"
    dirs = _pyproject()["tool"]["setuptools"]["package-dir"]
    assert dirs == {"edgespec": "edgespec", **{v: k for k, v in MAPPED.items()}}


def _sources() -> list[Path]:
    return sorted(p for top in ("edgespec", "tui") for p in (ROOT / top).rglob("*.py"))


def test_no_module_over_the_line_limit():
    long = {
        str(p.relative_to(ROOT)): n
        for p in _sources()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_function_over_the_line_limit():
    long = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_ci_runs_the_readme_test_command():
    """.ci/run ends with the README's "everything, as CI runs it" command, word for word."""
    readme = [ln for ln in (ROOT / "README.md").read_text().splitlines() if "as CI runs it" in ln]
    assert len(readme) == 1
    command = readme[0].split("#", 1)[0].strip()
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.startswith("python")]
    assert ci[-1] == command
