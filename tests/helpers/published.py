"""Tiny checkpoints laid out as they are published: the full key set of the real config.json,
values scaled down, and the real tensor names.

`QWEN3_4B_CONFIG` is Qwen/Qwen3-4B's config.json (transformers 4.51's Qwen3Config, as the repo
ships it); mlx-community's 4-bit conversion (mlx-community/Qwen3-4B-4bit) keeps every key and adds
`quantization` / `quantization_config` (group size 64, 4 bits). Tensor names are mlx-lm's
(`model.layers.N.self_attn.q_proj.{weight,scales,biases}`, no `lm_head` when the embedding is
tied), which is how the mlx-community folder stores them. The z-lab DFlash layout:
tests/helpers/block_models.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

QWEN3_4B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2560,
    "initializer_range": 0.02,
    "intermediate_size": 9728,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
MLX_4BIT = {"group_size": 64, "bits": 4}
LAYERS = 2


def qwen3_tiny_config(vocab: int, eos: int) -> dict[str, Any]:
    """Qwen3-4B's keys, every one of them, with a model a few hundred kB large."""
    cfg = dict(QWEN3_4B_CONFIG)
    cfg |= {
        "bos_token_id": eos,
        "eos_token_id": eos,
        "head_dim": 16,
        "hidden_size": 64,
        "intermediate_size": 128,
        "max_position_embeddings": 512,
        "max_window_layers": LAYERS,
        "num_attention_heads": 4,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": 2,
        "vocab_size": vocab,
    }
    return cfg


def qwen3_tensor_names(layers: int = LAYERS) -> set[str]:
    """The tensors of a tied-embedding mlx-community Qwen3 4-bit folder."""
    quantized = ("weight", "scales", "biases")
    names = {f"model.embed_tokens.{p}" for p in quantized} | {"model.norm.weight"}
    for i in range(layers):
        at = f"model.layers.{i}."
        for proj in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
        ):
            names |= {f"{at}{proj}.{p}" for p in quantized}
        for proj in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            names |= {f"{at}{proj}.{p}" for p in quantized}
        names |= {f"{at}self_attn.q_norm.weight", f"{at}self_attn.k_norm.weight"}
        names |= {f"{at}input_layernorm.weight", f"{at}post_attention_layernorm.weight"}
    return names


def write_mlx_community_qwen3(out: Path, tokenizer_dir: Path, vocab: int, seed: int = 0) -> Path:
    """A seeded tiny Qwen3 saved as mlx-community's 4-bit folders are: the published config keys
    plus the quantization entries, mlx-lm's tensor names, the tokenizer files."""
    from mlx_lm.utils import quantize_model, save_model

    from tests.helpers.tiny import SPECIALS
    from tests.helpers.tiny_arch import build, seed_weights

    cfg = qwen3_tiny_config(vocab, SPECIALS.index("<|im_end|>"))
    model = build(cfg)
    seed_weights(model, seed)
    model, _ = quantize_model(model, dict(cfg), group_size=64, bits=4)
    out.mkdir(parents=True, exist_ok=True)
    save_model(out, model)
    published = cfg | {"quantization": MLX_4BIT, "quantization_config": MLX_4BIT}
    (out / "config.json").write_text(json.dumps(published, indent=4, sort_keys=True))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (out / name).write_bytes((tokenizer_dir / name).read_bytes())
    return out


def write_mtp_checkpoint(out: Path, family: str, seed: int = 0) -> Path:
    """An original (unconverted) checkpoint of tiny `family` with its MTP layer, as the model
    makers publish it: Qwen3.5 / Qwen3-Next `mtp.*` keys, DeepSeek-V3's next-n layer as layer
    `num_hidden_layers` (in a shard of its own), GLM / MiMo's in the main file. Untrained
    (tests/helpers/mtp_models.py make_checkpoint trains one); the layout is what is checked."""
    import mlx.core as mx

    from edgespec.architectures.nextn import NextnModel, build_head
    from tests.helpers import mtp_models as m
    from tests.helpers.tiny import make_tokenizer
    from tests.helpers.tiny_arch import build, seed_weights

    vocab = make_tokenizer(out / "tokenizer", seed=seed)
    config = m.checkpoint_config(family, vocab)
    model = build(config)
    seed_weights(model, seed)
    head = build_head(config)
    seed_weights(head, seed + 1)
    head.attach(model)
    path = out / "checkpoint"
    path.mkdir(parents=True)
    if not isinstance(head, NextnModel):
        weights = m.hf_target_weights(model) | m.hf_mtp_weights(head)
    elif family == "deepseek_v3":
        weights = m.hf_target_weights(model, offsets=False)
        nextn = m.hf_nextn_weights(head, model, config)
        mx.save_safetensors(str(path / m.NEXTN_SHARD), nextn)
    else:
        weights = m.hf_target_weights(model, offsets=False) | m.hf_nextn_weights(
            head, model, config
        )
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (path / name).write_bytes((out / "tokenizer" / name).read_bytes())
    return path
