"""Use an optimised BLAS under MLX's CPU backend on Linux, without rebuilding anything.

The `mlx[cpu]` wheel links the unoptimised reference BLAS (FACTS.md: a 1024x1024 fp32 matmul at
~5 GFLOP/s); preloading OpenBLAS makes it ~180 GFLOP/s. A library cannot swap BLAS after MLX is
loaded, so the `edgespec` command re-executes itself once, before importing MLX, with OpenBLAS in
LD_PRELOAD when it is installed (Debian/Ubuntu: `apt-get install libopenblas0-pthread`).
Set EDGESPEC_BLAS=system to opt out. Scripts that `import edgespec` can export the same
LD_PRELOAD themselves; `openblas_path()` says which file to use.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)
_MARK = "EDGESPEC_BLAS_REEXEC"


def openblas_path() -> str | None:
    """The first installed OpenBLAS that can stand in for libblas.so.3, or None."""
    return next((p for p in CANDIDATES if Path(p).exists()), None)


def reexec_with_openblas(argv: list[str], module: str = "edgespec") -> None:
    """On Linux, replace this process with `python -m MODULE *argv` preloading OpenBLAS (once).

    No-op on macOS (MLX uses Accelerate/Metal), when opted out, when already preloaded, when
    OpenBLAS is missing, or when MLX is already imported (too late to swap).
    """
    if not sys.platform.startswith("linux") or os.environ.get("EDGESPEC_BLAS") == "system":
        return
    if os.environ.get(_MARK) or "mlx.core" in sys.modules:
        return
    lib = openblas_path()
    preload = os.environ.get("LD_PRELOAD", "")
    if lib is None or lib in preload.split(":"):
        return
    env = dict(os.environ, LD_PRELOAD=":".join(filter(None, [lib, preload])), **{_MARK: "1"})
    try:
        os.execve(sys.executable, [sys.executable, "-m", module, *argv], env)
    except OSError:
        return  # keep going on the reference BLAS rather than fail
