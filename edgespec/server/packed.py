"""One target forward for several sequences: each brings its own cache and its own new tokens,
and their rows run through the model together.

A verify is a short forward (the pending token and K drafts) whose cost on a laptop is mostly
reading the weights: on Metal a decode step is memory-bound, and on a 2-core CPU a product of a
few rows costs about what one row does. Several requests' verifies packed into one forward read
the weights once. What depends on a sequence stays that sequence's own:

- the rows of the projections, norms and MLP are row-wise, so a row gives what it gives alone
  (with a BLAS whose products do not depend on the row count; other BLAS differ in the last
  bits, as a verify's rows already do against one-token steps);
- each row is rotated at its own position (its sequence's cache offset + its index, the tree
  forward's per-row rotary, edgespec/trees/forward.py);
- the attention runs per sequence, on that sequence's cache: its rows are appended there and
  attend causally to what that cache holds, with the same attention a lone forward of that
  length takes (MLX's kernel; the CPU's grouped one for 2..32 rows, `Kernels`).

So a packed forward leaves every cache as its own forward would, and the caller rewinds each one
on its own (KVState.rewind). Supported: the models and caches a draft tree runs on (llama-style
blocks over plain KVCache layers: `packable`); the server runs others one forward each.

    logits = packed_forward(model, [(cache_a, ids_a), (cache_b, ids_b)], kernels)
    # logits[0] [len(ids_a), V] as model(ids_a[None], cache=cache_a)[0] gives it
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from edgespec.cache import KVState
from edgespec.errors import TreeUnsupportedError
from edgespec.trees.forward import (
    PLAIN,
    Kernels,
    Rotary,
    block_qkv,
    check_tree_cache,
    head_of,
    mlx_attention,
    tree_layers,
)

Part = tuple[list[Any], mx.array]  # (a sequence's cache layers, its new tokens [L] int32)


def packable(state: KVState) -> bool:
    """Whether `state`'s forwards can be packed with others' (llama-style blocks, plain KV
    caches)."""
    try:
        tree_layers(state.model)
        check_tree_cache(state.cache, state.name)
    except TreeUnsupportedError:
        return False
    return True


def causal(length: int, total: int) -> mx.array:
    """allowed [L, S]: row i (position S - L + i) sees keys 0..S - L + i."""
    return mx.arange(total)[None, :] <= mx.arange(total - length, total)[:, None]


def attend(
    q: mx.array, k: mx.array, v: mx.array, scale: float, cache: Any, kernels: Kernels
) -> mx.array:
    """One sequence's causal attention, as its lone forward of this length computes it: one row
    by MLX's kernel without a mask (mlx-lm's one-token step); more by the backend's attention
    under the causal mask (the CPU's grouped path), or MLX's causal kernel."""
    length, total = q.shape[2], k.shape[2]
    if length == 1:
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=None)
    if kernels.attention is mlx_attention:
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")
    return kernels.attention(q, k, v, scale, causal(length, total), cache)


def packed_forward(model: Any, parts: Sequence[Part], kernels: Kernels = PLAIN) -> list[mx.array]:
    """One forward of a token model over several sequences' new tokens (module docstring):
    logits [L_i, V] per part, lazy; appends L_i positions to each part's cache."""
    lengths = [int(ids.shape[0]) for _, ids in parts]
    starts = [sum(lengths[:i]) for i in range(len(parts))]
    offsets = [int(cache[0].offset) for cache, _ in parts]
    positions = mx.concatenate(
        [mx.arange(o, o + n) for o, n in zip(offsets, lengths, strict=True)]
    ).astype(mx.int32)
    trunk = model.model
    h = trunk.embed_tokens(mx.concatenate([ids for _, ids in parts])[None])
    rotary = Rotary(positions)
    for i, layer in enumerate(tree_layers(model)):
        q, k, v, finish = block_qkv(layer, h, rotary, kernels)
        heads = []
        for (cache, _), a, n in zip(parts, starts, lengths, strict=True):
            keys, values = cache[i].update_and_fetch(k[:, :, a : a + n], v[:, :, a : a + n])
            heads.append(
                attend(q[:, :, a : a + n], keys, values, layer.self_attn.scale, cache[i], kernels)
            )
        h = finish(mx.concatenate(heads, axis=2))
    logits = head_of(model)(trunk.norm(h))[0]
    return [logits[a : a + n] for a, n in zip(starts, lengths, strict=True)]
