"""Every environment variable EdgeSpec reads, a line each (docs/cli.md lists them for users).

Each is read where its value is used, once per process or per object that needs it (never again
after a decision was made on it). tests/project/test_switches.py checks that the package names
no other EDGESPEC_* variable and that docs/cli.md lists these. This module imports nothing: the
BLAS re-exec (edgespec/blas.py) reads its names before MLX loads.
"""

from __future__ import annotations

HOME = "EDGESPEC_HOME"  # the model cache (default ~/.cache/edgespec; loading/paths.py)
DATA_DIR = "EDGESPEC_DATA_DIR"  # where `chat` saves chats (default ~/.local/share/edgespec/chats)
WHEEL_DIR = "EDGESPEC_WHEEL_DIR"  # a folder that already holds the embedded pair's wheel (pull)
API_KEY = "EDGESPEC_API_KEY"  # the key `serve` requires when --api-key is not given
DEBUG = "EDGESPEC_DEBUG"  # 1: a backend failure shows its traceback (cli.py)
BLAS = "EDGESPEC_BLAS"  # the BLAS the CPU backend preloads: auto, mkl, mkl-fast, openblas, system
BLAS_ACTIVE = "EDGESPEC_BLAS_ACTIVE"  # set by the BLAS re-exec in the process it starts: its BLAS
CPU_OPT = "EDGESPEC_CPU_OPT"  # the CPU rewrites: 0 (none), or +name / -name (cpu/backend.py)
KERNEL_DIR = "EDGESPEC_KERNEL_DIR"  # where the fused attention kernel is built (cpu/fused.py)
RANK_CHECK = "EDGESPEC_RANK_CHECK"  # 0: ranks of a group skip comparing each step's tokens

ALL = (
    HOME,
    DATA_DIR,
    WHEEL_DIR,
    API_KEY,
    DEBUG,
    BLAS,
    BLAS_ACTIVE,
    CPU_OPT,
    KERNEL_DIR,
    RANK_CHECK,
)
