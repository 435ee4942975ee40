"""Which block rows a block draft's layer lets each block query see
(edgespec/architectures/block_model.py).

z-lab's reference (dflash/model.py, `_attention_mask`) and vLLM's and SGLang's loaders decide per
layer: a layer is causal within the block when the config says `is_causal: true`, and, when the
config does not say, when it is a sliding-attention layer (z-lab's June 2026 DFlash layout: 5
sliding layers, no `is_causal`); DFlash2 configs say `is_causal: false`. A sliding layer hides
the keys `sliding_window` or more positions away.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx


def causal_layers(flat: dict[str, Any], layer_types: tuple[str, ...], n: int) -> tuple[bool, ...]:
    """Per layer, whether it is causal within the block (empty: none is). Our own configs carry
    `causal_layers`; else `is_causal` when given, else the layers of `layer_types` (as read,
    empty: all full attention) that slide. Example: no is_causal, types (sliding, full) ->
    (True, False)."""
    if "causal_layers" in flat:
        flags = [bool(c) for c in flat["causal_layers"]]
    elif flat.get("is_causal") is not None:
        flags = [bool(flat["is_causal"])] * n
    else:
        flags = [t == "sliding_attention" for t in layer_types]
    return tuple(flags) if any(flags) else ()


def block_mask(
    mask: mx.array | None, pos: int, length: int, window: int, causal: bool, cache: Any = None
) -> mx.array | None:
    """`mask` (boolean or additive, or None) also hiding from each block query (queries at
    pos..pos + length - 1, keys at 0..pos + length - 1) the keys `window` or more positions away
    (window > 0) and, when `causal`, the keys after it; `mask` itself when neither hides one.
    A `cache` made by a draft's attention bound (a window cache marked `bounded`, bound.Bound)
    holds only some context keys (its `positions()`): each block query sees those of its sinks
    and of its last `cache.window` positions (as a bounded token draft's query would), and every
    block key."""
    bound = cache if getattr(cache, "bounded", False) else None
    if bound is None and not causal and not (window and pos + length > window):
        return mask
    q = mx.arange(pos, pos + length)[:, None]
    held = mx.arange(pos) if bound is None else bound.positions()
    k = mx.concatenate([held, mx.arange(pos, pos + length)])[None, :]
    keep = mx.abs(q - k) < window if window else mx.ones((length, k.shape[1]), dtype=mx.bool_)
    if causal:
        keep = keep & (k <= q)
    if bound is not None:
        keep = keep & ((k >= pos) | (k > q - bound.window) | (k < bound.sinks))
    if mask is None:
        return keep
    if mask.dtype == mx.bool_:
        return mask & keep
    return mask + mx.where(keep, 0.0, -mx.inf).astype(mask.dtype)
