"""A Gemma 3 trunk for a token draft: some of the target's gemma3_text layers, each kept as the
kind it was in the target (sliding-window or global attention, and the RoPE base that goes with
it), between the target's scaled embedding and final norm.

mlx-lm's `Gemma3Model` decides a layer's kind from its index (`(i + 1) % sliding_window_pattern`),
so a draft made of layers 0, 1, 16, 17 of an 18-layer target would renumber them and change their
kinds. Here each block is built with its source index (`source_layers` in the draft config), so
layer 17 stays global and layers 0, 1, 16 keep their 512-token window and RoPE base 10000.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import gemma3_text
from mlx_lm.models.base import create_attention_mask

TRUNK = "gemma3_text"


class Gemma3Trunk(nn.Module):
    """embed * sqrt(hidden) -> the chosen blocks -> final norm; returns [B, L, hidden]."""

    def __init__(self, args: gemma3_text.ModelArgs, source_layers: list[int]):
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [gemma3_text.TransformerBlock(args, layer_idx=i) for i in source_layers]
        self.norm = gemma3_text.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(self, inputs: mx.array, cache: Any = None) -> mx.array:
        h = self.embed_tokens(inputs)
        # the same bf16-rounded scale as mlx-lm's Gemma3Model
        h = h * mx.array(self.args.hidden_size**0.5, mx.bfloat16).astype(h.dtype)
        cache = cache if cache is not None else [None] * len(self.layers)
        for layer, c in zip(self.layers, cache, strict=True):
            window = self.args.sliding_window if layer.self_attn.is_sliding else None
            h = layer(h, create_attention_mask(h, c, window_size=window), c)
        return self.norm(h)


def gemma3_args(config: dict[str, Any]) -> tuple[gemma3_text.ModelArgs, list[int]]:
    """The target's gemma3_text settings (as the draft config carries them) and source layers."""
    layers = [int(i) for i in config["edgespec"]["source_layers"]]
    return gemma3_text.ModelArgs.from_dict(config), layers
