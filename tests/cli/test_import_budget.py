"""`edgespec generate` with a token draft (the default pair's kind; the CLI's default method,
hybrid with adaptive K) imports only what it runs: at most BUDGET of the project's modules, and
none of a draft kind, tree, file format or group it does not use (issue 59's "done when")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.cli import ROOT

BUDGET = 40
# A module any of whose dotted parts is one of these serves something a token draft never runs.
UNUSED = {
    "trees",  # draft trees
    "block",  # block drafts (drafting/block.py, architectures/block.py, families/block.py)
    "block_head",
    "feature",  # feature drafts (EAGLE, MTP, next-n)
    "eagle",
    "mtp",
    "nextn",
    "assistant",  # Gemma 4 assistant drafts (families/, drafting/assistant.py)
    "gemma4_assistant",
    "gguf",  # GGUF conversion
    "shard",  # sharded targets
    "distributed",  # mlx.launch groups
    "bank",  # the server's banked and packed forwards
    "packed",
}

# Runs the command in this process, then reports what it imported (the command's own BLAS
# re-exec is off: EDGESPEC_BLAS_REEXEC marks the process as re-executed already).
CODE = """
import json, sys
from edgespec.cli import main
code = main(sys.argv[1:])
mods = sorted(m for m in sys.modules if m == "edgespec" or m.startswith("edgespec."))
sys.stderr.write("MODULES " + json.dumps([code, mods]) + "\\n")
"""


def imported_by_generate(*args: str) -> list[str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), EDGESPEC_BLAS_REEXEC="1")
    r = subprocess.run(
        [sys.executable, "-c", CODE, "generate", "Hi", "--max-tokens", "4", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    line = next((s for s in r.stderr.splitlines() if s.startswith("MODULES ")), None)
    assert line is not None, r.stderr[-2000:]
    code, modules = json.loads(line.removeprefix("MODULES "))
    assert code == 0, r.stderr[-2000:]
    return modules


def check_budget(modules: list[str]) -> None:
    unused = [m for m in modules if UNUSED & set(m.split("."))]
    assert not unused, f"generate with a token draft imported {unused}"
    assert len(modules) <= BUDGET, f"{len(modules)} project modules imported: {modules}"


def test_unused_parts_name_real_modules():
    """Each name in UNUSED is a module or package of the project (else the check above would
    pass for nothing)."""
    parts = {p.stem for p in (ROOT / "edgespec").rglob("*.py")}
    parts |= {p.name for p in (ROOT / "edgespec").iterdir() if p.is_dir()}
    assert UNUSED <= parts, UNUSED - parts


def test_a_token_draft_imports_only_what_it_runs(tiny_pair):
    target, draft = tiny_pair
    check_budget(imported_by_generate("--target", str(target), "--draft", str(draft)))


@pytest.mark.slow
def test_the_default_pair_imports_only_what_it_runs():
    check_budget(imported_by_generate())
