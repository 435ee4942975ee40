"""pytest plugin (loaded with `-p edgespec.pytest_openblas` from pyproject's addopts).

Loaded before pytest starts capturing output, it re-executes pytest once with OpenBLAS preloaded
(see edgespec/blas.py), so in-process MLX tests run on an optimised BLAS like the CLI does.
"""

from __future__ import annotations

import sys

from edgespec.blas import reexec_with_openblas

reexec_with_openblas(sys.argv[1:], module="pytest")
