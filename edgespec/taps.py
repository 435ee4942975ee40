"""What a model's text part reads out besides its next-token logits: the hidden states a feature
draft is fed (the feature taps), the output head, the vocabulary's width.

    feats, logits = target_features(model, ids, cache, layers=(2, 5, TOP))

`target_features` runs the model's own call once, with the trunk and the asked-for layers wrapped
for that call only (`_Tap`: each records its output), so the logits are the model's own (Gemma's
soft-capping, a multimodal config's `language_model`) and no second forward runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

TOP = -1  # feature_layers entry for the target's top hidden state (final-normed, the head's input)


class _Tap:
    """A target layer that also records its output (the hidden state after that layer)."""

    def __init__(self, layer: Any, sink: list[mx.array]):
        self.layer, self.sink = layer, sink

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.layer(*args, **kwargs)
        self.sink.append(out if isinstance(out, mx.array) else out[0])
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.layer, name)


def text_model(model: Any) -> Any:
    """The llama-style model inside: `model` itself, or a conditional-generation model's text part
    (Qwen3.5's `language_model`), whose `args` and head are the ones that score tokens."""
    return getattr(model, "language_model", model)


def output_head(model: Any, h: mx.array) -> mx.array:
    """The model's output head on hidden states h [..., d] (final-normed) -> logits [..., V]."""
    text = text_model(model)
    if getattr(text.args, "tie_word_embeddings", False):  # DeepSeek-V3's args have no such field
        return text.model.embed_tokens.as_linear(h)
    return text.lm_head(h)


def target_features(
    model: Any, inputs: mx.array, cache: Any, layers: Sequence[int] = (TOP,)
) -> tuple[mx.array, mx.array]:
    """One target forward, [L] -> (hidden states [L, len(layers) * d], logits [L, V]); the logits
    are model(inputs)'s (the model's own call runs, whatever its head: Gemma's soft-capping, a
    multimodal config's `language_model`). `layers`: which hidden states, concatenated in that
    order: TOP (-1) is the top (final-normed) one, the trunk's output (`model.model`, or
    `model.language_model.model`), i >= 0 the output of layer i, recorded as the forward passes it
    (no extra forward). A feature draft (edgespec/architectures/eagle.py) reads them."""
    owner = getattr(model, "language_model", model)
    trunk = owner.model
    blocks = trunk.layers
    top: list[mx.array] = []
    taps: dict[int, list[mx.array]] = {i: [] for i in layers if i != TOP}
    for i, sink in taps.items():
        blocks[i] = _Tap(blocks[i], sink)
    owner["model"] = _Tap(trunk, top)  # an nn.Module keeps its children as dict entries
    try:
        logits = model(inputs[None], cache=cache)
    finally:
        owner["model"] = trunk
        for i in taps:
            blocks[i] = blocks[i].layer
    parts = [top[0][0] if i == TOP else taps[i][0][0] for i in layers]
    feats = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=-1)
    return feats, logits[0]


def vocab_size(model: Any) -> int:
    """Width of the model's output logits: its `args.vocab_size`, or its text part's for a
    conditional-generation model (Qwen3.5's `args.text_config`)."""
    args = model.args
    if hasattr(args, "vocab_size"):
        return int(args.vocab_size)
    return int(args.text_config["vocab_size"])
