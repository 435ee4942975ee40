"""One-row matrix products run as two rows, for BLAS libraries whose one-row path is slow.

Intel MKL computes a one-row product (x [1, d] @ W.T, a matrix-vector product) on one thread and a
two-row one on every thread, so on a 2-core machine two rows cost less than one (OpenBLAS is the
other way round; figures: docs/cpu-backend.md). Decoding multiplies one row at a time (every plain step, every draft step), so the layers here
repeat the row, multiply two rows and keep the first; logits are identical to the one-row product
(tested: MKL's exact mode gives a row the same bits whatever the row count on Intel; elsewhere the
two paths may differ in the last bits, like any verify forward's rows).

Why it is off by default (EDGESPEC_PAD_ROWS=1 turns it on): a lone target forward gets faster,
but the decode loop got slower in a paired end-to-end run (docs/cpu-backend.md). The loop is
pipelined: the host builds the next step's graph while the current one
computes, and on 2 cores MKL's second thread takes the core the host was using (with
KMP_BLOCKTIME=0, so that it sleeps instead of spinning, everything ran far slower). On a machine
with more cores than MKL's threads it may pay; measure with `edgespec bench`.

In the CPU backend's twin of a model (edgespec/cpu/backend.py) the subclasses below stand for its
dense `nn.Linear` / `nn.Embedding` modules (`twin_class`; same parameter arrays, same names) and a
feature draft's head gets the padded product (`pad_head`); `blas.pads_single_rows()` says
whether to. mlx-lm's model object keeps its layers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn


def _one_row(x: mx.array) -> bool:
    return x.ndim >= 2 and x.size == x.shape[-1]


def _as_two_rows(f: Callable[[mx.array], mx.array], x: mx.array) -> mx.array:
    """f(x) for a row-wise product f; a one-row x runs as two (the row repeated), keeping the first."""
    if _one_row(x):
        return f(mx.concatenate([x, x], axis=-2))[..., :1, :]
    return f(x)


def matmul_t(x: mx.array, w: mx.array, pad: bool) -> mx.array:
    """x @ w.T, a one-row x run as two rows when `pad`."""
    return _as_two_rows(lambda v: v @ w.T, x) if pad else x @ w.T


class RowPadLinear(nn.Linear):
    """nn.Linear whose one-row products run as two rows (module docstring)."""

    def __call__(self, x: mx.array) -> mx.array:
        return _as_two_rows(super().__call__, x)


class RowPadEmbedding(nn.Embedding):
    """nn.Embedding whose `as_linear` (a tied output head) runs one row as two."""

    def as_linear(self, x: mx.array) -> mx.array:
        return _as_two_rows(super().as_linear, x)


def twin_class(module: Any) -> type | None:
    """The row-padding twin of a dense nn.Linear / nn.Embedding, else None."""
    padded: dict[type, type] = {nn.Linear: RowPadLinear, nn.Embedding: RowPadEmbedding}
    return padded.get(type(module))


def pad_head(module: Any) -> None:
    """Give a module with a `head_product` attribute (a feature draft's head, architectures/eagle.py;
    in a twin) the padded product x @ w.T."""
    if hasattr(module, "head_product"):
        object.__setattr__(module, "head_product", _padded_product)


def _padded_product(x: mx.array, w: mx.array) -> mx.array:
    return matmul_t(x, w, pad=True)
