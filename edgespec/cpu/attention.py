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

Only the CPU backend's twin of a model (edgespec/cpu/backend.py) can take this path: its attention
modules are subclasses of mlx-lm's whose methods call `grouped_sdpa` where mlx-lm's call
`scaled_dot_product_attention` (`attending_class`; mlx-lm's modules and their functions are left
as they are), and only for caches that EdgeSpec marks (`mark(cache)`, the backend's new_cache
does on the CPU). mlx-lm's own model object, and any other caller of mlx-lm in the process (the
bench's mlx-lm peer), keep mlx-lm's attention. `EDGESPEC_GROUPED_ATTENTION=0` turns it off.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from edgespec.cpu import cpu_switch

FLAG = "_edgespec_grouped"
MAX_ROWS = 32  # longer forwards (prompt chunks) keep MLX's path
NAME = "scaled_dot_product_attention"  # mlx-lm's function, as its model modules name it


def enabled() -> bool:
    """On for the CPU backend unless EDGESPEC_GROUPED_ATTENTION=0."""
    return cpu_switch("EDGESPEC_GROUPED_ATTENTION")


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
) -> mx.array:
    """softmax(q k^T * scale [+ causal mask]) v with the query heads of each KV head as rows of one
    product. queries [B, H, L, D], keys / values [B, G, S, D] (H a multiple of G, S >= L; the L
    queries are the last L positions) -> [B, H, L, D]. `masks` keeps the causal mask between
    layers (default: a fresh one)."""
    b, h, length, d = queries.shape
    g, s = keys.shape[1], keys.shape[2]
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


def masked_attention(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, allowed: mx.array, cache: Any
) -> mx.array:
    """Attention under an explicit boolean mask allowed [L, S] (a draft tree's, edgespec/trees/),
    computed as a causal forward on the same cache would be: grouped where the cache is marked
    and the forward has 2..MAX_ROWS rows (the same products, the mask in place of the causal one,
    so a chain-shaped tree keeps the chain's bits), else MLX's kernel with the mask.
    queries [1, H, L, D], keys / values [1, G, S, D] -> [1, H, L, D]."""
    b, h, length, d = queries.shape
    g, s = keys.shape[1], keys.shape[2]
    if not (getattr(cache, FLAG, False) and 1 < length <= MAX_ROWS) or h % g:
        return mx.fast.scaled_dot_product_attention(
            queries, keys, values, scale=scale, mask=allowed
        )
    r = h // g
    q = (queries * mx.array(scale, queries.dtype)).reshape(b, g, r * length, d)
    scores = (q @ keys.swapaxes(-1, -2)).reshape(b, g, r, length, s)
    scores = mx.where(allowed, scores, mx.array(-mx.inf, scores.dtype))
    weights = mx.softmax(scores.reshape(b, g, r * length, s), axis=-1, precise=True)
    return (weights @ values).reshape(b, h, length, d)


def grouped_sdpa(original: Callable[..., mx.array], masks: Masks) -> Callable[..., mx.array]:
    """mlx-lm's `scaled_dot_product_attention` (`original`, same signature) that takes the grouped
    path for a marked cache's forwards of 2..MAX_ROWS rows with no mask or a causal one."""

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
            return grouped_attention(queries, keys, values, scale, mask is not None, masks)
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    return scaled_dot_product_attention


def attending_class(cls: type, original: Any, sdpa: Callable[..., mx.array]) -> type | None:
    """A subclass of `cls` whose methods that call `original` (mlx-lm's function, looked up in
    their module's globals) call `sdpa` instead: the same code objects run with globals that name
    `sdpa`, so mlx-lm's modules stay as they are. None when no method of `cls` calls `original`.

        attending_class(llama.Attention, base.scaled_dot_product_attention, grouped)
            -> class Attention(llama.Attention) whose __call__ calls `grouped`
    """
    methods: dict[str, Any] = {}
    seen: set[str] = set()
    for klass in cls.__mro__:
        for name, fn in vars(klass).items():
            if name in seen:
                continue  # overridden lower in the MRO: that one runs
            seen.add(name)
            calls = isinstance(fn, types.FunctionType) and NAME in fn.__code__.co_names
            if calls and fn.__globals__.get(NAME) is original:
                methods[name] = _with_global(fn, sdpa)
    if not methods:
        return None
    return type(cls.__name__, (cls,), {**methods, "__module__": __name__})


def _with_global(fn: types.FunctionType, sdpa: Callable[..., mx.array]) -> types.FunctionType:
    """`fn` with its module's globals, except NAME -> sdpa."""
    scope = {**fn.__globals__, NAME: sdpa}
    out = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    out.__kwdefaults__, out.__qualname__, out.__doc__ = (
        fn.__kwdefaults__,
        fn.__qualname__,
        fn.__doc__,
    )
    return out


def mark(cache: list[Any]) -> None:
    """Let these cache layers' short multi-token forwards take the grouped path (when enabled)."""
    if not enabled():
        return
    for layer in cache:
        if hasattr(layer, "bits"):  # a quantized cache has its own attention
            continue
        setattr(layer, FLAG, True)
