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
of L one-token forwards (tests/test_blas.py checks it under the reference BLAS).

Only caches that EdgeSpec marks (`mark(cache)`, KVState does on the CPU) take this path; any
other caller of mlx-lm in the process (the bench's mlx-lm peer) keeps mlx-lm's own attention.
`EDGESPEC_GROUPED_ATTENTION=0` turns it off.
"""

from __future__ import annotations

import sys
from typing import Any

import mlx.core as mx

from edgespec.cpu.switch import cpu_switch

FLAG = "_edgespec_grouped"
MAX_ROWS = 32  # longer forwards (prompt chunks) keep MLX's path
_ORIGINAL = "_edgespec_original_sdpa"


def enabled() -> bool:
    """On for the CPU backend unless EDGESPEC_GROUPED_ATTENTION=0."""
    return cpu_switch("EDGESPEC_GROUPED_ATTENTION")


_last_mask: tuple[tuple[Any, ...], tuple[mx.array, mx.array]] | None = None


def causal_mask(shape: tuple[int, ...], dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
    """For scores of `shape` [..., L, S]: (allowed, -inf in `dtype`), both broadcast to `shape`;
    query row i (position S - L + i) may see key j <= S - L + i. Every layer of a forward asks for
    the same pair, so the last one made is kept: its few graph operations are built once per
    forward, not once per layer."""
    global _last_mask
    kept = _last_mask
    key = (*shape, dtype)
    if kept is not None and kept[0] == key:
        return kept[1]
    length, total = shape[-2], shape[-1]
    allowed = mx.arange(total)[None, :] <= mx.arange(total - length, total)[:, None]
    made = (mx.broadcast_to(allowed, shape), mx.full(shape, -mx.inf, dtype))
    _last_mask = (key, made)
    return made


def grouped_attention(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, causal: bool
) -> mx.array:
    """softmax(q k^T * scale [+ causal mask]) v with the query heads of each KV head as rows of one
    product. queries [B, H, L, D], keys / values [B, G, S, D] (H a multiple of G, S >= L; the L
    queries are the last L positions) -> [B, H, L, D]."""
    b, h, length, d = queries.shape
    g, s = keys.shape[1], keys.shape[2]
    r = h // g
    q = (queries * mx.array(scale, queries.dtype)).reshape(b, g, r * length, d)
    scores = q @ keys.swapaxes(-1, -2)  # [B, G, R * L, S]
    if causal and length > 1:
        allowed, blocked = causal_mask((b, g, r, length, s), scores.dtype)
        scores = mx.where(allowed, scores.reshape(b, g, r, length, s), blocked)
        scores = scores.reshape(b, g, r * length, s)
    weights = mx.softmax(scores, axis=-1, precise=True)
    return (weights @ values).reshape(b, h, length, d)


def _wrap(original: Any) -> Any:
    def scaled_dot_product_attention(
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        cache: Any,
        scale: float,
        mask: Any,
        sinks: Any = None,
    ) -> mx.array:
        length = queries.shape[2]
        if (
            getattr(cache, FLAG, False)
            and 1 < length <= MAX_ROWS
            and sinks is None
            and (mask is None or (isinstance(mask, str) and mask == "causal"))
            and queries.shape[1] % keys.shape[1] == 0
        ):
            return grouped_attention(queries, keys, values, scale, mask is not None)
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    setattr(scaled_dot_product_attention, _ORIGINAL, original)
    return scaled_dot_product_attention


def install() -> None:
    """Route mlx-lm's model modules' attention through the wrapper (idempotent; modules imported
    later are covered by the next call). Unmarked caches still reach mlx-lm's own function."""
    from mlx_lm.models import base

    original = getattr(
        base.scaled_dot_product_attention, _ORIGINAL, base.scaled_dot_product_attention
    )
    for name, module in list(sys.modules.items()):
        if not name.startswith("mlx_lm.models.") or module is None:
            continue
        # Only mlx-lm's own function (its signature): a module may bind another one to the name.
        if getattr(module, "scaled_dot_product_attention", None) is original:
            module.scaled_dot_product_attention = _wrap(original)  # type: ignore[attr-defined]


def mark(cache: list[Any]) -> None:
    """Let these cache layers' short multi-token forwards take the grouped path (when enabled)."""
    if not enabled():
        return
    install()
    for layer in cache:
        if hasattr(layer, "bits"):  # a quantized cache has its own attention
            continue
        setattr(layer, FLAG, True)
