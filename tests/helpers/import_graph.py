"""The project's import graph, read from the AST of every module: every `import` and `from ...
import` statement counts, the ones inside functions included (a function-local import hides a
cycle from a linter, not from the interpreter). Modules carry their installed names: tui/ and
models/ install as edgespec.tui and edgespec.models (pyproject's package-dir).

    graph = import_graph(module_files())
    graph["edgespec.cli"]            # {"edgespec.blas", "edgespec.errors", ...}
    find_cycle(graph)                # None, or ["a", "b", "a"]
    reachable(graph, {"edgespec.cli"})
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INSTALLED = {"edgespec": "edgespec", "tui": "edgespec.tui", "models": "edgespec.models"}


def module_files(root: Path = ROOT, tops: Mapping[str, str] = INSTALLED) -> dict[str, Path]:
    """Installed module name -> source file, for every .py under the folders `tops` names."""
    found = {}
    for folder, name in tops.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((name, *parts))] = path
    return found


def imported_names(source: str, module: str, is_package: bool) -> set[str]:
    """Every dotted name an import statement in `source` names, relative ones made absolute:

    imported_names("from .b import c", "p.a", False) == {"p.b", "p.b.c"}
    """
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, module, is_package)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def _from_base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, *([node.module] if node.module else [])])


def resolve(name: str, known: Iterable[str]) -> str | None:
    """The module an imported name lands in: the longest known prefix (`from m import f`
    names m.f, which is m's attribute unless m.f is a module), or None outside the project."""
    known = set(known)
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(files: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the project's modules it imports (itself left out)."""
    graph = {}
    for module, path in files.items():
        names = imported_names(path.read_text(), module, path.name == "__init__.py")
        targets = {resolve(name, files) for name in names}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that ends where it starts, or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module], _ = 1, path.append(module)
        for child in sorted(graph.get(module, ())):
            if state.get(child) == 1:
                return [*path[path.index(child) :], child]
            if child not in state and (cycle := visit(child)):
                return cycle
        state[module], _ = 2, path.pop()
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def reachable(graph: Mapping[str, set[str]], roots: Iterable[str]) -> set[str]:
    """The modules importing `roots` loads: their imports, transitively, and the packages above
    each (importing a.b.c runs a/__init__.py and a/b/__init__.py first)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo.extend(graph.get(module, ()))
        if "." in module:
            todo.append(module.rpartition(".")[0])
    return seen
