"""The CLI's BLAS re-exec runs in safe-path mode: a file in the working directory named like a
standard module (queue.py) replaced that module in the re-executed process and crashed `edgespec
serve` (and every other command that imports it). The real CLI, as a subprocess, started in a
directory holding a queue.py that raises on import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec import blas
from edgespec.blas import checkout_path, safe_command

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def hostile_dir(tmp_path: Path) -> Path:
    (tmp_path / "queue.py").write_text("raise ImportError('queue.py of the working directory')\n")
    return tmp_path


def generate(pair, cwd: Path, command: list[str]) -> subprocess.CompletedProcess:
    """`COMMAND generate` as from a shell: without the re-exec marks this pytest process carries
    (its own BLAS re-exec set them), so the CLI re-executes itself."""
    args = ["generate", "the cat", "--target", str(pair[0]), "--draft", str(pair[1])]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    for name in (blas.ACTIVE, "LD_PRELOAD"):
        env.pop(name, None)
    return subprocess.run(
        [*command, *args, "--max-tokens", "4"],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def test_the_installed_command_ignores_a_queue_py_where_it_starts(tiny_pair, hostile_dir):
    """As users start it: the console script (the re-exec happens when an optimised BLAS is
    installed, as on Linux with the `cpu` extra)."""
    script = shutil.which("edgespec", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("the edgespec console script is not installed beside this Python")
    if not sys.platform.startswith("linux") or blas.plan("auto") is None:
        pytest.skip("no optimised BLAS here: the CLI does not re-execute itself")
    r = generate(tiny_pair, hostile_dir, [script])
    assert r.returncode == 0, r.stderr
    assert "queue.py" not in r.stderr


@pytest.mark.parametrize("version", [(3, 10), (3, 11)], ids=["python3.10", "python3.11+"])
def test_both_reexec_forms_keep_the_working_directory_off_the_path(tiny_pair, hostile_dir, version):
    """The command the re-exec runs on Python 3.10 (no -P) and on 3.11+, each run here."""
    r = generate(tiny_pair, hostile_dir, safe_command("edgespec", [], version))
    assert r.returncode == 0, r.stderr


def test_the_safe_forms():
    assert safe_command("edgespec", ["models"], (3, 12))[1:] == ["-P", "-m", "edgespec", "models"]
    old = safe_command("edgespec", ["models"], (3, 10))
    assert old[1] == "-c" and old[3:] == ["edgespec", "models"]


def test_a_checkout_run_from_its_own_folder_keeps_importing_that_checkout(tmp_path):
    """Safe-path mode drops the working directory; when edgespec was imported from there (a
    source checkout, not installed), the re-exec names it in PYTHONPATH instead."""
    holder = Path(blas.__file__).resolve().parents[1]
    assert checkout_path("", cwd=holder) == {"PYTHONPATH": str(holder)}
    assert checkout_path("/x", cwd=holder) == {"PYTHONPATH": os.pathsep.join([str(holder), "/x"])}
    assert checkout_path(str(holder), cwd=holder) == {}  # already there
    assert checkout_path("", cwd=tmp_path) == {}  # anywhere else: nothing added
