"""pytest plugin (loaded with `-p tests.plugins.pytest_blas` from pyproject's addopts).

Loaded before pytest starts capturing output, it re-executes pytest once with an optimised BLAS
preloaded (MKL in exact mode, else OpenBLAS; see edgespec/blas.py), so in-process MLX tests run on
the same BLAS as the CLI. Under pytest-xdist (`-n N`) it first gives each worker its share of the
cores (`share_cores`), which the workers and the processes they start inherit.
"""

from __future__ import annotations

import os
import shlex
import sys

from edgespec.blas import reexec_with_blas, share_cores


def xdist_workers(argv: list[str]) -> int:
    """How many pytest-xdist workers `argv` asks for: `-n N`, `-nN`, `--numprocesses[=]N`; for
    `auto` and `logical`, as xdist counts them (`_cores`); 0 without any.

    >>> xdist_workers(["-m", "slow", "-n", "3"]), xdist_workers(["-n0"]), xdist_workers(["-q"])
    (3, 0, 0)
    """
    count = "0"
    for i, arg in enumerate(argv):
        if arg in ("-n", "--numprocesses") and i + 1 < len(argv):
            count = argv[i + 1]
        elif arg.startswith("--numprocesses="):
            count = arg.split("=", 1)[1]
        elif arg.startswith("-n") and not arg.startswith("--"):
            count = arg[2:]
    if count in ("auto", "logical"):
        return _cores(logical=count == "logical")
    return int(count) if count.isdigit() else 0


def _cores(logical: bool) -> int:
    """xdist's count for `-n auto` / `-n logical`: PYTEST_XDIST_AUTO_NUM_WORKERS when set, else
    psutil's physical (`auto`) or logical core count when psutil is installed, else the CPUs."""
    forced = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "")
    if forced.isdigit():
        return int(forced)
    try:
        import psutil  # type: ignore[import-untyped]

        return psutil.cpu_count(logical=logical) or os.cpu_count() or 1
    except ImportError:
        return os.cpu_count() or 1


argv = shlex.split(os.environ.get("PYTEST_ADDOPTS", "")) + sys.argv[1:]
share_cores(xdist_workers(argv))
reexec_with_blas(sys.argv[1:], module="pytest", report=lambda note: print(note, file=sys.stderr))
