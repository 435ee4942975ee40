"""`nn.Linear` and `nn.RMSNorm` in fewer graph operations, for MLX's CPU backend.

On the CPU every operation in a forward's graph is a task for MLX's scheduler, about 1-1.5 us
each on the 2-core machines we measure on, however small its work: a transpose, a broadcast, a
scalar product. With rope.py's tables but MLX's own Linear and RMSNorm, a SmolLM2-135M
one-token forward builds 2,930 of them (97 per layer; counted with mx.export_to_dot); with the two
layers below, and rotary rows shared by a forward's layers, 1,885. Two layer kinds repeat
operations whose results never change from one forward to the next:

- `nn.Linear` computes `x @ weight.T`: a Transpose per call, and for an input [1, L, in] MLX
  flattens it to [L, in] and unflattens the product (4 operations per call, 7 calls per layer).
  LeanLinear keeps the transposed view (no copy: a transpose only swaps strides), also as a batch
  of one, [1, in, out], and multiplies [1, L, in] by that: one operation, and the product gets the
  very same operands, strides and BLAS call.
- `nn.RMSNorm` calls `mx.fast.rms_norm`, which on the CPU runs its fallback graph: 11 operations,
  4 of them broadcasts of constants (1/n, eps and the weight) to the input's shape. LeanRMSNorm
  runs the same arithmetic (square, sum, times 1/n, plus eps, rsqrt, times x, times weight) with
  those constants kept at the shapes it meets: 8 operations.

Both give the same bits as the layers they replace (tests/cpu/test_leanops.py); only speed changes.
They apply to float32 inputs on the CPU (GPUs fuse these into kernels), stand for exact
`nn.Linear` / `nn.RMSNorm` modules in the CPU backend's twin of a model (same parameter arrays,
same tree; edgespec/cpu/backend.py), notice when a weight of the twin is replaced (`update`,
training) and are off with `EDGESPEC_CPU_OPT=-lean_ops`. mlx-lm's model object keeps its own layers.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn


class LeanLinear(nn.Linear):
    """nn.Linear that multiplies by a kept transposed view of its weight (same product, same
    bits, 3 operations fewer per call on a [1, L, in] input)."""

    def _weight_t(self, batched: bool = False) -> mx.array:
        weight = self["weight"]
        kept = self.__dict__.get("_lean_t")
        if kept is None or kept[0] is not weight:  # first call, or the weight was replaced
            kept = (weight, weight.T, mx.expand_dims(weight.T, 0))
            self.__dict__["_lean_t"] = kept
        return kept[2] if batched else kept[1]

    def __call__(self, x: mx.array) -> mx.array:
        if "bias" in self:
            return mx.addmm(self["bias"], x, self._weight_t())
        if x.ndim == 3 and x.shape[0] == 1:
            # [1, L, in] @ [1, in, out]: one batch of the same product, which MLX runs as is;
            # [1, L, in] @ [in, out] would be flattened to [L, in] and back (2 operations more)
            return x @ self._weight_t(batched=True)
        return x @ self._weight_t()


class LeanRMSNorm(nn.RMSNorm):
    """nn.RMSNorm computed as `mx.fast.rms_norm`'s CPU fallback computes it, with its constants
    kept at the input's shape instead of broadcast on every call."""

    def _constants(self, shape: tuple[int, ...]) -> tuple[mx.array, mx.array, mx.array]:
        weight = self["weight"]
        kept = self.__dict__.get("_lean_c")
        if kept is None or kept[0] is not weight:
            kept = (weight, {})
            self.__dict__["_lean_c"] = kept
        per_shape: dict[tuple[int, ...], tuple[mx.array, mx.array, mx.array]] = kept[1]
        found = per_shape.get(shape)
        if found is None:
            rows = (*shape[:-1], 1)
            found = (
                mx.full(rows, 1.0 / shape[-1], mx.float32),  # mean: sum times 1/n, as mx.mean
                mx.full(rows, self.eps, mx.float32),
                mx.broadcast_to(weight, shape),
            )
            if len(per_shape) >= 16:  # shapes come from forward lengths; keep a few
                per_shape.clear()
            per_shape[shape] = found
        return found

    def __call__(self, x: mx.array) -> mx.array:
        if x.dtype != mx.float32 or self["weight"].dtype != mx.float32:
            return super().__call__(x)
        inv_n, eps, weight = self._constants(tuple(x.shape))
        total = mx.sum(mx.square(x), axis=-1, keepdims=True)
        return (x * mx.rsqrt(total * inv_n + eps)) * weight


def twin_class(module: Any) -> type | None:
    """The lean class standing for an exact nn.Linear / nn.RMSNorm (subclasses, quantized
    layers and the rest keep theirs: None)."""
    lean: dict[type, type] = {nn.Linear: LeanLinear, nn.RMSNorm: LeanRMSNorm}
    return lean.get(type(module))
