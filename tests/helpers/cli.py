"""Run the real `edgespec` CLI as a subprocess (the way users and external checks call it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_edgespec(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m edgespec ARGS` from the repo root, offline from the Hugging Face Hub."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "edgespec", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
    )
