"""One forward over a draft tree, and the cache compaction after it.

mlx-lm's models build their own causal mask and apply RoPE at one scalar offset, so a tree (whose
siblings share a position and see only their own ancestors) runs through the model's layers here:
the same modules (norms, projections, rotary embedding, MLP; whatever the CPU rewrites made of
them), with
- per-node positions: the rotary module is called on the nodes as a batch of one-row sequences,
  each with its own offset (`mx.fast.rope` takes a vector of offsets; the same bits as a scalar
  offset), once per forward for a plain RoPE (`Rotary`);
- an explicit boolean mask [L, S] (edgespec/trees/shapes.py `tree_mask`), in the attention the chain's
  forward would use on the same cache: MLX's kernel (its fused one on a GPU) with the mask, or
  what the backend hands in (`Kernels`: the Engine passes its backend's, on the CPU the grouped
  verify attention and compiled blocks; this package never imports edgespec.cpu).
A chain-shaped tree therefore gives the logits of the ordinary forward (tested bit for bit).

Supported: llama-style blocks (mlx-lm's llama, mistral, qwen2, qwen3; EdgeSpec's token and
feature drafts, whose blocks are llama's) with plain KVCache layers. Others raise
TreeUnsupportedError with one line.

Cache invariant after `compact`: the cache holds its first `keep` positions, then the rows it
was told to keep (the accepted path's nodes), moved down to keep, keep + 1, ...; their keys and
values were computed at exactly those positions (RoPE) over exactly those ancestors (the mask),
so they equal what a chain forward over the path would have stored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from edgespec.errors import TreeUnsupportedError
from edgespec.taps import TOP

BLOCK_MODULES = ("mlx_lm.models.llama", "mlx_lm.models.qwen2", "mlx_lm.models.qwen3")


def tree_layers(model: Any) -> list[Any]:
    """The transformer blocks of a model the tree forward can run (target, token or feature
    draft), or TreeUnsupportedError naming what is missing."""
    layers = getattr(model, "layers", None)
    if layers is None:
        layers = getattr(getattr(model, "model", None), "layers", None)
    kind = getattr(model, "model_type", type(model).__name__)
    if not layers:
        raise TreeUnsupportedError(f"tree drafting does not support {kind} models (no layers)")
    for layer in layers:
        block_kind = type(layer).__mro__  # a CPU rewrite subclasses mlx-lm's block
        ok = any(
            c.__module__ in BLOCK_MODULES and c.__name__ == "TransformerBlock" for c in block_kind
        )
        if not ok or getattr(layer, "use_sliding", False):
            raise TreeUnsupportedError(
                f"tree drafting supports llama, mistral, qwen2 and qwen3 models; {kind} "
                f"({type(layer).__module__}.{type(layer).__name__}) is not one: use --tree chain"
            )
    return list(layers)


def check_tree_cache(cache: Sequence[Any], name: str) -> None:
    """TreeUnsupportedError unless every layer is a plain KVCache (a tree forward rewrites it)."""
    bad = sorted({type(c).__name__ for c in cache if not isinstance(c, KVCache)})
    if bad:
        raise TreeUnsupportedError(
            f"{name}: tree drafting needs plain KV caches, not {', '.join(bad)}; use --tree chain"
        )


def mlx_attention(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, allowed: mx.array, cache: Any
) -> mx.array:
    """softmax(q k^T * scale, masked) v by MLX's kernel. queries [1, H, L, D], keys / values
    [1, G, S, D] (H a multiple of G), allowed bool [L, S] -> [1, H, L, D]; `cache` unused."""
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=allowed)


def no_parts(layer: Any, x: mx.array) -> tuple[Any, Any] | None:
    """No compiled block parts: every block runs module by module."""
    return None


Attention = Callable[[mx.array, mx.array, mx.array, float, mx.array, Any], mx.array]
BlockParts = Callable[[Any, mx.array], "tuple[Any, Any] | None"]


@dataclass(frozen=True)
class Kernels:
    """What a backend may put into a tree forward: `attention(q, k, v, scale, allowed, cache)`
    (as `mlx_attention`) and `parts(layer, x)`, a block's compiled (before, after) functions
    around the attention or None. The Engine passes its backend's (`Backend.kernels`; on the CPU
    the grouped attention and compiled block parts, which keep the bits of the chain's forward
    on the same cache); the defaults are MLX's own."""

    attention: Attention = mlx_attention
    parts: BlockParts = no_parts


PLAIN = Kernels()


def _rope(rope: Any, x: mx.array, positions: mx.array) -> mx.array:
    """x [1, H, L, D] rotated at per-row positions [L]: the L rows as a batch of one-row
    sequences, each at its own offset."""
    return rope(x.transpose(2, 1, 0, 3), offset=positions).transpose(2, 1, 0, 3)


class Rotary:
    """The rotary embedding of one forward's rows at per-row positions, shared by its layers.

    A plain non-traditional `nn.RoPE` over the whole head (SmolLM2's, Qwen's; the CPU's
    TableRoPE is one) is the map x -> x * C + rotate_half(x) * S with C = [cos, cos] and
    S = [-sin, sin] per row. Both are read off the module itself once per forward, from its
    output on two basis rows ([1, 0] gives [cos, sin], [0, 1] gives [-sin, cos], exactly), so
    each layer then rotates in 6 operations instead of running the rope (29 on the CPU). Other
    rotary modules run per layer (`_rope`)."""

    def __init__(self, positions: mx.array):
        self.positions = positions
        self.tables: dict[tuple[Any, ...], tuple[mx.array, mx.array]] = {}

    def __call__(self, rope: Any, x: mx.array) -> mx.array:
        d = x.shape[-1]
        if not isinstance(rope, nn.RoPE) or rope.traditional or rope.dims != d or d % 2:
            return _rope(rope, x, self.positions)
        key = (type(rope), rope.dims, rope.base, rope.scale, x.dtype)
        if key not in self.tables:
            self.tables[key] = self._tables(rope, d, x.dtype)
        c, s = self.tables[key]
        half = d // 2
        return x * c + mx.concatenate([x[..., half:], x[..., :half]], axis=-1) * s

    def _tables(self, rope: Any, d: int, dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
        half, n = d // 2, self.positions.shape[0]
        first = (mx.arange(d) < half).astype(dtype)
        a = _rope(rope, mx.broadcast_to(first, (1, 1, n, d)), self.positions)  # [cos, sin]
        b = _rope(rope, mx.broadcast_to(1 - first, (1, 1, n, d)), self.positions)  # [-sin, cos]
        c = mx.concatenate([a[..., :half], b[..., half:]], axis=-1)  # [cos, cos]
        s = mx.concatenate([b[..., :half], a[..., half:]], axis=-1)  # [-sin, sin]
        return c, s


Finish = Callable[[mx.array], mx.array]  # attention heads [1, H, L, D] -> the block's output


def block_qkv(
    layer: Any, x: mx.array, rotary: Rotary, kernels: Kernels
) -> tuple[mx.array, mx.array, mx.array, Finish]:
    """A llama-style block's part before the attention over x [1, L, d] at the rotary's per-row
    positions: (q [1, H, L, D], k, v [1, G, L, D], the part after the attention). The cache and
    the attention are the caller's (one cache here; one per packed sequence in
    edgespec/server/packed.py)."""
    attn = layer.self_attn
    b, length, _ = x.shape
    compiled = kernels.parts(layer, x)  # the backend's compiled cache-free parts, if any
    if compiled is not None:
        before, after = compiled
        q, k, v = before(x)
        return rotary(attn.rope, q), rotary(attn.rope, k), v, lambda heads: after(x, heads)
    h = layer.input_layernorm(x)
    q = attn.q_proj(h).reshape(b, length, attn.n_heads, -1)
    k = attn.k_proj(h).reshape(b, length, attn.n_kv_heads, -1)
    v = attn.v_proj(h).reshape(b, length, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    if hasattr(attn, "q_norm"):  # qwen3
        q, k = attn.q_norm(q), attn.k_norm(k)
    q = rotary(attn.rope, q.transpose(0, 2, 1, 3))
    k = rotary(attn.rope, k.transpose(0, 2, 1, 3))

    def finish(heads: mx.array) -> mx.array:
        h = x + attn.o_proj(heads.transpose(0, 2, 1, 3).reshape(b, length, -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    return q, k, v, finish


def _block(
    layer: Any, x: mx.array, rotary: Rotary, allowed: mx.array, cache: Any, kernels: Kernels
) -> mx.array:
    """One llama-style block over x [1, L, d] with per-row positions and a mask; appends L
    positions to `cache`."""
    q, k, v, finish = block_qkv(layer, x, rotary, kernels)
    k, v = cache.update_and_fetch(k, v)
    return finish(kernels.attention(q, k, v, layer.self_attn.scale, allowed, cache))


def run_layers(
    layers: Sequence[Any],
    h: mx.array,
    positions: mx.array,
    allowed: mx.array,
    cache: Sequence[Any],
    kernels: Kernels = PLAIN,
    taps: dict[int, mx.array] | None = None,
) -> mx.array:
    """The blocks over hidden states h [1, L, d] (positions [L] int32, allowed [L, S]);
    `taps`: the output of each layer i it names is recorded as taps[i]."""
    rotary = Rotary(positions)
    for i, (layer, c) in enumerate(zip(layers, cache, strict=True)):
        h = _block(layer, h, rotary, allowed, c, kernels)
        if taps is not None and i in taps:
            taps[i] = h
    return h


def head_of(model: Any) -> Callable[[mx.array], mx.array]:
    """Features -> logits: a reduced-head draft's own head (over its head ids), a tied
    embedding, or the model's lm_head."""
    if hasattr(model, "head_logits"):  # EdgeSpec's token draft (architectures/token_draft.py)
        return model.lm_head
    if model.args.tie_word_embeddings:
        return model.model.embed_tokens.as_linear
    return model.lm_head


def tree_forward(
    model: Any,
    inputs: mx.array,
    positions: mx.array,
    allowed: mx.array,
    cache: Sequence[Any],
    kernels: Kernels = PLAIN,
    layers: Sequence[int] = (TOP,),
) -> tuple[mx.array, mx.array]:
    """One forward of a token model over inputs [L] at positions [L] under mask allowed [L, S]
    (S = cache offset + L): (hidden states of `layers` [L, k * d] as taps.target_features,
    logits [L, V or the draft's head]). Appends L positions to the cache (then `compact` it)."""
    trunk = model.model
    h = trunk.embed_tokens(inputs[None])
    taps = {i: h for i in layers if i != TOP}
    h = trunk.norm(run_layers(tree_layers(model), h, positions, allowed, cache, kernels, taps))
    parts = [h[0] if i == TOP else taps[i][0] for i in layers]
    feats = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=-1)
    return feats, head_of(model)(h)[0]


def compact(cache: Sequence[Any], keep: int, rows: Sequence[int]) -> None:
    """Keep the first `keep` positions and then the positions `rows` (increasing, each >= keep),
    moved to keep, keep + 1, ...; drop the rest. Rows already in place are not copied.
    Example: keep 10, rows [11, 13] of 14 positions -> 12 positions: 0..9, old 11, old 13."""
    n = len(rows)
    first_moved = next((j for j, row in enumerate(rows) if row != keep + j), n)
    if first_moved < n:
        index = mx.array(list(rows[first_moved:]), dtype=mx.int32)
        lo, hi = keep + first_moved, keep + n
        for c in cache:
            c.keys[..., lo:hi, :] = mx.take(c.keys, index, axis=2)
            c.values[..., lo:hi, :] = mx.take(c.values, index, axis=2)
    for c in cache:
        c.trim(c.offset - (keep + n))
