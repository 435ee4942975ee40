"""MLX's CPU backend, made fast without changing a bit of what is computed.

- backend.py: the one entry point, `CpuBackend`, built once per Engine: a twin of each model that
  runs the optimised layers over the same weights (the model itself is left as mlx-lm made it),
  marked caches, `draft_pairs`, the sampling `softmax`, the draft-tree forward's pieces, and
  `Switches` (which rewrites are in force; the bench records them). Nothing else in EdgeSpec
  imports the modules below it.
  Its `twin` makes a model's twin (new module objects, the same arrays, some of another class).
- blas.py: the optimised BLAS the `edgespec` command (and pytest, pytest_blas.py) preloads by
  re-executing itself before MLX loads. This package's __init__ imports nothing at import time
  (its `on_cpu` imports MLX when called), so that `edgespec.cpu.blas` can run before MLX is
  imported.
- attention.py (grouped verify attention, and the attention's softmax in NumPy for rows that
  see a thousand keys or more), fused.py with attend.c (those rows' whole attention in one C
  kernel, built on first use with the system compiler), rope.py (rotary tables), leanops.py
  (lean Linear / RMSNorm), blocks.py (compiled llama blocks), rowpad.py (one-row products as two
  rows, opt-in), fastexp.py (a faster, more accurate softmax for sampling).

Whether a rewrite applies (here: `on_cpu`, `cpu_switch`): every rewrite in edgespec/cpu/ is on
for MLX's CPU backend and off on a GPU (which has fused kernels). `EDGESPEC_CPU_OPT=0` turns them
all off at once; each also has its own variable (`EDGESPEC_GROUPED_ATTENTION`,
`EDGESPEC_NUMPY_SOFTMAX`, `EDGESPEC_FUSED_ATTENTION`, `EDGESPEC_TABLE_ROPE`, `EDGESPEC_LEAN_OPS`,
`EDGESPEC_COMPILED_BLOCKS`, `EDGESPEC_FAST_EXP`, `EDGESPEC_DRAFT_PAIRS`; row padding is opt-in,
`EDGESPEC_PAD_ROWS=1`). docs/cpu-backend.md describes each one.
"""

from __future__ import annotations

import os

MASTER = "EDGESPEC_CPU_OPT"


def on_cpu() -> bool:
    """True when MLX computes on the CPU backend (no Metal / CUDA device is the default)."""
    import mlx.core as mx  # here: importing this package must not load MLX (blas.py)

    return mx.default_device().type == mx.DeviceType.cpu


def cpu_switch(variable: str) -> bool:
    """Whether the rewrite that `variable` switches applies: on the CPU backend, unless
    EDGESPEC_CPU_OPT=0 or the variable itself is 0."""
    if os.environ.get(MASTER, "1") == "0" or os.environ.get(variable, "1") == "0":
        return False
    return on_cpu()
