"""Grouped verify attention for the CPU: every query row of a short multi-token forward (a verify,
a catch-up) in one matrix product per KV head.

MLX's `mx.fast.scaled_dot_product_attention` has no CPU kernel; its fallback broadcasts each KV
head over its query heads and runs one small product per query head, and with a causal mask it
costs a 2-token forward about twice a one-token one (figures: docs/cpu-backend.md). One-token
steps keep MLX's path, and forwards of 2..MAX_ROWS tokens take the grouped one: the query heads
that share a KV head become rows of one (R * L) x D product.

Each row is computed as in the fallback: q * scale, scores against all keys, the causal mask (a
row never sees a later position), a precise softmax, the product with the values. With a
row-exact BLAS (the reference one; MKL strict on Intel) an L-token forward's rows keep the bits
of L one-token forwards (tests/cpu/test_blas.py checks it under the reference BLAS).

Only the CPU backend's twin of a model (edgespec/cpu/backend.py) takes this path: the twin is built
with `grouped_sdpa` as its attention (its attention modules are heads.py's subclasses of mlx-lm's,
its compiled llama blocks blocks.py's), and that takes the grouped path on the caches EdgeSpec's
states hold (`groupable`: a KVCache, or one of edgespec/rewind.py's window caches). mlx-lm's own
model object, and any other caller of mlx-lm in the process (the bench's mlx-lm peer), keep
mlx-lm's attention.

At long contexts the softmax itself is the cost (MLX's CPU exp runs element by element): with
NumPy's softmax on (`numpy_softmax`, below), every query row that sees
FROM_KEYS keys or more, in a one-token step, a verify or a prompt chunk alike, takes NumPy's
vectorised softmax; rows that see fewer keep MLX's, so short contexts run as before and each row
is computed the same way whatever forward it is part of. Where the fused kernel is built
(fused.py, attend.c: the products and the softmax in one pass over the keys and one over the
values per KV head, each row alone) those rows take it instead, in every forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from edgespec.rewind import WindowKVCache

MAX_ROWS = 32  # longer forwards (prompt chunks) keep MLX's path, unless NumPy's softmax is on
FUSED_TOKENS = 8  # query tokens per call of the fused kernel: a prompt chunk goes in pieces
FROM_KEYS = 1024  # a row that sees this many keys takes NumPy's softmax, when it is on
PIECE = 1 << 22  # scores per NumPy softmax call (16 MB): a prompt chunk goes in pieces of rows
Rows = Callable[[mx.array, int], mx.array]  # (scores [.., R * L, S], L) -> weights: numpy_softmax


def groupable(cache: Any) -> bool:
    """Whether a forward on this cache layer may take the grouped path: an EdgeSpec state's
    full-attention (KVCache) or window layer (a quantized cache has its own attention)."""
    return isinstance(cache, KVCache | WindowKVCache)


def numpy_rows(cache: Any) -> bool:
    """Whether this layer's rows may take NumPy's softmax: a full-attention layer's, or a draft's
    attention bound's (made of one). A model's own sliding-window layer attends under masks of
    its own (an array for a verify, none for a step), which would take its rows down different
    paths, so they keep MLX's softmax throughout."""
    return isinstance(cache, KVCache) or (isinstance(cache, WindowKVCache) and cache.bounded)


def causal_mask(shape: tuple[int, ...], dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
    """For scores of `shape` [..., L, S]: (allowed, -inf in `dtype`), both broadcast to `shape`;
    query row i (position S - L + i) may see key j <= S - L + i."""
    length, total = shape[-2], shape[-1]
    allowed = mx.arange(total)[None, :] <= mx.arange(total - length, total)[:, None]
    return mx.broadcast_to(allowed, shape), mx.full(shape, -mx.inf, dtype)


class Masks:
    """One backend's causal masks. Every layer of a forward asks for the same pair, so the last
    one made is kept: its few graph operations are built once per forward, not once per layer."""

    def __init__(self) -> None:
        self._last: tuple[tuple[Any, ...], tuple[mx.array, mx.array]] | None = None

    def causal(self, shape: tuple[int, ...], dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
        """causal_mask(shape, dtype), the last one kept."""
        key = (*shape, dtype)
        if self._last is None or self._last[0] != key:
            self._last = (key, causal_mask(shape, dtype))
        return self._last[1]


def grouped_attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    scale: float,
    causal: bool,
    masks: Masks | None = None,
    rows: Rows | None = None,
    fused: bool = False,
) -> mx.array:
    """softmax(q k^T * scale [+ causal mask]) v with the query heads of each KV head as rows of one
    product. queries [B, H, L, D], keys / values [B, G, S, D] (H a multiple of G, S >= L; the L
    queries are the last L positions) -> [B, H, L, D]. `masks` keeps the causal mask between
    layers (default: a fresh one); `rows`, when given, computes the masked softmax of float32
    scores (numpy_softmax) in place of MLX's, for the rows that see FROM_KEYS keys or more; with
    `fused` too, those rows take the fused kernel (fused.py), FUSED_TOKENS query tokens a call
    (each row's bits do not depend on the call it is in)."""
    b, h, length, d = queries.shape
    g, s = keys.shape[1], keys.shape[2]
    if rows is not None and queries.dtype == keys.dtype == mx.float32:
        split = numpy_from(s, length, causal)
        if split < length:
            kernel = fused_kernel(queries, keys) if fused else None
            return _split(queries, keys, values, scale, causal, masks, rows, split, kernel)
    r = h // g
    q = (queries * mx.array(scale, queries.dtype)).reshape(b, g, r * length, d)
    scores = q @ keys.swapaxes(-1, -2)  # [B, G, R * L, S]
    if causal and length > 1:
        shape = (b, g, r, length, s)
        allowed, blocked = (masks.causal if masks else causal_mask)(shape, scores.dtype)
        scores = mx.where(allowed, scores.reshape(b, g, r, length, s), blocked)
        scores = scores.reshape(b, g, r * length, s)
    weights = mx.softmax(scores, axis=-1, precise=True)
    return (weights @ values).reshape(b, h, length, d)


def fused_kernel(queries: mx.array, keys: mx.array) -> Any:
    """The fused kernel's `attend` (fused.py, imported on first use) when it is built and takes
    these shapes, else None (the NumPy softmax stays)."""
    from edgespec.cpu import fused  # not on a short run's path: rows this long are rare there

    kernel = fused.kernel()
    return kernel if kernel is not None and fused.takes(queries, keys) else None


def numpy_from(s: int, length: int, causal: bool) -> int:
    """The first of a forward's `length` query rows (the last positions of `s` keys) that sees
    FROM_KEYS keys or more: it and the rows after it take NumPy's softmax (`length`: none do).

        numpy_from(1026, 5, True) -> 2   # rows 0..4 see 1022..1026 keys
    """
    if not causal:
        return 0 if s >= FROM_KEYS else length
    return min(length, max(0, FROM_KEYS - (s - length) - 1))


def _split(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    scale: float,
    causal: bool,
    masks: Masks | None,
    rows: Rows,
    split: int,
    kernel: Any = None,
) -> mx.array:
    """grouped_attention whose query rows from `split` on (numpy_from) take `rows` as their
    softmax, PIECE scores at a time: a prompt chunk's rows against a long context would otherwise
    hold several arrays of rows x keys at once. With `kernel` (fused_kernel) those rows take it
    instead, FUSED_TOKENS query tokens a call (each call's scores stay in cache). Each part reads
    only the keys its last row may see under the causal mask (hidden keys are exact zeros either
    way, so each row keeps its bits); the rows before `split` keep MLX's softmax, as one-token
    steps there do."""
    b, h, length, d = queries.shape
    g, s = keys.shape[1], keys.shape[2]
    r = h // g
    outs = []
    if split > 0:
        end = s - length + split
        part = (queries[:, :, :split], keys[:, :, :end], values[:, :, :end])
        outs.append(grouped_attention(*part, scale, causal, masks))
    step = FUSED_TOKENS if kernel is not None else max(1, PIECE // (h * s))
    for start in range(split, length, step):
        stop = min(start + step, length)
        end = s - length + stop if causal else s
        if kernel is not None:
            part = (queries[:, :, start:stop], keys[:, :, :end], values[:, :, :end])
            outs.append(kernel(*part, scale, causal))
            continue
        q = queries[:, :, start:stop] * mx.array(scale, queries.dtype)
        scores = q.reshape(b, g, r * (stop - start), d) @ keys[:, :, :end].swapaxes(-1, -2)
        weights = rows(scores, stop - start if causal else 1)
        outs.append((weights @ values[:, :, :end]).reshape(b, h, stop - start, d))
        if step < length - split:
            mx.eval(outs[-1])  # let this piece's scores and weights go before the next
    return outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=2)


def masked_attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    scale: float,
    allowed: mx.array,
    cache: Any,
    rows: Rows | None = None,
    fused: bool = False,
) -> mx.array:
    """Attention under an explicit boolean mask allowed [L, S] (a draft tree's, edgespec/trees/),
    computed as a causal forward on the same cache would be: grouped where the cache is
    `groupable` and the forward has 2..MAX_ROWS rows (the same products, the mask in place of the causal one,
    so a chain-shaped tree keeps the chain's bits; with `rows`, its softmax of float32 scores,
    whose hidden scores become exact zeros as under the causal mask; with `fused` too, the fused
    kernel for those rows, under the mask), else MLX's kernel with the mask.
    queries [1, H, L, D], keys / values [1, G, S, D] -> [1, H, L, D]."""
    b, h, length, d = queries.shape
    g, s = keys.shape[1], keys.shape[2]
    if not (groupable(cache) and 1 < length <= MAX_ROWS) or h % g:
        return mx.fast.scaled_dot_product_attention(
            queries, keys, values, scale=scale, mask=allowed
        )
    r = h // g
    rows = rows if numpy_rows(cache) else None
    split = length if rows is None else numpy_from(s, length, True)
    kernel = fused_kernel(queries, keys) if fused and split < length else None
    if kernel is not None:
        hidden = np.asarray(allowed[split:].astype(mx.bool_)).reshape(length - split, s)
        later = kernel(queries[:, :, split:], keys, values, scale, True, hidden)
        if split == 0:
            return later
        head = masked_attention(
            queries[:, :, :split], keys, values, scale, allowed[:split], cache, None
        )
        return mx.concatenate([head, later], axis=2)
    q = (queries * mx.array(scale, queries.dtype)).reshape(b, g, r * length, d)
    scores = (q @ keys.swapaxes(-1, -2)).reshape(b, g, r, length, s)
    scores = mx.where(allowed, scores, mx.array(-mx.inf, scores.dtype))
    if scores.dtype != mx.float32:
        split = length
    parts = []
    if split > 0:
        parts.append(mx.softmax(scores[:, :, :, :split], axis=-1, precise=True))
    if split < length and rows is not None:
        later = scores[:, :, :, split:].reshape(b, g, r * (length - split), s)
        parts.append(rows(later, 1).reshape(b, g, r, length - split, s))
    weights = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=3)
    return (weights.reshape(b, g, r * length, s) @ values).reshape(b, h, length, d)


def grouped_sdpa(
    original: Callable[..., mx.array], masks: Masks, rows: Rows | None = None, fused: bool = False
) -> Callable[..., mx.array]:
    """mlx-lm's `scaled_dot_product_attention` (`original`, same signature) that takes the grouped
    path for a groupable cache's forwards of 2..MAX_ROWS rows with no mask, a causal one, or a
    window layer's boolean mask past its window (masked_attention, which keeps MLX's kernel for
    other lengths, so one-token steps there keep MLX's path). With
    `rows` (the NumPy softmax) a groupable cache's float32 forwards of every length take it once
    they reach FROM_KEYS keys, one-token steps and prompt chunks included: a row that sees that
    many keys has its softmax computed by NumPy whatever the forward's length; with `fused`,
    those rows take the fused kernel instead."""

    def scaled_dot_product_attention(
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        cache: Any,
        scale: float,
        mask: Any,
        sinks: Any = None,
    ) -> mx.array:
        if not groupable(cache):  # (a quantized cache's keys are not an array)
            return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)
        length = queries.shape[2]
        every = rows is not None and numpy_rows(cache) and keys.shape[2] >= FROM_KEYS
        if (
            (1 < length <= MAX_ROWS or (every and queries.dtype == keys.dtype == mx.float32))
            and sinks is None
            and (mask is None or (isinstance(mask, str) and mask == "causal"))
            and queries.shape[1] % keys.shape[1] == 0
        ):
            causal = mask is not None
            return grouped_attention(
                queries, keys, values, scale, causal, masks, rows if every else None, fused
            )
        if (  # a window layer past its window: a boolean mask [L, S] of its own
            isinstance(mask, mx.array)
            and mask.dtype == mx.bool_
            and mask.shape == (queries.shape[2], keys.shape[2])
            and sinks is None
        ):
            return masked_attention(queries, keys, values, scale, mask, cache, rows, fused)
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    return scaled_dot_product_attention


# ------------------------------------------------------------------ NumPy's softmax
# MLX's CPU `exp` runs element by element (~13 ns a score on an AMD EPYC); NumPy's float32 `exp`
# is vectorised (AVX2 / AVX-512, ~0.5 ns). The attention's softmax takes one exp per query row
# and key, so past a few thousand keys it is most of a forward (docs/cpu-backend.md).
# `numpy_softmax(scores, length)` evaluates the scores, computes the softmax in NumPy and hands
# MLX the weights: a graph break per layer, cheaper than the exps it replaces from about a
# thousand keys on. It computes each row alike whatever the forward's length, so that a verify's
# rows keep the bits of one-token steps where the BLAS is row-exact:
# - the causal mask is applied to the last `length` columns only (the rows' own block), as exact
#   zeros after the exp, and the row's maximum is taken over the keys it may see;
# - the row sums do not depend on trailing zeros: `lane_total` adds a row's keys in LANES running
#   sums, block by block from the first key, then the LANES sums in a fixed order, so a verify row
#   (its later keys masked to 0) sums exactly as the one-token step over its own keys does.
#   NumPy's `sum` over a row would not: its pairwise summation splits a row where its length says.
# Only float32 scores take it (the CPU backend runs models in float32).

LANES = 64  # running sums per row: wide enough that NumPy's inner loop is long


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


def numpy_softmax(scores: mx.array, length: int) -> mx.array:
    """softmax over the last axis of float32 `scores` [..., S], whose rows come in runs of
    `length` query rows for the last `length` positions (the grouped layout: [B, G, R * L, S]);
    with length > 1 the causal mask applies (row i of a run sees keys j <= S - length + i).

        numpy_softmax(mx.array([[0.0, 0.0]]), 1) -> [[0.5, 0.5]]
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
