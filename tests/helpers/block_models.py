"""Tiny random block drafts (edgespec/architectures/block_model.py) written the way z-lab publishes
DFlash drafts: a Hugging Face config.json with `architectures: ["DFlashDraftModel"]` and the
`dflash_config` nesting, safetensors without a `model.` prefix. Random weights: acceptance is low,
exactness is what the tests check."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np

from tests.helpers.tiny_arch import make_family


def tiny_qwen3(root: Path) -> Path:
    """A tiny 4-layer qwen3 target folder (tests/helpers/tiny_arch.py), made once."""
    target = root / "qwen3" / "target"
    if not (target / "config.json").is_file():
        make_family(root / "qwen3", "qwen3")
    return target


def write_dflash(
    target: Path,
    out: Path,
    seed: int = 0,
    layer_ids: tuple[int, ...] = (0, 2),
    layers: int = 2,
    block: int = 4,
    width: int = 64,
    **overrides: object,
) -> Path:
    """A seeded DFlash-format draft for the target folder `target` (its width, vocabulary and
    layer count; `overrides` replace config fields, e.g. to make a mismatched draft). `width`:
    the draft's hidden size (the target's must match), in heads of 16."""
    tcfg = json.loads((target / "config.json").read_text())
    tcfg = tcfg.get("text_config", tcfg)  # a multimodal target's text part (Qwen3.5)
    d, hd = width, 16
    heads, kv = d // hd, d // (2 * hd)
    inter = 2 * d
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": d,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "intermediate_size": inter,
        "vocab_size": tcfg["vocab_size"],
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "max_position_embeddings": 4096,
        "block_size": block,
        "num_target_layers": tcfg["num_hidden_layers"],
        "dflash_config": {"mask_token_id": 5, "target_layer_ids": list(layer_ids)},
        **overrides,
    }
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> np.ndarray:
        return rng.standard_normal((rows, cols)) * 1.5 / np.sqrt(cols)

    w = {"fc.weight": mat(d, len(layer_ids) * d)}
    if overrides.get("input_context"):
        w["ctx_in.weight"] = mat(d, d)
    for name in ("hidden_norm.weight", "norm.weight"):
        w[name] = np.ones(d)
    for i in range(layers):
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
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    arrays = {k: mx.array(v.astype(np.float32)) for k, v in w.items()}
    if overrides.get("head_size"):  # ours: a reduced head, a seeded choice of token ids
        ids = rng.choice(int(tcfg["vocab_size"]), int(overrides["head_size"]), replace=False)  # type: ignore[call-overload]
        arrays["head_ids"] = mx.array(np.sort(ids).astype(np.int32))
    mx.save_safetensors(str(out / "model.safetensors"), arrays)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (target / name).is_file():
            (out / name).write_bytes((target / name).read_bytes())
    return out
