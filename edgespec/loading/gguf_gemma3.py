"""Convert a Gemma 3 text GGUF (llama.cpp's `gemma3` architecture) into an mlx-lm `gemma3_text`
folder.

What llama.cpp's converter changed, undone here (ggml-org/llama.cpp conversion/gemma.py,
`Gemma3Model.modify_tensors`, commit 2bbcf7fc93a460f04d5709756a48b2408443eecb):
  * every `*norm.weight` was stored as 1 + w (Gemma3RMSNorm multiplies by 1 + weight; llama.cpp's
    RMS norm multiplies by the weight): we subtract 1, because mlx-lm's gemma3_text adds it back;
  * no q/k row permutation (unlike llama): attn_q / attn_k map as they are.
What the GGUF does not store, taken as llama.cpp's loader assumes for `gemma3` (src/llama-model.cpp,
`LLM_ARCH_GEMMA3`): one global layer in 6 (the rest slide over `sliding_window` tokens), RoPE base
10000 on sliding layers (`rope_freq_base_train_swa`), and attention scale 1/sqrt(head_dim) below
27B (the 27B model uses 1/sqrt(hidden / heads)), i.e. query_pre_attn_scalar.

Weights: k-quants cannot be read by `mx.load`, so every tensor is read from its GGUF blocks
(edgespec/loading/gguf_file.py). With dtype "keep" the converted model computes with exactly the
GGUF's values: every block type that is affine in groups of 32 (x = scale * code + bias: Q4_K,
Q4_0, Q4_1, Q5_0, Q5_K, Q8_0) is repacked as MLX affine groups of 32 with the same codes and
float32 scales and biases (4-bit for 4-bit codes, 8-bit for 5- and 8-bit codes); Q6_K (two
scales per 32 values) and the norms stay dense float32. The config lists each module's width.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from edgespec.errors import ModelLoadError
from edgespec.loading.gguf_file import GGUFFile
from edgespec.loading.gguf_spm import build_spm_tokenizer

ARCH = "gemma3"
GROUP = 32
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
SLIDING_WINDOW_PATTERN = 6
ROPE_LOCAL_BASE = 10000.0


def gemma3_config(meta: dict[str, Any], vocab_size: int, tied: bool) -> dict[str, Any]:
    """mlx-lm / HF style config.json (model_type gemma3_text) from the `gemma3.*` metadata."""

    def get(key: str, default: Any = None) -> Any:
        v = meta.get(f"{ARCH}.{key}", default)
        if v is None:
            raise ModelLoadError(f"GGUF metadata lacks {ARCH}.{key}")
        return v

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    layers, head_dim = int(get("block_count")), int(get("attention.key_length", 256))
    big = layers == 62  # Gemma 3 27B: llama.cpp scales queries by hidden / heads there
    config: dict[str, Any] = {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(get("rope.freq_base", 1_000_000.0)),
        "rope_local_base_freq": ROPE_LOCAL_BASE,
        "query_pre_attn_scalar": hidden // heads if big else head_dim,
        "sliding_window": int(get("attention.sliding_window")),
        "sliding_window_pattern": SLIDING_WINDOW_PATTERN,
        "max_position_embeddings": int(get("context_length", 32768)),
        "vocab_size": int(vocab_size),
        "tie_word_embeddings": tied,
    }
    factor = meta.get(f"{ARCH}.rope.scaling.factor")
    if meta.get(f"{ARCH}.rope.scaling.type") == "linear" and factor:
        config["rope_scaling"] = {"rope_type": "linear", "factor": float(factor)}
    for key, name in (("bos", "bos"), ("eos", "eos"), ("padding", "pad")):
        tid = meta.get(f"tokenizer.ggml.{key}_token_id")
        if tid is not None:
            config[f"{name}_token_id"] = int(tid)
    return config


def mlx_name(gguf_name: str) -> str:
    """`blk.3.post_ffw_norm.weight` -> `model.layers.3.post_feedforward_layernorm.weight`."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) >= 4 and parts[2] in _LAYER_NAMES:
        return ".".join(["model.layers", parts[1], _LAYER_NAMES[parts[2]], *parts[3:]])
    if parts[0] in _TOP_NAMES and len(parts) >= 2:
        return ".".join([_TOP_NAMES[parts[0]], *parts[1:]])
    raise ModelLoadError(f"unexpected tensor {gguf_name!r} in a gemma3 GGUF")


def gemma3_weights(
    gguf: GGUFFile, dtype: str = "keep"
) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """mlx-lm gemma3_text tensors and the `quantization` config entry ({} when dense).

    dtype "keep": matrices of affine block types repacked exactly (`mlx_affine`), the others
    (Q6_K, floats) dense float32; "float32" / "float16" / "bfloat16": everything dense."""
    if dtype not in ("keep", "float32", "float16", "bfloat16"):
        raise ModelLoadError(f"unknown dtype {dtype!r}; use keep, float32, float16, bfloat16")
    out: dict[str, mx.array] = {}
    widths: dict[str, int] = {}
    for name in gguf.tensors:
        key = mlx_name(name)
        affine = gguf.affine(name) if dtype == "keep" else None
        if affine is not None:
            codes, scales, biases, code_bits = affine
            bits = 4 if code_bits <= 4 else 8
            base = key.removesuffix(".weight")
            out |= {
                key: mx.array(pack_codes(codes, bits)),
                f"{base}.scales": mx.array(scales),
                f"{base}.biases": mx.array(biases),
            }
            widths[base] = bits
            continue
        w = gguf.dequantize(name)
        if name.endswith("norm.weight"):
            w = w - np.float32(1.0)  # stored as 1 + w (module docstring)
        out[key] = mx.array(w).astype(mx.float32 if dtype == "keep" else getattr(mx, dtype))
    return out, quantization_entry(widths)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned codes [rows, cols] as MLX's packed uint32 [rows, cols * bits / 32]: value j of
    each word sits at bits j * bits (little end first), the layout mx.quantize writes for 4 and
    8 bits.

    >>> hex(pack_codes(np.arange(8, dtype=np.uint8)[None], 4)[0, 0])
    '0x76543210'
    """
    per = 32 // bits
    rows, cols = codes.shape
    q = codes.astype(np.uint32).reshape(rows, cols // per, per)
    return np.bitwise_or.reduce(q << (bits * np.arange(per, dtype=np.uint32)), axis=-1)


def quantization_entry(widths: dict[str, int]) -> dict[str, Any]:
    """mlx-lm's `quantization` config for per-module widths: the most common width as the
    default, every other module listed with its own.

    >>> quantization_entry({"a": 4, "b": 4, "c": 8})
    {'group_size': 32, 'bits': 4, 'c': {'group_size': 32, 'bits': 8}}
    """
    if not widths:
        return {}
    values = list(widths.values())
    default = max(set(values), key=values.count)
    entry: dict[str, Any] = {"group_size": GROUP, "bits": default}
    for module, bits in widths.items():
        if bits != default:
            entry[module] = {"group_size": GROUP, "bits": bits}
    return entry


def write_gemma3_folder(
    gguf_path: Path,
    folder: Path,
    tokenizer_config: Callable[[dict[str, Any]], tuple[dict[str, Any], dict[str, Any]]],
    dtype: str = "keep",
    *,
    sha256: str | None = None,
) -> None:
    """Write config.json, model.safetensors and the tokenizer files for a gemma3 GGUF.
    `tokenizer_config(meta)`: the special tokens' files, shared with the llama path (gguf.py,
    which dispatches here and hands its own)."""
    gguf = GGUFFile(gguf_path)
    meta = gguf.metadata
    if meta.get("tokenizer.ggml.model") != "llama":
        raise ModelLoadError(
            f"{gguf_path.name}: a gemma3 GGUF should carry a SentencePiece "
            f"('llama') tokenizer, not {meta.get('tokenizer.ggml.model')!r}"
        )
    weights, quant = gemma3_weights(gguf, dtype)
    vocab = gguf.tensors["token_embd.weight"].shape[0]
    config = gemma3_config(meta, vocab, tied="output.weight" not in gguf.tensors)
    if quant:
        config["quantization"] = config["quantization_config"] = quant
    config["edgespec_source"] = {
        "format": "gguf",
        "file": gguf_path.name,
        "name": meta.get("general.name"),
        "license": meta.get("general.license"),
        **({"sha256": sha256} if sha256 else {}),
    }
    tok_config, special_map = tokenizer_config(meta)
    tok_config["model_max_length"] = config["max_position_embeddings"]
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    build_spm_tokenizer(meta).save(str(folder / "tokenizer.json"))
    for name, obj in (
        ("config.json", config),
        ("tokenizer_config.json", tok_config),
        ("special_tokens_map.json", special_map),
    ):
        (folder / name).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
