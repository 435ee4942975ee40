"""Gemma 4's parts of the tiny architecture folders (tests/helpers/tiny_arch.py).

mlx-lm's gemma4_text (E2B / E4B style here): sliding-window layers (a window of 16) alternating
with global ones; global layers with their own head width, a proportional partial rope and keys
as values (`attention_k_eq_v`, as in 31B); per-layer input embeddings; and from 4 layers on, the
last half KV-shared: they have no cache and attend over the keys and values that the last earlier
layer of their type stored (they also run a double-wide MLP). Logits are soft-capped at 30.
mlx-community's folders (converted by mlx-vlm) are the multimodal `gemma4` config around it;
`gemma4_moe` is the mixture-of-experts form (26B-A4B).

Two departures from a trained Gemma 4, both for random weights: the head is not tied (a random
tied head mostly predicts its input token again), and the post-attention norms start at GAIN.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

# Gemma 4 normalizes values and attention outputs to unit RMS, against an embedding scaled to RMS
# sqrt(hidden): with unit norm weights its random attention barely moves the logits (a bigram
# model, through which a check of the caches sees little). Its post-attention norms start this high.
GAIN = 4.0
FAMILIES = ("gemma4_text", "gemma4", "gemma4_moe")


def text_config(base: dict, layers: int) -> dict:
    """Gemma 4's fields on top of a tiny llama-like `base` config of `layers` layers.

    4 layers -> layer types sliding, full, sliding, full; layers 2 and 3 read layers 0 and 1's
    keys (num_kv_shared_layers 2). 2 layers (the draft) -> no KV-shared layers."""
    full = {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}
    sliding = {"rope_type": "default", "rope_theta": 1e4}
    return base | {
        "layer_types": (["sliding_attention", "full_attention"] * layers)[:layers],
        "sliding_window": 16,
        "global_head_dim": 32,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": True,
        "rope_parameters": {"full_attention": full, "sliding_attention": sliding},
        "num_kv_shared_layers": layers // 2 if layers >= 4 else 0,
        "hidden_size_per_layer_input": 16,
        "vocab_size_per_layer_input": base["vocab_size"],
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": False,
    }


def moe_config(base: dict, layers: int) -> dict:
    """26B-A4B style: every layer's MLP joined by 4 experts (2 per token, a router with its own
    norm), keys as values on the global layers, no KV-shared layers."""
    moe = {"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2}
    return (
        text_config(base, layers) | moe | {"moe_intermediate_size": 32, "num_kv_shared_layers": 0}
    )


def wrapped(text: dict) -> dict:
    """The multimodal `gemma4` config mlx-community ships, around a gemma4_text config (mlx-lm
    drops the vision and audio towers and runs `language_model`)."""
    keep = ("vocab_size", "eos_token_id")
    return {"model_type": "gemma4", "text_config": text} | {k: text[k] for k in keep}


def boost_attention(model: Any, family: str) -> None:
    """Multiply the post-attention norms' weights by GAIN for a Gemma 4 family (else nothing)."""
    if family not in FAMILIES:
        return
    params = dict(tree_flatten(model.parameters()))
    suffix = "post_attention_layernorm.weight"
    model.update(tree_unflatten([(k, v * GAIN) for k, v in params.items() if k.endswith(suffix)]))
    mx.eval(model.parameters())
