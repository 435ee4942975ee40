"""The tests are a map (tests/__init__.py): every test module sits in a folder the map names,
none at tests/ root, every folder is a package, and no module under tests/ imports a test module
(what tests share lives in tests/helpers/)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers.import_graph import ROOT, imported_names, module_files

AT_ROOT = {"__init__.py", "conftest.py"}


def files_at_root(tests: Path) -> list[str]:
    """The .py files directly in tests/ besides __init__.py and conftest.py."""
    return sorted(p.name for p in tests.glob("*.py") if p.name not in AT_ROOT)


def names_a_test_module(name: str) -> bool:
    """True for a dotted name under tests that reaches a test module:

    names_a_test_module("tests.loop.test_loop.gen") is True; "tests.helpers.tiny" is not.
    """
    parts = name.split(".")
    return parts[0] == "tests" and any(p.startswith("test_") for p in parts[1:])


def imports_of_test_modules(root: Path) -> list[str]:
    """'module imports name' for every import under root/tests that names a test module
    (function-local and relative imports included)."""
    files = module_files(root, {"tests": "tests"})
    return sorted(
        f"{module} imports {name}"
        for module, path in files.items()
        for name in imported_names(path.read_text(), module, path.name == "__init__.py")
        if names_a_test_module(name)
    )


def mapped_folders(tests: Path) -> set[str]:
    """The folders tests/__init__.py's docstring names, one `name/  description` line each."""
    doc = ast.get_docstring(ast.parse((tests / "__init__.py").read_text())) or ""
    return {m.group(1) for line in doc.splitlines() if (m := re.match(r"([a-z_]+)/\s", line))}


def folders(tests: Path) -> set[str]:
    """The folders directly under tests/ that hold Python files."""
    return {p.relative_to(tests).parts[0] for p in tests.glob("*/**/*.py")}


def not_packages(tests: Path) -> list[str]:
    """Folders under tests/ holding .py files but no __init__.py (their test modules' names
    would clash with same-named ones elsewhere)."""
    holding = {p.parent for p in tests.rglob("*.py") if "__snapshots__" not in p.parts}
    return sorted(str(d.relative_to(tests)) for d in holding if not (d / "__init__.py").exists())


def test_no_module_sits_at_the_tests_root():
    assert files_at_root(ROOT / "tests") == []


def test_no_module_under_tests_imports_a_test_module():
    assert imports_of_test_modules(ROOT) == []


def test_every_folder_is_a_package_on_the_map():
    tests = ROOT / "tests"
    assert folders(tests) == mapped_folders(tests)
    assert not_packages(tests) == []
    assert not list((tests / "helpers").rglob("test_*.py"))


def test_the_checks_find_what_breaks_the_map(tmp_path):
    tests = tmp_path / "tests"
    files = {
        "__init__.py": '"""The map:\n\na/  some tests\ngone/  no longer here\n"""\n',
        "conftest.py": "",
        "test_flat.py": "",
        "a/__init__.py": "",
        "a/test_x.py": "from tests.a.test_y import f\n",
        "a/test_y.py": "def f():\n    from . import test_x\n",
        "b/test_z.py": "import tests.helpers.tiny\n",
        "helpers/__init__.py": "from tests.a import test_y\n",
    }
    for name, text in files.items():
        (tests / name).parent.mkdir(parents=True, exist_ok=True)
        (tests / name).write_text(text)
    assert files_at_root(tests) == ["test_flat.py"]
    assert imports_of_test_modules(tmp_path) == [
        "tests.a.test_x imports tests.a.test_y",
        "tests.a.test_x imports tests.a.test_y.f",
        "tests.a.test_y imports tests.a.test_x",
        "tests.helpers imports tests.a.test_y",
    ]
    assert (folders(tests), mapped_folders(tests)) == ({"a", "b", "helpers"}, {"a", "gone"})
    assert not_packages(tests) == ["b"]
