"""Attention modules for the CPU backend's twin of a model, built with an explicit attention call.

mlx-lm's attention modules call `scaled_dot_product_attention`, a function of their own module.
The twin's attention module is a subclass of mlx-lm's whose `attend` attribute is the attention
it calls instead (the backend's `grouped_sdpa`, attention.py, set when the twin is made): for a
forward on one of EdgeSpec's caches (attention.groupable) it projects, rotates and updates the
cache as mlx-lm's module does, the same operations in the same order, then calls `attend`; any
other forward runs mlx-lm's own method. mlx-lm's classes, functions and modules stay as they are.

The families written out here are those whose attention is the plain projection pattern (q, k, v
projections, optional per-head q / k norms, or one fused qkv projection; rotary embedding; an
output projection): Llama (SmolLM2), Qwen2, Qwen3, Qwen3-MoE, Phi-3. Other families' attention
keeps MLX's kernel on the CPU too (their forwards cost what MLX's fallback costs; their outputs
are exact either way). Compiled llama blocks (blocks.py) take `attend` the same way.

    cls = twin_class(llama_attention_module)   # -> GroupedAttention subclass of llama.Attention
    twin.attend = grouped_sdpa(...)            # the backend sets it on each twin module
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.models.base import scaled_dot_product_attention

from edgespec.cpu.attention import groupable

Attend = Callable[..., mx.array]  # mlx-lm's scaled_dot_product_attention's signature


def _split(attn: Any, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """q, k, v projections [B, L, heads * D] -> [B, heads, L, D] (Llama, Qwen2)."""
    b, length, _ = x.shape
    queries, keys, values = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    queries = queries.reshape(b, length, attn.n_heads, -1).transpose(0, 2, 1, 3)
    keys = keys.reshape(b, length, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    values = values.reshape(b, length, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    return queries, keys, values


def _normed(attn: Any, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """As _split, with per-head RMS norms on q and k before the transpose (Qwen3)."""
    b, length, _ = x.shape
    queries, keys, values = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    queries = attn.q_norm(queries.reshape(b, length, attn.n_heads, -1)).transpose(0, 2, 1, 3)
    keys = attn.k_norm(keys.reshape(b, length, attn.n_kv_heads, -1)).transpose(0, 2, 1, 3)
    values = values.reshape(b, length, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    return queries, keys, values


def _fused(attn: Any, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """One qkv projection split in three (Phi-3), then as _split."""
    b, length, _ = x.shape
    qkv = attn.qkv_proj(x)
    query_pos = attn.n_heads * attn.head_dim
    queries, keys, values = mx.split(
        qkv, [query_pos, query_pos + attn.n_kv_heads * attn.head_dim], axis=-1
    )
    queries = queries.reshape(b, length, attn.n_heads, -1).transpose(0, 2, 1, 3)
    keys = keys.reshape(b, length, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    values = values.reshape(b, length, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    return queries, keys, values


Project = Callable[[Any, mx.array], tuple[mx.array, mx.array, mx.array]]
# mlx-lm's attention classes, by (module, class name), and how each projects its inputs.
PROJECTIONS: dict[tuple[str, str], Project] = {
    ("mlx_lm.models.llama", "Attention"): _split,
    ("mlx_lm.models.qwen2", "Attention"): _split,
    ("mlx_lm.models.qwen3", "Attention"): _normed,
    ("mlx_lm.models.qwen3_moe", "Attention"): _normed,
    ("mlx_lm.models.phi3", "Attention"): _fused,
}


class GroupedAttention:
    """Mixed in before an mlx-lm attention class (twin_class): its forwards on EdgeSpec's caches
    call `attend` (module docstring). `project` is the family's projection."""

    attend: Attend = staticmethod(scaled_dot_product_attention)
    project: Any  # the family's Project, a method of the twin class

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        if cache is None or not groupable(cache):
            return super().__call__(x, mask, cache)  # type: ignore[misc]
        attn: Any = self
        b, length, _ = x.shape
        queries, keys, values = attn.project(x)
        queries = attn.rope(queries, offset=cache.offset)
        keys = attn.rope(keys, offset=cache.offset)
        keys, values = cache.update_and_fetch(keys, values)
        output = self.attend(queries, keys, values, cache=cache, scale=attn.scale, mask=mask)
        return attn.o_proj(output.transpose(0, 2, 1, 3).reshape(b, length, -1))


def twin_class(module: Any, made: dict[type, type | None]) -> type | None:
    """The twin class of an attention module of a family in PROJECTIONS (a GroupedAttention
    subclass of its class, one per class, kept in `made`), else None."""
    cls = type(module)
    if cls not in made:
        project = PROJECTIONS.get((cls.__module__, cls.__name__))
        made[cls] = (
            None
            if project is None
            else type(
                cls.__name__,
                (GroupedAttention, cls),
                {"project": project, "__module__": __name__},
            )
        )
    return made[cls]
