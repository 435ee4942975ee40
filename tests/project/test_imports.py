"""The import graph from every module's AST (tests/helpers/import_graph.py): no cycle,
function-local imports included; every installed module reachable from a command or the public
API; the installed package never imports research/ or tests/; every project import in research/
and tests/ names a module that exists."""

from __future__ import annotations

import ast
from pathlib import Path

from edgespec.cli import COMMANDS
from tests.helpers.import_graph import (
    ROOT,
    find_cycle,
    import_graph,
    imported_names,
    module_files,
    reachable,
)

# What a user runs or imports; everything installed must be reached from one of these.
ENTRY_POINTS = {
    "edgespec": "the public API (edgespec/__init__.py; Engine is exported lazily)",
    "edgespec.__main__": "python -m edgespec",
    "edgespec.cli": "the edgespec command",
    "edgespec.bench.serve": "python -m edgespec.bench.serve (docs/server.md)",
    "edgespec.models": "the catalogue and the drafts (edgespec.loading.specs finds it)",
    "edgespec.tui.headless": "python -m edgespec.tui.headless: bench --cold starts its app runs",
    **{module: f"edgespec {name}" for name, (module, _) in COMMANDS.items()},
}
NOT_INSTALLED = {"research": "research", "tests": "tests"}


def test_no_import_cycle_counting_function_local_imports():
    cycle = find_cycle(import_graph(module_files()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_cycle_through_a_function_local_import_is_found(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import g\n\ndef f():\n    return g()\n")
    (tmp_path / "pkg" / "b.py").write_text("def g():\n    from . import a\n    return a\n")
    graph = import_graph(module_files(tmp_path, {"pkg": "pkg"}))
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg", "pkg.a"}}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]


def test_every_installed_module_is_reached_from_a_command_or_the_public_api():
    files = module_files()
    assert set(ENTRY_POINTS) <= set(files), set(ENTRY_POINTS) - set(files)
    unreached = set(files) - reachable(import_graph(files), ENTRY_POINTS)
    assert not unreached, (
        f"installed but reached by no command or public API (move to research/ or tests/): "
        f"{sorted(unreached)}"
    )


def test_the_installed_package_never_imports_research_or_tests():
    found = {
        f"{module} imports {name}"
        for module, path in module_files().items()
        for name in imported_names(path.read_text(), module, path.name == "__init__.py")
        if name.split(".")[0] in NOT_INSTALLED
    }
    assert not found, sorted(found)


def _project_files() -> dict[str, Path]:
    return module_files() | module_files(ROOT, NOT_INSTALLED)


def _top_level_names(path: Path) -> set[str]:
    """What a package's __init__.py defines or imports at its top level."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _missing(node: ast.AST, files: dict[str, Path]) -> list[str]:
    """The project names an import statement asks for that do not exist: a module, or a name
    `from package import name` finds neither as a submodule nor in the package's __init__.py."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if _ours(a.name) and a.name not in files]
    if not isinstance(node, ast.ImportFrom) or node.level or not _ours(node.module or ""):
        return []
    base = node.module or ""
    if base not in files:
        return [base]
    if files[base].name != "__init__.py":
        return []
    defined = _top_level_names(files[base])
    return [f"{base}.{a.name}" for a in node.names if not _found(base, a.name, files, defined)]


def _ours(name: str) -> bool:
    return name.split(".")[0] in {"edgespec", *NOT_INSTALLED}


def _found(base: str, name: str, files: dict[str, Path], defined: set[str]) -> bool:
    return f"{base}.{name}" in files or name in defined or name == "*"


def test_research_and_tests_import_only_names_that_exist():
    files = _project_files()
    stale = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted(p for top in NOT_INSTALLED for p in (ROOT / top).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        for name in _missing(node, files)
    }
    assert not stale, sorted(stale)
