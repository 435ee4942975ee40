"""Loading a draft's weights with a one-line error that names the key at fault (mlx's own
strict load lists the keys on lines of their own, which a one-line error would cut off)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten


def check_keys(model: nn.Module, weights: dict[str, mx.array]) -> None:
    """ValueError (one line, naming the first such key) when `weights` lacks a parameter of
    `model`, has one it does not, or has one of another shape (a quantized layer's: any shape).
    Example: weights without "norm.weight" -> "the draft's weights lack norm.weight"."""
    want = dict(tree_flatten(model.parameters()))
    missing = sorted(set(want) - set(weights))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"the draft's weights lack {missing[0]}{more}")
    extra = sorted(set(weights) - set(want))
    if extra:
        raise ValueError(f"the draft's weights have {extra[0]}, which this draft does not use")
    for key, value in weights.items():
        if f"{key.rsplit('.', 1)[0]}.scales" not in weights and value.shape != want[key].shape:
            raise ValueError(
                f"the draft's {key} has shape {list(value.shape)}, expected "
                f"{list(want[key].shape)} from its config.json"
            )


def load_checked(model: nn.Module, weights: dict[str, mx.array]) -> None:
    """check_keys, then load every weight into `model`."""
    check_keys(model, weights)
    model.load_weights(list(weights.items()), strict=True)
