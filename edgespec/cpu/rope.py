"""Rotary position embeddings from precomputed tables, for MLX's CPU backend.

`mx.fast.rope` has no CPU kernel: on the CPU it runs its fallback graph, which recomputes the
frequencies, the angles and their cosines and sines on every call (29 operations, counted with
mx.export_to_dot). A model calls it twice per layer per forward: 60 calls per SmolLM2-135M
decode step. `TableRoPE` computes the cosines and sines once, with the same MLX operations as the
fallback (so every entry has the same bits), and applies them in 6 operations: rotate-half (two
slices and a concatenation), two products and a sum. The forward's rows of the tables, broadcast
to the queries' and the keys' shapes, are made once per forward and shared by its layers.

Its measured effect on a forward: docs/cpu-backend.md.

The output is bit-identical to `mx.fast.rope` (tests/test_rope.py compares them over offsets,
lengths, bases and scales), so nothing EdgeSpec computes changes, only its speed. Only the
non-traditional `nn.RoPE` that most models use is replaced; other rotary classes (Llama 3's,
YaRN, ...) keep theirs. GPUs have a fused kernel and keep it. `EDGESPEC_TABLE_ROPE=0` turns this
off. Inside `native()` every TableRoPE runs MLX's own path: the bench's mlx-lm peer runs that
way, so it is measured as mlx-lm runs.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from edgespec.cpu.switch import cpu_switch

FIRST_TABLE = 4096  # positions; a table doubles when a forward reaches past its end

_tables: dict[tuple[int, float, float], tuple[mx.array, mx.array]] = {}
_lock = threading.Lock()
_native = threading.local()
_rows_kept: dict[tuple[Any, ...], tuple[mx.array, mx.array]] = {}  # see TableRoPE._rows


def enabled() -> bool:
    """On for the CPU backend unless EDGESPEC_TABLE_ROPE=0."""
    return cpu_switch("EDGESPEC_TABLE_ROPE")


def in_native() -> bool:
    """Whether this thread is inside a `native()` block."""
    return bool(getattr(_native, "depth", 0))


@contextlib.contextmanager
def native() -> Iterator[None]:
    """Within this block (on this thread) every TableRoPE runs `mx.fast.rope` instead, and the
    lean layers of leanops.py run nn.Linear's and nn.RMSNorm's own code."""
    depth = getattr(_native, "depth", 0)
    _native.depth = depth + 1
    try:
        yield
    finally:
        _native.depth = depth


def table(dims: int, base: float, scale: float, positions: int) -> tuple[mx.array, mx.array]:
    """(C, S), each [N, dims] float32 with N >= positions: for a row p and i < dims / 2,
    C[p] = [cos t, cos t], S[p] = [-sin t, sin t] with t = (p * scale) * base^(-2i / dims), computed
    as `mx.fast.rope`'s fallback computes it (so the same bits). Shared by every layer alike."""
    key = (dims, float(base), float(scale))
    with _lock:
        found = _tables.get(key)
        if found is not None and found[0].shape[0] >= positions:
            return found
        n = FIRST_TABLE if found is None else found[0].shape[0]
        while n < positions:
            n *= 2
        half = dims // 2
        pos = mx.arange(n, dtype=mx.float32) * mx.array(scale, mx.float32)
        inv_freqs = mx.exp(
            mx.arange(0, -half, -1, dtype=mx.float32) * mx.array(math.log(base) / half, mx.float32)
        )
        theta = mx.expand_dims(pos, 1) * mx.expand_dims(inv_freqs, 0)
        cos, sin = mx.cos(theta), mx.sin(theta)
        made = (mx.concatenate([cos, cos], axis=-1), mx.concatenate([-sin, sin], axis=-1))
        mx.eval(made)
        _tables[key] = made
        return made


class TableRoPE(nn.RoPE):
    """A drop-in for a non-traditional `nn.RoPE` (same call, same output bits, and like it no
    parameters, so model trees keep their shape).

    x [..., L, D] at positions offset..offset + L - 1: the first `dims` features of each row
    become x * C + rotate_half(x) * S, which is x1 cos - x2 sin and x2 cos + x1 sin term by term as
    in the fallback (a - b equals a + (-b), and addition commutes, exactly); the rest pass through.
    """

    def _tabled(self) -> bool:
        """Whether this module's rotation comes from the tables (else MLX's own rope)."""
        return not in_native() and not self.traditional and not self.dims % 2

    def __call__(self, x: mx.array, offset: Any = 0) -> mx.array:
        if not self._tabled() or not isinstance(offset, int) or x.dtype != mx.float32:
            return super().__call__(x, offset=offset)
        dims = self.dims
        if dims == x.shape[-1]:
            return rotate(x, *self._rows(offset, tuple(x.shape)))
        head, rest = x[..., :dims], x[..., dims:]
        return mx.concatenate([rotate(head, *self._rows(offset, tuple(head.shape))), rest], axis=-1)

    def whole(self, features: int) -> bool:
        """Whether this module takes its table path on rows of `features` features, all of them
        rotated (blocks.py then rotates inside its compiled function, with `_rows`' rows)."""
        return self._tabled() and self.dims == features

    def _rows(self, offset: int, shape: tuple[int, ...]) -> tuple[mx.array, mx.array]:
        """The table rows of positions offset.. for an input of `shape` [..., L, dims], broadcast
        to it. Every layer of a forward asks for the same ones (queries' and keys' shapes), so
        the last few are kept: 4 graph operations per call fewer."""
        key = (self.dims, self.base, self.scale, offset, shape)
        found = _rows_kept.get(key)
        if found is None:
            length = shape[-2]
            c, s = table(self.dims, self.base, self.scale, offset + length)
            c, s = c[offset : offset + length], s[offset : offset + length]
            found = (mx.broadcast_to(c, shape), mx.broadcast_to(s, shape))
            if len(_rows_kept) >= 8:
                _rows_kept.clear()
            _rows_kept[key] = found
        return found


def rotate(x: mx.array, c: mx.array, s: mx.array) -> mx.array:
    """x [..., D] rotated by table rows c, s of x's shape: x * c + rotate_half(x) * s."""
    half = x.shape[-1] // 2
    rotated = mx.concatenate([x[..., half:], x[..., :half]], axis=-1)
    return x * c + rotated * s


def install(model: Any) -> int:
    """Replace `model`'s non-traditional `nn.RoPE` modules by TableRoPE (when enabled).
    Returns how many were replaced (0 when off, or already done)."""
    if not enabled() or not isinstance(model, nn.Module):
        return 0
    owners = [m for _, m in model.named_modules() if type(m.get("rope")) is nn.RoPE]
    for module in owners:
        old = module["rope"]
        if not old.traditional:
            module.rope = TableRoPE(old.dims, traditional=False, base=old.base, scale=old.scale)
    return sum(isinstance(m.get("rope"), TableRoPE) for m in owners)
