"""Whether a CPU-backend rewrite applies: one place for the backend check and the switches.

Every rewrite in edgespec/cpu/ is on for MLX's CPU backend and off on a GPU (which has fused
kernels). `EDGESPEC_CPU_OPT=0` turns them all off at once; each also has its own variable
(`EDGESPEC_GROUPED_ATTENTION`, `EDGESPEC_TABLE_ROPE`, `EDGESPEC_LEAN_OPS`,
`EDGESPEC_COMPILED_BLOCKS`, `EDGESPEC_FAST_EXP`, `EDGESPEC_DRAFT_PAIRS`; row padding is opt-in,
`EDGESPEC_PAD_ROWS=1`). docs/cpu-backend.md describes each one.
"""

from __future__ import annotations

import os

import mlx.core as mx

MASTER = "EDGESPEC_CPU_OPT"


def on_cpu() -> bool:
    """True when MLX computes on the CPU backend (no Metal / CUDA device is the default)."""
    return mx.default_device().type == mx.DeviceType.cpu


def cpu_switch(variable: str) -> bool:
    """Whether the rewrite that `variable` switches applies: on the CPU backend, unless
    EDGESPEC_CPU_OPT=0 or the variable itself is 0."""
    if os.environ.get(MASTER, "1") == "0" or os.environ.get(variable, "1") == "0":
        return False
    return on_cpu()
