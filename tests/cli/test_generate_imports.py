"""What `edgespec generate` with a token draft (the default pair's kind; the CLI's default
method, hybrid with adaptive K) must not import: draft trees, the server, the bench, distillation,
distributed groups, any draft architecture but the token draft's (and the families and drafters
of those), file formats and sharding it does not use. Named by idea, not counted: a module
should be as big as its one idea, however many that makes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.cli import ROOT

# Packages a token draft's generate never runs.
PACKAGES = {"trees", "server", "bench", "distill", "distributed"}
# The draft architectures besides the token draft's (one file per model class).
ARCHITECTURES = {
    p.stem
    for p in (ROOT / "edgespec" / "architectures").glob("*.py")
    if p.stem not in ("__init__", "token_draft")
}
# A module any of whose dotted parts is one of these serves something a token draft never runs.
UNUSED = (
    PACKAGES
    | ARCHITECTURES
    | {
        "block",  # block drafts (drafting/block.py)
        "feature",  # feature drafts (EAGLE, MTP, next-n)
        "assistant",  # Gemma 4 assistant drafts (drafting/assistant.py)
        "dflash2",
        "block_family",  # their families (edgespec/families/)
        "feature_family",
        "assistant_family",
        "mtp_checkpoint",  # a target's own MTP head, read or converted (loading/)
        "gguf",  # GGUF conversion
        "shard",  # sharded targets
        "bank",  # the server's banked and packed forwards
        "packed",
    }
)

# Runs the command in this process, then reports what it imported (the command's own BLAS
# re-exec is off: EDGESPEC_BLAS_ACTIVE marks the process as re-executed already).
CODE = """
import json, sys
from edgespec.cli import main
code = main(sys.argv[1:])
mods = sorted(m for m in sys.modules if m == "edgespec" or m.startswith("edgespec."))
sys.stderr.write("MODULES " + json.dumps([code, mods]) + "\\n")
"""


def imported_by_generate(*args: str) -> list[str]:
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), EDGESPEC_BLAS_ACTIVE="reference"
    )
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


def check_unused(modules: list[str]) -> None:
    assert "edgespec.drafting.token" in modules  # what it runs is seen
    unused = [m for m in modules if UNUSED & set(m.split("."))]
    assert not unused, f"generate with a token draft imported {unused}"


def test_unused_parts_name_real_modules():
    """Each name in UNUSED is a module or package of the project (else the check above would
    pass for nothing)."""
    parts = {p.stem for p in (ROOT / "edgespec").rglob("*.py")}
    parts |= {p.name for p in (ROOT / "edgespec").iterdir() if p.is_dir()}
    assert UNUSED <= parts, UNUSED - parts
    assert {"eagle", "block_model", "mtp", "dflash2_model"} <= ARCHITECTURES  # the glob finds them


def test_a_token_draft_imports_only_what_it_runs(tiny_pair):
    target, draft = tiny_pair
    check_unused(imported_by_generate("--target", str(target), "--draft", str(draft)))


@pytest.mark.slow
def test_the_default_pair_imports_only_what_it_runs():
    check_unused(imported_by_generate())
