"""Run the real `edgespec` CLI as a subprocess (the way users and external checks call it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_edgespec(
    *args: str,
    timeout: float = 300,
    path_first: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """`python -m edgespec ARGS` from the repo root, offline from the Hugging Face Hub;
    `path_first` comes before the repo on the import path (see `mlx_lm_stopper`); `env` adds
    variables."""
    path = [str(path_first)] if path_first is not None else []
    environ = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join([*path, str(ROOT)]))
    return subprocess.run(
        [sys.executable, "-m", "edgespec", *args],
        capture_output=True,
        text=True,
        env=environ | (env or {}),
        cwd=ROOT,
        timeout=timeout,
    )


def mlx_lm_stopper(folder: Path) -> Path:
    """A folder holding a stand-in `mlx_lm` package that ends the process when imported, for
    `path_first`: what a command checks before it imports mlx-lm (and so before any model loads)
    still answers; anything later exits with "mlx_lm was imported"."""
    (folder / "mlx_lm").mkdir(parents=True)
    (folder / "mlx_lm" / "__init__.py").write_text("raise SystemExit('mlx_lm was imported')\n")
    return folder
