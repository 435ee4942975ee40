"""pytest plugin (loaded with `-p edgespec.cpu.pytest_blas` from pyproject's addopts).

Loaded before pytest starts capturing output, it re-executes pytest once with an optimised BLAS
preloaded (MKL in exact mode, else OpenBLAS; see edgespec/cpu/blas.py), so in-process MLX tests run on
the same BLAS as the CLI.
"""

from __future__ import annotations

import sys

from edgespec.cpu.blas import reexec_with_blas

reexec_with_blas(sys.argv[1:], module="pytest", report=lambda note: print(note, file=sys.stderr))
