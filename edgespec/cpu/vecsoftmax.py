"""The attention's softmax through NumPy, for MLX's CPU backend at long contexts.

MLX's CPU `exp` runs element by element (~13 ns a score on an AMD EPYC); NumPy's float32 `exp`
is vectorised (AVX2 / AVX-512, ~0.5 ns). The attention's softmax takes one exp per query row and
key, so past a few thousand keys it is most of a forward: at 8,192 keys one layer of the
embedded target spends 4.7 ms of a 5-row verify's 10 ms in it, and a 512-token prompt chunk
hundreds of milliseconds (figures: docs/cpu-backend.md).

`softmax(scores, length)` evaluates the scores, computes the softmax in NumPy and hands MLX the
weights: a graph break per layer, cheaper than the exps it replaces from a few hundred keys on.
It computes each row alike whatever the forward's length, so that a verify's rows keep the bits
of one-token steps where the BLAS is row-exact (edgespec/cpu/attention.py):
- the causal mask is applied to the last `length` columns only (the rows' own block), as exact
  zeros after the exp, and the row's maximum is taken over the keys it may see;
- the row sums do not depend on trailing zeros: `lane_total` adds a row's keys in LANES running
  sums, block by block from the first key, then the LANES sums in a fixed order, so a verify row
  (its later keys masked to 0) sums exactly as the one-token step over its own keys does.
NumPy's `sum` over a row would not: its pairwise summation splits a row where its length says.

Only float32 scores take it (the CPU backend runs models in float32); `EDGESPEC_NUMPY_SOFTMAX=0`
keeps MLX's softmax (and then one-token steps and prompt chunks keep MLX's attention as well).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from edgespec.cpu import cpu_switch

LANES = 64  # running sums per row: wide enough that NumPy's inner loop is long


def enabled() -> bool:
    """On for the CPU backend unless EDGESPEC_NUMPY_SOFTMAX=0."""
    return cpu_switch("EDGESPEC_NUMPY_SOFTMAX")


def lane_total(e: np.ndarray) -> np.ndarray:
    """The sums of e [..., S] over its last axis, kept as [..., 1], computed so that appending
    zeros to a row leaves its sum's bits alone: LANES running sums fed block by block (a
    reduction over the blocks' axis, which NumPy runs block after block), the tail added to the
    first lanes, then the LANES sums added in one fixed order.

        lane_total(np.array([[1.0, 2.0]], np.float32)) -> [[3.0]]
    """
    s = e.shape[-1]
    full = s - s % LANES
    lanes = e[..., :full].reshape(*e.shape[:-1], full // LANES, LANES).sum(axis=-2)
    if full < s:
        lanes[..., : s - full] += e[..., full:]
    return lanes.sum(axis=-1, keepdims=True)


def softmax(scores: mx.array, length: int) -> mx.array:
    """softmax over the last axis of float32 `scores` [..., S], whose rows come in runs of
    `length` query rows for the last `length` positions (the grouped layout: [B, G, R * L, S]);
    with length > 1 the causal mask applies (row i of a run sees keys j <= S - length + i).

        softmax(mx.array([[0.0, 0.0]]), 1) -> [[0.5, 0.5]]
    """
    a = np.asarray(scores)
    s = a.shape[-1]
    rows = a.reshape(-1, length, s)
    if length > 1:
        hidden = ~np.tri(length, dtype=bool)  # [L, L]: True where a row may not look
        block = rows[..., s - length :]
        top = np.where(hidden, -np.inf, block).max(axis=-1, keepdims=True)
        if s > length:
            top = np.maximum(top, rows[..., : s - length].max(axis=-1, keepdims=True))
    else:
        top = rows.max(axis=-1, keepdims=True)
    e = np.subtract(rows, top)
    with np.errstate(over="ignore"):  # a hidden score above the row's maximum: zeroed below
        np.exp(e, out=e)
    if length > 1:
        e[..., s - length :][:, hidden] = 0.0
    e /= lane_total(e)
    return mx.array(e.reshape(a.shape))
