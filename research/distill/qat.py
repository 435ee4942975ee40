"""Quantization-aware training: a draft trains through the rounding its shipped weights will get.

Each Linear the export quantizes (input dim divisible by the group, not the embedding) becomes a
FakeQuantLinear: its forward uses dequantize(quantize(w)) with MLX's own affine quantizer (the one
`nn.quantize` applies at export, so training sees exactly the shipped numbers), and its backward
passes the gradient straight through to the fp32 weight (straight-through estimator). `bits = 0`
turns the rounding off (the fp32 draft), so one model measures fp32, 8-bit and 4-bit agreement.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map_with_path

GROUP_SIZE = 64


def fake_quantize_weight(w: mx.array, bits: int, group_size: int = GROUP_SIZE) -> mx.array:
    """w rounded as MLX's affine quantizer rounds it, with an identity gradient (bits 0: w).

    >>> w = mx.arange(128, dtype=mx.float32).reshape(1, 128) / 7
    >>> bool(mx.abs(fake_quantize_weight(w, 4) - w).max() < 0.6), bool((fake_quantize_weight(w, 0) == w).all())
    (True, True)
    """
    if not bits:
        return w
    q = mx.dequantize(*mx.quantize(w, group_size=group_size, bits=bits), group_size, bits)
    return w + mx.stop_gradient(q - w)


class FakeQuantLinear(nn.Module):
    """A Linear whose forward sees its weight rounded to `bits` (same parameter names as
    nn.Linear, so checkpoints and the exported draft read the same keys)."""

    def __init__(self, weight: mx.array, bias: mx.array | None, bits: int, group_size: int):
        super().__init__()
        self.weight = weight
        if bias is not None:
            self.bias = bias
        self.bits = bits
        self.group_size = group_size

    def __call__(self, x: mx.array) -> mx.array:
        y = x @ fake_quantize_weight(self.weight, self.bits, self.group_size).T
        return y + self.bias if "bias" in self else y


def quantizable(path: str, module: nn.Module, group_size: int = GROUP_SIZE) -> bool:
    """The layers export.quantize rounds: Linears whose input dim divides by the group, not the
    embedding."""
    return (
        isinstance(module, nn.Linear | FakeQuantLinear)
        and module.weight.shape[-1] % group_size == 0
        and "embed_tokens" not in path
    )


def add_fake_quant(model: nn.Module, bits: int, group_size: int = GROUP_SIZE) -> int:
    """Swap every quantizable Linear of `model` for a FakeQuantLinear (in place); returns how many."""
    count = 0

    def swap(path: str, m: nn.Module) -> nn.Module:
        nonlocal count
        if not isinstance(m, nn.Linear) or not quantizable(path, m, group_size):
            return m
        count += 1
        return FakeQuantLinear(m.weight, m.get("bias"), bits, group_size)

    leaves = tree_map_with_path(swap, model.leaf_modules(), is_leaf=nn.Module.is_module)
    model.update_modules(leaves)
    return count


def set_bits(model: nn.Module, bits: int) -> None:
    """Round every FakeQuantLinear of `model` to `bits` from now on (0: no rounding)."""
    for _, m in model.named_modules():
        if isinstance(m, FakeQuantLinear):
            m.bits = bits
