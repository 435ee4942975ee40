"""Tiny random DFlash2 drafts (edgespec/architectures/dflash2_model.py) written as z-lab publishes
them: the full key set of z-lab/Qwen3.8-27B-DFlash2's config.json (PUBLISHED,
docs/architectures.md), scaled down to a tiny target's width and vocabulary, and its tensor names,
bf16 like the real ones. Random weights: acceptance is low, exactness is what the tests check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

# A published DFlash2 config.json, every key as z-lab ships it (z-lab/dflash
# tests/fixtures/dflash2-config.json: a 30B target's drafter, block 16, with output scalars;
# docs/architectures.md names the sources). z-lab/Qwen3.8-27B-DFlash2 has the same keys with
# QWEN38's values (and no output scalars).
PUBLISHED: dict[str, Any] = {
    "architectures": ["DFlash2DraftModel"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 200000,
    "is_causal": False,
    "dflash_config": {
        "block_size": 16,
        "conv_group_size": 16,
        "conv_kernel_size": 2,
        "final_logit_softcapping": 20.0,
        "mask_token_id": 201818,
        "output_multiplier": 0.19611613513818404,
        "selector_rank": 256,
        "selector_top_k": 16,
        "target_layer_ids": [1, 13, 25, 37, 49],
    },
    "dtype": "bfloat16",
    "eos_token_id": 200001,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 6656,
    "initializer_range": 0.02,
    "intermediate_size": 19968,
    "layer_types": ["sliding_attention"] * 5,
    "max_position_embeddings": 131072,
    "max_window_layers": 5,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 5,
    "num_key_value_heads": 8,
    "num_target_layers": 52,
    "pad_token_id": 200018,
    "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
    "sliding_window": 2048,
    "tie_word_embeddings": False,
    "transformers_version": "5.15.0",
    "use_cache": False,
    "use_sliding_window": True,
    "vocab_size": 202048,
}
SCALARS = ("output_multiplier", "final_logit_softcapping")
QWEN38_DRAFT = {  # z-lab/Qwen3.8-27B-DFlash2's dflash_config
    "block_size": 8,
    "conv_group_size": 16,
    "conv_kernel_size": 2,
    "mask_token_id": 248070,
    "selector_rank": 256,
    "selector_top_k": 16,
    "target_layer_ids": [5, 19, 33, 47, 61],
}


def config_for(target_cfg: dict[str, Any], scalars: bool = False, **over: Any) -> dict[str, Any]:
    """PUBLISHED with Qwen3.8-27B-DFlash2's draft fields (block 8; with `scalars`, PUBLISHED's
    output multiplier and soft cap too), scaled to a tiny target (width 64, its vocabulary and
    layers): 2 layers, both sliding with a 16-token window, rank 8, top 16. `over` replaces
    top-level fields; its `dflash` entries update the nested ones."""
    layers, vocab = int(target_cfg["num_hidden_layers"]), int(target_cfg["vocab_size"])
    cfg = json.loads(json.dumps(PUBLISHED))
    scaled = {**QWEN38_DRAFT, "mask_token_id": 5, "selector_rank": 8}
    if scalars:
        scaled |= {k: cfg["dflash_config"][k] for k in SCALARS}
    cfg["dflash_config"] = {**scaled, "target_layer_ids": [0, layers - 2], **over.pop("dflash", {})}
    cfg.update(
        head_dim=16,
        hidden_size=64,
        intermediate_size=128,
        layer_types=["sliding_attention"] * 2,
        max_position_embeddings=4096,
        max_window_layers=2,
        num_attention_heads=4,
        num_hidden_layers=2,
        num_key_value_heads=2,
        num_target_layers=layers,
        sliding_window=16,
        vocab_size=vocab,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
    )
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):  # the target's, as published
        cfg[key] = target_cfg.get(key)
    cfg.update(over)
    return cfg


def weights_for(cfg: dict[str, Any], seed: int = 0, edge: float = 1.0) -> dict[str, np.ndarray]:
    """Seeded weights under the published tensor names. `edge` scales the selector's
    codebooks (1: edges of a few units, enough to move the walk off the unary argmax)."""
    dc = cfg["dflash_config"]
    d, hd, inter = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    heads, kv, vocab = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    taps, groups, rank = dc["conv_kernel_size"], d // dc["conv_group_size"], dc["selector_rank"]
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int, scale: float = 1.5) -> np.ndarray:
        return rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)

    w = {"fc.weight": mat(d, len(dc["target_layer_ids"]) * d)}
    w |= {"hidden_norm.weight": np.ones(d), "norm.weight": np.ones(d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        w |= {
            p + "self_attn.q_proj.weight": mat(heads * hd, d),
            p + "self_attn.k_proj.weight": mat(kv * hd, d),
            p + "self_attn.v_proj.weight": mat(kv * hd, d),
            p + "self_attn.o_proj.weight": mat(d, heads * hd),
            p + "self_attn.q_norm.weight": np.ones(hd),
            p + "self_attn.k_norm.weight": np.ones(hd),
            p + "mlp.gate_proj.weight": mat(inter, d),
            p + "mlp.up_proj.weight": mat(inter, d),
            p + "mlp.down_proj.weight": mat(d, inter),
            p + "input_layernorm.weight": np.ones(d),
            p + "post_attention_layernorm.weight": np.ones(d),
        }
        for conv in ("attention_conv", "mlp_conv"):
            base = 0.3 * rng.standard_normal((2, taps, d))
            base[:, 0] += 1.0  # near the identity, as trained kernels start
            w[p + conv + ".base_kernel"] = base
            w[p + conv + ".kernel_projection.weight"] = mat(2 * taps * groups, d, 0.3)
    w["candidate_selector.hidden_projection.weight"] = mat(rank, d, 3.0)
    for book in ("predecessor_codebook", "successor_codebook"):
        w[f"candidate_selector.{book}"] = edge * rng.standard_normal((vocab, rank)) / rank**0.25
    return w


def write_dflash2(
    target: Path, out: Path, seed: int = 0, edge: float = 1.0, **over: Any
) -> tuple[Path, dict[str, Any]]:
    """A DFlash2 folder for the target folder `target`: (its path, its config)."""
    tcfg = json.loads((target / "config.json").read_text())
    cfg = config_for(tcfg.get("text_config", tcfg), **over)
    weights = weights_for(cfg, seed, edge)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    arrays = {k: mx.array(v.astype(np.float32)).astype(mx.bfloat16) for k, v in weights.items()}
    mx.save_safetensors(str(out / "model.safetensors"), arrays)
    return out, cfg
