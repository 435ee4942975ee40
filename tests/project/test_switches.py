"""Switches are interface: every EDGESPEC_* variable the package names is one of the few listed
in edgespec/switches.py (a line each) and in docs/cli.md's table, where users look."""

from __future__ import annotations

import re
from pathlib import Path

from edgespec import switches

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\bEDGESPEC_[A-Z][A-Z_]*[A-Z]\b")


def named_in(folder: Path) -> dict[str, set[str]]:
    """EDGESPEC_* names in the package's sources (Python, C), by name -> files."""
    found: dict[str, set[str]] = {}
    for path in folder.rglob("*"):
        if path.suffix in (".py", ".c") and path.is_file():
            for name in NAME.findall(path.read_text(encoding="utf-8")):
                found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_package_names_only_the_listed_switches():
    found = named_in(ROOT / "edgespec") | named_in(ROOT / "tui")
    unlisted = {name: sorted(files) for name, files in found.items() if name not in switches.ALL}
    assert not unlisted, f"not in edgespec/switches.py: {unlisted}"
    assert len(switches.ALL) == len(set(switches.ALL)) <= 10


def test_each_switch_has_a_line_in_the_module_and_a_row_in_the_cli_doc():
    source = (ROOT / "edgespec" / "switches.py").read_text(encoding="utf-8")
    table = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for name in switches.ALL:
        line = next(x for x in source.splitlines() if f'"{name}"' in x)
        assert "#" in line, f"{name}: no comment on its line in switches.py"
        assert f"| `{name}" in table, f"{name}: no row in docs/cli.md"
