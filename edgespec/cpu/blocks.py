"""Llama transformer blocks in two compiled pieces around the attention, for MLX's CPU backend.

A SmolLM2-135M forward is ~1,900 graph operations, and mlx-lm's Python builds each one, most of
it exposed in a speculative round (MLX's CPU backend lets the host queue only ~50 operations ahead
of the computing thread, so the verify's graph is built while the CPU has little left to do).
The parts of a block that do not touch the cache have fixed shapes for a given number of input
tokens: the input norm and the q/k/v projections before the attention, the output projection,
the residuals, the second norm and the MLP after it. `CompiledBlock` runs each part as one
`mx.compile`d function (traced once per input length, then replayed from C++; MLX also fuses
their elementwise operations into one kernel), and keeps in Python only what depends on the
cache: the rotary table rows at the cache's offset (rope.py; the rotation itself is compiled),
the cache update and the attention (attention.py). Same operations on the same operands: the logits keep their bits
(tests/cpu/test_blocks.py).
 Its measured effect: docs/cpu-backend.md.

CompiledBlock stands for an exact mlx-lm llama block (llama.TransformerBlock with its Attention
and MLP) in the CPU backend's twin of a model (edgespec/cpu/backend.py; mlx-lm's model object
keeps its blocks). Float32, batch 1, with a cache and at most MAX_LENGTH tokens (decode steps,
verifies, catch-ups) take it; prompt chunks keep mlx-lm's code (each new length would be a new
trace). On MLX's CPU backend only (GPUs have fused kernels), only where MLX can compile a fused
kernel here (on the CPU it builds one with the system C++ compiler; `fastexp.compiler_works`). The traces hold the block's parameters as constants; a replaced
parameter (`update` on the twin) is noticed at the next call and the block traced again.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import mlx.core as mx
from mlx_lm.models import llama
from mlx_lm.models.base import scaled_dot_product_attention

from edgespec.cpu import rope
from edgespec.cpu.attention import MAX_ROWS

MAX_LENGTH = MAX_ROWS  # longer forwards (prompt chunks) keep mlx-lm's code
_TRACES = "_traces"  # where a block keeps its compiled functions (not a child module)


def _before_attention(block: llama.TransformerBlock, x: mx.array, *rows: mx.array):
    """Input norm and q/k/v projections; with `rows` (the queries' and the keys' cosine and sine
    table rows, rope.TableRoPE._rows) also the rotary embedding, as TableRoPE computes it."""
    attn = block.self_attn
    b, length, _ = x.shape
    h = block.input_layernorm(x)
    q = attn.q_proj(h).reshape(b, length, attn.n_heads, -1).transpose(0, 2, 1, 3)
    k = attn.k_proj(h).reshape(b, length, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    v = attn.v_proj(h).reshape(b, length, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    if rows:
        cq, sq, ck, sk = rows
        q, k = rope.rotate(q, cq, sq), rope.rotate(k, ck, sk)
    return q, k, v


def _after_attention(block: llama.TransformerBlock, x: mx.array, heads: mx.array) -> mx.array:
    b, length, _ = x.shape
    h = x + block.self_attn.o_proj(heads.transpose(0, 2, 1, 3).reshape(b, length, -1))
    return h + block.mlp(block.post_attention_layernorm(h))


class CompiledBlock(llama.TransformerBlock):
    """llama.TransformerBlock whose cache-free parts run as two compiled functions. `attend` is
    the attention between them (mlx-lm's function, or the backend's grouped one)."""

    attend: Any = staticmethod(scaled_dot_product_attention)

    def _compiled(self) -> tuple[Any, Any]:
        """The two compiled functions; made anew when a parameter array was replaced (the
        traces hold the arrays they were traced with as constants). Passing the parameters as
        inputs instead (mx.compile's `inputs=`) cost more per call than it saved."""
        kept = self.__dict__.get(_TRACES)
        if kept is not None:
            slots, arrays, fns = kept
            if all(m[name] is a for (m, name), a in zip(slots, arrays, strict=True)):
                return fns
        slots = [
            (module, name)
            for _, module in self.named_modules()
            for name, value in module.items()
            if isinstance(value, mx.array)
        ]
        fns = (
            mx.compile(partial(_before_attention, self)),
            mx.compile(partial(_after_attention, self)),
        )
        self.__dict__[_TRACES] = (slots, [m[name] for m, name in slots], fns)
        return fns

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        if cache is None or x.shape[0] != 1 or x.shape[1] > MAX_LENGTH or x.dtype != mx.float32:
            return super().__call__(x, mask, cache)
        before, after = self._compiled()
        attn = self.self_attn
        b, length, _ = x.shape
        table = attn.rope
        head_dim = int(attn.head_dim)
        if (
            type(table) is rope.TableRoPE
            and isinstance(cache.offset, int)
            and table.whole(head_dim)
        ):
            # The rotary rows are made (and shared by the layers) outside; the rotation itself
            # is part of the compiled function.
            rows = (
                *table._rows(cache.offset, (b, int(attn.n_heads or 0), length, head_dim)),
                *table._rows(cache.offset, (b, int(attn.n_kv_heads or 0), length, head_dim)),
            )
            q, k, v = before(x, *rows)
        else:
            q, k, v = before(x)
            q = table(q, offset=cache.offset)
            k = table(k, offset=cache.offset)
        k, v = cache.update_and_fetch(k, v)
        heads = self.attend(q, k, v, cache=cache, scale=attn.scale, mask=mask)
        return after(x, heads)


def parts(layer: Any, x: mx.array) -> tuple[Any, Any] | None:
    """A compiled block's two cache-free parts for inputs x [1, L, d] (before: x -> q, k, v
    unrotated; after: (x, attention heads) -> block output), for a forward that rotates and
    attends its own way (a draft tree's, edgespec/trees/forward.py); None where `layer` is not a
    CompiledBlock or the input would not take its compiled path."""
    if not isinstance(layer, CompiledBlock):
        return None
    if x.shape[0] != 1 or x.shape[1] > MAX_LENGTH or x.dtype != mx.float32:
        return None
    return layer._compiled()


def twin_class(module: Any) -> type | None:
    """CompiledBlock for an exact llama block (its Attention and MLP exact too), else None."""
    exact = (
        type(module) is llama.TransformerBlock
        and type(module.self_attn) is llama.Attention
        and type(module.mlp) is llama.MLP
    )
    return CompiledBlock if exact else None
