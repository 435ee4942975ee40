"""Rotary position embeddings from precomputed tables, for MLX's CPU backend.

`mx.fast.rope` has no CPU kernel: on the CPU it runs its fallback graph, which recomputes the
frequencies, the angles and their cosines and sines on every call (29 operations, counted with
mx.export_to_dot). A model calls it twice per layer per forward: 60 calls per SmolLM2-135M
decode step. `TableRoPE` computes the cosines and sines once, with the same MLX operations as the
fallback (so every entry has the same bits), and applies them in 6 operations: rotate-half (two
slices and a concatenation), two products and a sum. The forward's rows of the tables, broadcast
to the queries' and the keys' shapes, are made once per forward and shared by its layers.

Its measured effect on a forward: docs/cpu-backend.md.

The output is bit-identical to `mx.fast.rope` (tests/cpu/test_rope.py compares them over offsets,
lengths, bases and scales), so nothing EdgeSpec computes changes, only its speed. Only the
non-traditional `nn.RoPE` that most models use is replaced; other rotary classes (Llama 3's,
YaRN, ...) keep theirs, and only in the CPU backend's twin of a model (edgespec/cpu/backend.py):
mlx-lm's model object keeps its nn.RoPE. GPUs have a fused kernel and keep it.
`EDGESPEC_CPU_OPT=-table_rope` turns this off.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import mlx.core as mx
import mlx.nn as nn

FIRST_TABLE = 4096  # positions; a table doubles when a forward reaches past its end


def table(dims: int, base: float, scale: float, positions: int) -> tuple[mx.array, mx.array]:
    """(C, S), each [N, dims] float32 with N >= positions (N = FIRST_TABLE doubled as needed):
    for a row p and i < dims / 2, C[p] = [cos t, cos t], S[p] = [-sin t, sin t] with
    t = (p * scale) * base^(-2i / dims), computed as `mx.fast.rope`'s fallback computes it (so
    the same bits)."""
    n = FIRST_TABLE
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
    return made


class Tables:
    """One CPU backend's rotary tables (shared by every layer alike) and the table rows of its
    latest forwards. Every layer of a forward asks for the same rows (the queries' and the keys'
    shapes), so the last few are kept: 4 graph operations per call fewer."""

    def __init__(self) -> None:
        self.tables: dict[tuple[int, float, float], tuple[mx.array, mx.array]] = {}
        self._rows: dict[tuple[Any, ...], tuple[mx.array, mx.array]] = {}
        self._lock = threading.Lock()

    def table(
        self, dims: int, base: float, scale: float, positions: int
    ) -> tuple[mx.array, mx.array]:
        """`table(...)` for these settings, made once and doubled when a forward needs more."""
        key = (dims, float(base), float(scale))
        with self._lock:
            found = self.tables.get(key)
            if found is None or found[0].shape[0] < positions:
                wanted = positions if found is None else max(positions, 2 * found[0].shape[0])
                found = self.tables[key] = table(dims, base, scale, wanted)
            return found

    def rows(self, rope: nn.RoPE, offset: int, shape: tuple[int, ...]) -> tuple[mx.array, mx.array]:
        """The table rows of positions offset.. for an input of `shape` [..., L, dims] of
        `rope`'s settings, broadcast to it."""
        key = (rope.dims, rope.base, rope.scale, offset, shape)
        found = self._rows.get(key)
        if found is None:
            length = shape[-2]
            c, s = self.table(rope.dims, rope.base, rope.scale, offset + length)
            c, s = c[offset : offset + length], s[offset : offset + length]
            found = (mx.broadcast_to(c, shape), mx.broadcast_to(s, shape))
            if len(self._rows) >= 8:
                self._rows.clear()
            self._rows[key] = found
        return found


class TableRoPE(nn.RoPE):
    """A non-traditional `nn.RoPE` whose rotation comes from a backend's `Tables` (same call,
    same output bits, and like it no parameters). The CPU backend gives its model twin one in
    place of each plain non-traditional nn.RoPE (`twin_class`); `tables` is that backend's.

    x [..., L, D] at positions offset..offset + L - 1: the first `dims` features of each row
    become x * C + rotate_half(x) * S, which is x1 cos - x2 sin and x2 cos + x1 sin term by term as
    in the fallback (a - b equals a + (-b), and addition commutes, exactly); the rest pass through.
    """

    tables: Tables

    def __init__(
        self,
        dims: int,
        traditional: bool = False,
        base: float = 10000,
        scale: float = 1.0,
        tables: Tables | None = None,
    ):
        super().__init__(dims, traditional=traditional, base=base, scale=scale)
        self.tables = tables if tables is not None else Tables()

    def _tabled(self) -> bool:
        return not self.traditional and not self.dims % 2

    def __call__(self, x: mx.array, offset: Any = 0) -> mx.array:
        if not self._tabled() or not isinstance(offset, int) or x.dtype != mx.float32:
            return super().__call__(x, offset=offset)
        dims = self.dims
        if dims == x.shape[-1]:
            return rotate(x, *self._rows(offset, tuple(x.shape)))
        head, rest = x[..., :dims], x[..., dims:]
        return mx.concatenate([rotate(head, *self._rows(offset, tuple(head.shape))), rest], axis=-1)

    def whole(self, features: int) -> bool:
        """Whether this module rotates all of rows of `features` features from the tables
        (blocks.py then rotates inside its compiled function, with `_rows`' rows)."""
        return self._tabled() and self.dims == features

    def _rows(self, offset: int, shape: tuple[int, ...]) -> tuple[mx.array, mx.array]:
        return self.tables.rows(self, offset, shape)


def rotate(x: mx.array, c: mx.array, s: mx.array) -> mx.array:
    """x [..., D] rotated by table rows c, s of x's shape: x * c + rotate_half(x) * s."""
    half = x.shape[-1] // 2
    rotated = mx.concatenate([x[..., half:], x[..., :half]], axis=-1)
    return x * c + rotated * s


def twin_class(key: str, module: Any) -> type | None:
    """TableRoPE for a plain non-traditional nn.RoPE of even dims held as `rope` (other rotary
    classes, Llama 3's, YaRN, ..., keep theirs), else None."""
    if key != "rope" or type(module) is not nn.RoPE:
        return None
    return TableRoPE if not module.traditional and not module.dims % 2 else None
