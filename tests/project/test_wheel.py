"""The wheel holds the product only: the runtime, CLI, server, TUI, bench, `edgespec distill` and
the default pair's draft, never research/ (the research drafts live there), tests/ or the
drafts' training shards (models/*/data*/), and stays under a size bound. Builds it with
`pip wheel . --no-deps` from a copy of the tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers.import_graph import ROOT

# The default pair's draft (11.9 MB) and the code, with some room: a new draft or data file in
# the wheel must raise it on purpose. The research drafts (EAGLE, EAGLE-3, block: 30 MB) stay in
# research/, beside their recipes.
MAX_WHEEL_BYTES = 25_000_000
SHIPPED_DRAFTS = {"smollm2-135m-draft"}
# Not copied for the build: git's store, build outputs, caches, local work folders (.gitignore).
LEFT_BEHIND = (".git", "build", "dist", "*.egg-info", "__pycache__", ".*cache", ".venv", ".dev")
LEFT_BEHIND += ("bench-out", "runs", ".whl", ".gpucarry", ".gl", ".benchmarks")
MUST_HAVE = (
    "edgespec/cli.py",
    "edgespec/commands/distill.py",
    "edgespec/data/bench_prompts.jsonl",
    "edgespec/data/context/drafting.md",  # bench --context's documents
    "edgespec/distill/lexicon.json",
    "edgespec/tui/app.py",
    "edgespec/models/catalog.json",
    "edgespec/models/smollm2-135m-draft/model.safetensors",
)


def forbidden(name: str) -> bool:
    """True for a wheel entry that is research, a test, or a training shard:

    forbidden("edgespec/models/smollm2-135m-draft/data-real/shard-00000.npz") is True.
    """
    parts = name.split("/")
    if parts[0] in ("research", "tests") or "recipes" in parts:
        return True
    in_model = parts[:2] == ["edgespec", "models"] and len(parts) > 4
    return in_model and parts[3].startswith("data")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    shutil.copytree(ROOT, tmp / "src", ignore=shutil.ignore_patterns(*LEFT_BEHIND))
    cmd = [sys.executable, "-m", "pip", "wheel", str(tmp / "src"), "--no-deps", "-q"]
    done = subprocess.run([*cmd, "-w", str(tmp / "out")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    (found,) = (tmp / "out").glob("edgespec-*.whl")
    return found


def test_the_wheel_holds_no_research_tests_or_training_shards(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if forbidden(n)], [n for n in names if forbidden(n)][:20]
    assert set(MUST_HAVE) <= set(names), set(MUST_HAVE) - set(names)


def test_the_wheel_ships_the_default_draft_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    folders = {
        n.split("/")[2] for n in names if n.startswith("edgespec/models/") and n.count("/") > 2
    }
    assert folders == SHIPPED_DRAFTS, folders


def test_a_research_pair_from_the_wheel_is_a_one_line_error(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    cmd = [sys.executable, "-m", "edgespec", "generate", "hi", "--pair", "smollm2-135m-block"]
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "smollm2-135m-block is a research draft shipped only in a clone" in done.stderr


def test_the_wheel_stays_under_its_size_bound(wheel):
    assert wheel.stat().st_size < MAX_WHEEL_BYTES, f"{wheel.name}: {wheel.stat().st_size} bytes"


def test_a_shard_or_a_research_file_would_be_caught():
    assert forbidden("edgespec/models/smollm2-135m-draft/data/shard-00011.npz")
    assert forbidden("edgespec/models/recipes/draft_r2.py")
    assert forbidden("research/distill/pool.py")
    assert not forbidden("edgespec/models/smollm2-135m-draft/model.safetensors")
    assert not forbidden("edgespec/distill/data.py")
