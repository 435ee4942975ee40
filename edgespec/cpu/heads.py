"""Attention modules for the CPU backend's twin of a model, built with an explicit attention call.

mlx-lm's attention modules call `scaled_dot_product_attention`, a function of their own module.
The twin's attention module is a subclass of mlx-lm's whose `attend` attribute is the attention
it calls instead (the backend's `grouped_sdpa`, attention.py, set when the twin is made): for a
forward on one of EdgeSpec's caches (attention.groupable) it projects, normalises, rotates and
updates the cache as mlx-lm's module does, the same operations in the same order, then calls
`attend`; any other forward runs mlx-lm's own method. mlx-lm's classes, functions and modules
stay as they are (tests/loading/test_architectures.py checks, per family, that a twin whose
`attend` is mlx-lm's function gives mlx-lm's bits).

Written out here, per family (TWINS, by mlx-lm's module and class name):
- the plain projection pattern (`Projected`: q, k, v projections with optional per-head q / k
  norms, or one fused qkv projection; rotary embedding; an output projection): Llama (SmolLM2),
  Qwen2, Qwen3, Qwen3-MoE, Phi-3, and Gemma 3 (its q / k norms after the transpose, its scale
  from query_pre_attn_scalar; its sliding-window layers run on EdgeSpec's window caches);
- Ministral 3 (`Ministral3`: queries scaled by the model's Llama 4 position factor);
- Qwen3-Next and Qwen3.5, which reuses its class (`Gated`: a sigmoid gate from the query
  projection on the attention's output);
- Gemma 4 (`Gemma4`: q / k / v norms, keys as values on K-eq-V layers, the layer's keys and
  offset returned for the KV-shared layers, whose own forwards keep mlx-lm's method).
Other families (gpt-oss: attention sinks) keep MLX's kernel on the CPU (their forwards cost what
MLX's fallback costs; their outputs are exact either way). Compiled llama blocks (blocks.py) take
`attend` the same way.

    cls = twin_class(llama_attention_module, {})  # -> a Projected subclass of llama.Attention
    twin.attend = grouped_sdpa(...)               # the backend sets it on each twin module
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.models.base import scaled_dot_product_attention

from edgespec.cpu.attention import groupable

Attend = Callable[..., mx.array]  # mlx-lm's scaled_dot_product_attention's signature


def _heads(x: mx.array, heads: int) -> mx.array:
    """[B, L, heads * D] -> [B, heads, L, D]."""
    b, length, _ = x.shape
    return x.reshape(b, length, heads, -1).transpose(0, 2, 1, 3)


def _merged(x: mx.array) -> mx.array:
    """[B, heads, L, D] -> [B, L, heads * D]: the attention's output, before o_proj."""
    b, _, length, _ = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, length, -1)


def _split(attn: Any, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """q, k, v projections [B, L, heads * D] -> [B, heads, L, D] (Llama, Qwen2, Ministral 3)."""
    queries, keys, values = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    return (
        _heads(queries, attn.n_heads),
        _heads(keys, attn.n_kv_heads),
        _heads(values, attn.n_kv_heads),
    )


def _normed(attn: Any, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """As _split, with per-head RMS norms on q and k before the transpose (Qwen3)."""
    b, length, _ = x.shape
    queries, keys, values = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    queries = attn.q_norm(queries.reshape(b, length, attn.n_heads, -1)).transpose(0, 2, 1, 3)
    keys = attn.k_norm(keys.reshape(b, length, attn.n_kv_heads, -1)).transpose(0, 2, 1, 3)
    return queries, keys, _heads(values, attn.n_kv_heads)


def _normed_after(attn: Any, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """As _split, with per-head RMS norms on q and k after the transpose (Gemma 3)."""
    queries, keys, values = _split(attn, x)
    return attn.q_norm(queries), attn.k_norm(keys), values


def _fused(attn: Any, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """One qkv projection split in three (Phi-3), then as _split."""
    qkv = attn.qkv_proj(x)
    query_pos = attn.n_heads * attn.head_dim
    queries, keys, values = mx.split(
        qkv, [query_pos, query_pos + attn.n_kv_heads * attn.head_dim], axis=-1
    )
    return (
        _heads(queries, attn.n_heads),
        _heads(keys, attn.n_kv_heads),
        _heads(values, attn.n_kv_heads),
    )


class GroupedAttention:
    """Mixed in before an mlx-lm attention class (twin_class): its forwards on EdgeSpec's caches
    call `attend` (module docstring)."""

    attend: Attend = staticmethod(scaled_dot_product_attention)


class Projected(GroupedAttention):
    """The plain pattern: `project` (the family's, a method of the twin class), rotation at the
    cache's offset, the cache update, `attend` at the module's scale, o_proj."""

    project: Any

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        if cache is None or not groupable(cache):
            return super().__call__(x, mask, cache)  # type: ignore[misc]
        attn: Any = self
        queries, keys, values = attn.project(x)
        queries = attn.rope(queries, offset=cache.offset)
        keys = attn.rope(keys, offset=cache.offset)
        keys, values = cache.update_and_fetch(keys, values)
        output = self.attend(queries, keys, values, cache=cache, scale=attn.scale, mask=mask)
        return attn.o_proj(_merged(output))


class Split(Projected):
    project = _split


class Normed(Projected):
    project = _normed


class NormedAfter(Projected):
    project = _normed_after


class Fused(Projected):
    project = _fused


class Ministral3(GroupedAttention):
    """Ministral 3: as Split, the rotated queries times `attn_scale` (the model passes it)."""

    def __call__(
        self, x: mx.array, attn_scale: Any = None, mask: Any = None, cache: Any = None
    ) -> mx.array:
        if cache is None or attn_scale is None or not groupable(cache):
            return super().__call__(x, attn_scale, mask, cache)  # type: ignore[misc]
        attn: Any = self
        queries, keys, values = _split(attn, x)
        queries = attn.rope(queries, offset=cache.offset)
        keys = attn.rope(keys, offset=cache.offset)
        keys, values = cache.update_and_fetch(keys, values)
        queries = queries * attn_scale
        output = self.attend(queries, keys, values, cache=cache, scale=attn.scale, mask=mask)
        return attn.o_proj(_merged(output))


class Gated(GroupedAttention):
    """Qwen3-Next / Qwen3.5: the query projection carries a gate per head (its second half);
    q / k norms before the transpose; the output times sigmoid(gate) before o_proj."""

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        if cache is None or not groupable(cache):
            return super().__call__(x, mask, cache)  # type: ignore[misc]
        attn: Any = self
        b, length, _ = x.shape
        heads, kv_heads = attn.num_attention_heads, attn.num_key_value_heads
        queries, gate = mx.split(attn.q_proj(x).reshape(b, length, heads, -1), 2, axis=-1)
        gate = gate.reshape(b, length, -1)
        keys, values = attn.k_proj(x), attn.v_proj(x)
        queries = attn.q_norm(queries).transpose(0, 2, 1, 3)
        keys = attn.k_norm(keys.reshape(b, length, kv_heads, -1)).transpose(0, 2, 1, 3)
        values = _heads(values, kv_heads)
        queries = attn.rope(queries, offset=cache.offset)
        keys = attn.rope(keys, offset=cache.offset)
        keys, values = cache.update_and_fetch(keys, values)
        output = self.attend(queries, keys, values, cache=cache, scale=attn.scale, mask=mask)
        return attn.o_proj(_merged(output) * mx.sigmoid(gate))


class Gemma4(GroupedAttention):
    """Gemma 4: q / k norms before the transpose, an unscaled norm on the values, keys as values
    on K-eq-V layers, scale 1; returns (output, (keys, values), offset) for the KV-shared layers
    after it. A KV-shared layer's own forward (no cache of its own) keeps mlx-lm's method."""

    def __call__(
        self,
        x: mx.array,
        mask: Any = None,
        cache: Any = None,
        shared_kv: Any = None,
        offset: Any = None,
    ) -> Any:
        attn: Any = self
        if shared_kv is not None or not attn.has_kv or cache is None or not groupable(cache):
            return super().__call__(x, mask, cache, shared_kv=shared_kv, offset=offset)  # type: ignore[misc]
        b, length, _ = x.shape
        queries = attn.q_norm(attn.q_proj(x).reshape(b, length, attn.n_heads, attn.head_dim))
        keys = attn.k_proj(x).reshape(b, length, attn.n_kv_heads, attn.head_dim)
        values = keys
        if not attn.use_k_eq_v:
            values = attn.v_proj(x).reshape(b, length, attn.n_kv_heads, attn.head_dim)
        offset = mx.array(cache.offset)
        keys = attn.rope(attn.k_norm(keys).transpose(0, 2, 1, 3), offset=offset)
        values = attn.v_norm(values).transpose(0, 2, 1, 3)
        queries = attn.rope(queries.transpose(0, 2, 1, 3), offset=offset)
        keys, values = cache.update_and_fetch(keys, values)
        output = self.attend(queries, keys, values, cache=cache, scale=attn.scale, mask=mask)
        return attn.o_proj(_merged(output)), (keys, values), offset


# mlx-lm's attention classes, by (module, class name), and the twin written out for each.
TWINS: dict[tuple[str, str], type[GroupedAttention]] = {
    ("mlx_lm.models.llama", "Attention"): Split,
    ("mlx_lm.models.qwen2", "Attention"): Split,
    ("mlx_lm.models.qwen3", "Attention"): Normed,
    ("mlx_lm.models.qwen3_moe", "Attention"): Normed,
    ("mlx_lm.models.phi3", "Attention"): Fused,
    ("mlx_lm.models.gemma3_text", "Attention"): NormedAfter,
    ("mlx_lm.models.ministral3", "Attention"): Ministral3,
    ("mlx_lm.models.qwen3_next", "Qwen3NextAttention"): Gated,  # Qwen3.5's too
    ("mlx_lm.models.gemma4_text", "Attention"): Gemma4,
}


def twin_class(module: Any, made: dict[type, type | None]) -> type | None:
    """The twin class of an attention module of a family in TWINS (a subclass of its class with
    the family's GroupedAttention mixed in first, one per class, kept in `made`), else None."""
    cls = type(module)
    if cls not in made:
        mixin = TWINS.get((cls.__module__, cls.__name__))
        made[cls] = (
            None if mixin is None else type(cls.__name__, (mixin, cls), {"__module__": __name__})
        )
    return made[cls]
