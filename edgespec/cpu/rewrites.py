"""The CPU-backend rewrites, behind one entry point per concern. A GPU never takes any of them.

- `optimise(model)`: the model rewrites, in place (row padding when asked, rotary tables, lean
  Linear / RMSNorm, compiled llama blocks). Idempotent.
- `new_cache(model)`: a prompt cache whose short multi-token forwards take grouped attention.
- `draft_pairs()`: whether draft steps should run two positions at a time (Intel MKL).
- `sampling_softmax()`: the faster, more accurate softmax for sampling (fastexp), or None.
- `switches()`: which of these are in force (the bench records it).

The Engine (edgespec/runtime.py) applies them and the bench records `switches()`; the decoding
core (loop, cache, drafting, sampling) never imports this package: it is handed these pieces. Switches: edgespec/cpu/switch.py
(`EDGESPEC_CPU_OPT=0` turns everything off); the BLAS preload is edgespec/cpu/blas.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from edgespec.cpu import attention, blas, blocks, fastexp, leanops, rope, rowpad
from edgespec.cpu.switch import cpu_switch, on_cpu
from edgespec.rewind import rewindable

__all__ = ["draft_pairs", "new_cache", "on_cpu", "optimise", "sampling_softmax", "switches"]


def optimise(model: Any) -> Any:
    """Apply the model rewrites that are switched on, in place; returns `model`. Each keeps the
    model's arithmetic bit for bit (tests/test_rope.py, test_leanops.py, test_blocks.py)."""
    if cpu_switch("EDGESPEC_PAD_ROWS") and blas.pads_single_rows():
        rowpad.pad_single_rows(model)  # before the lean layers: it swaps plain nn.Linear only
    rope.install(model)  # rotary embeddings from tables (same bits, fewer ops)
    leanops.install(model)  # Linear / RMSNorm without per-call transposes and broadcasts
    blocks.install(model)  # llama blocks in two compiled pieces around the attention
    return model


def new_cache(model: Any) -> list[Any]:
    """make_prompt_cache(model) with rewindable window layers (edgespec/rewind.py), marked so that
    its short multi-token forwards (verifies, catch-ups) take grouped attention
    (edgespec/cpu/attention.py) when that is switched on."""
    cache = rewindable(make_prompt_cache(model))
    attention.mark(cache)
    return cache


def draft_pairs() -> bool:
    """Whether draft steps run two positions instead of one (drafting/model.py ModelDrafter): on
    the CPU backend under Intel MKL (whose one-row products run on one thread; OpenBLAS's two-row
    ones are the slower), or everywhere on the CPU with EDGESPEC_DRAFT_PAIRS=1."""
    if not cpu_switch("EDGESPEC_DRAFT_PAIRS"):
        return False
    return os.environ.get("EDGESPEC_DRAFT_PAIRS") == "1" or blas.active() in ("mkl", "mkl-fast")


def sampling_softmax() -> Callable[[mx.array, float], mx.array] | None:
    """The softmax `sampling.warp` should use (softmax(z * scale) over the last axis), or None for
    MLX's own: the compiled fast-exp one on the CPU backend (edgespec/cpu/fastexp.py)."""
    return fastexp.softmax if fastexp.enabled() else None


def switches() -> dict[str, bool]:
    """Which rewrites are in force in this process (results.json `cpu_rewrites`)."""
    return {
        "grouped_attention": attention.enabled(),
        "table_rope": rope.enabled(),
        "lean_ops": leanops.enabled(),
        "compiled_blocks": blocks.enabled(),
        "fast_exp": fastexp.enabled(),
        "draft_pairs": draft_pairs(),
    }
