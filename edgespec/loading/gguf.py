"""Convert a llama-architecture GGUF file (llama.cpp's format) into a standard mlx-lm model folder.

`mx.load(path, return_metadata=True)` already reads GGUF: Q4_0 / Q4_1 / Q8_0 tensors arrive as MLX
affine-quantized triples (`weight` uint32, `scales`, `biases`; group size 32), F16 / F32 as plain
arrays, plus the metadata (`llama.*` hyper-parameters, `tokenizer.ggml.*` vocabulary). What this
module adds:
  * tensor names mapped to mlx-lm's llama (`blk.3.attn_q` -> `model.layers.3.self_attn.q_proj`);
  * llama.cpp's per-head row permutation of attn_q / attn_k undone (see `unpermute_rows`);
  * config.json from the metadata;
  * tokenizer.json rebuilt from the vocabulary and merges (byte-level BPE, GPT-2 style) with the
    `tokenizers` library, plus tokenizer_config.json (special tokens, chat template).
The result loads with `mlx_lm.load(out_dir)`. On disk the GGUF's quantized tensors are kept
quantized (dtype="keep", compact); the runtime decides whether to dequantize at load time.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from edgespec.errors import ModelLoadError, ModelNotFoundError, one_line
from edgespec.loading.paths import atomic_dir

# llama.cpp tensor-name fragments -> mlx-lm llama names (applied to the part after "blk.N.").
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# Pre-tokenizer regexes by `tokenizer.ggml.pre` (llama.cpp's names). None = GPT-2's own regex.
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_REGEX: dict[str, str | None] = {
    "default": None,
    "gpt2": None,
    "gpt-2": None,
    "smollm": None,  # digits split one by one, then GPT-2 (see `_pre_tokenizer`)
    "llama-bpe": _LLAMA3_REGEX,
    "llama3": _LLAMA3_REGEX,
    "qwen2": _QWEN2_REGEX,
}
_TOKEN_CONTROL, _TOKEN_USER_DEFINED = 3, 4  # llama.cpp token types


def read_gguf(path: str | Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """Read tensors and metadata; a missing / unreadable file raises a one-line typed error."""
    path = Path(path)
    if not path.is_file():
        raise ModelNotFoundError(f"GGUF file not found: {path}")
    try:
        loaded = mx.load(str(path), return_metadata=True)
        weights, meta = cast(tuple[dict[str, mx.array], dict[str, Any]], loaded)
    except Exception as e:  # mlx raises RuntimeError/ValueError with multi-line text
        raise ModelLoadError(f"cannot read GGUF file {path}: {one_line(e)}") from None
    arch = _meta_str(meta, "general.architecture", "llama")
    if arch != "llama":
        raise ModelLoadError(
            f"{path}: architecture {arch!r} is not supported (only 'llama' and 'gemma3')"
        )
    return weights, meta


def gguf_architecture(path: Path) -> str | None:
    """`general.architecture` from the file's header (no tensor is read); None if unreadable,
    so that `read_gguf` reports the problem."""
    from edgespec.loading.gguf_file import GGUFFile

    try:
        return str(GGUFFile(path).metadata.get("general.architecture", "llama"))
    except (ModelLoadError, OSError):
        return None


def _meta_value(meta: dict[str, Any], key: str, default: Any = None) -> Any:
    """A metadata value as a plain Python scalar (mx scalars are unwrapped)."""
    v = meta.get(key, default)
    if isinstance(v, mx.array):
        return v.item() if v.ndim == 0 else v.tolist()
    return v


def _meta_str(meta: dict[str, Any], key: str, default: str) -> str:
    v = _meta_value(meta, key, default)
    return str(v)


def unpermute_rows(w: mx.array, n_head: int) -> mx.array:
    """The inverse of llama.cpp's converter permutation of q/k rows, per head (GGUF layout ->
    HF/mlx-lm layout). Within each head of size d, HF stores the RoPE pairs as (first half, second
    half); llama.cpp interleaves them. For one head with d = 4: GGUF rows [a0, b0, a1, b1] -> HF
    rows [a0, a1, b0, b1]. Works for any leading-row tensor (weights, and the per-row scales/biases
    of quantized weights).

    Quantization groups run along the input dimension (columns), so permuting rows of the packed
    weight, scales and biases together is exact: no dequantize / requantize is needed.
    """
    d = w.shape[0] // n_head
    return w.reshape(n_head, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_config(meta: dict[str, Any], weights: dict[str, mx.array]) -> dict[str, Any]:
    """mlx-lm / HF style config.json for a llama GGUF (vocab size from the embedding table)."""

    def get(key: str, default: Any = None) -> Any:
        v = _meta_value(meta, f"llama.{key}", default)
        if v is None:
            raise ModelLoadError(f"GGUF metadata lacks llama.{key}")
        return v

    hidden, n_heads = int(get("embedding_length")), int(get("attention.head_count"))
    n_kv = int(get("attention.head_count_kv", n_heads))
    head_dim = int(get("attention.key_length", get("rope.dimension_count", hidden // n_heads)))
    emb = weights.get("token_embd.weight")
    if emb is None:
        raise ModelLoadError("GGUF has no token_embd.weight tensor")
    config: dict[str, Any] = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length", 2048)),
        "vocab_size": int(emb.shape[0]),
        "tie_word_embeddings": "output.weight" not in weights,
    }
    scaling = _meta_value(meta, "llama.rope.scaling.type")
    factor = _meta_value(meta, "llama.rope.scaling.factor")
    if scaling == "linear" and factor:
        config["rope_scaling"] = {"type": "linear", "factor": float(factor)}
    for key in ("bos", "eos", "padding"):
        tid = _meta_value(meta, f"tokenizer.ggml.{key}_token_id")
        if tid is not None:
            config[f"{'pad' if key == 'padding' else key}_token_id"] = int(tid)
    return config


def _mlx_name(gguf_name: str) -> str:
    """`blk.3.attn_q.scales` -> `model.layers.3.self_attn.q_proj.scales`; unknown names raise."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) >= 4 and parts[2] in _LAYER_NAMES:
        return ".".join(["model.layers", parts[1], _LAYER_NAMES[parts[2]], *parts[3:]])
    if parts[0] in _TOP_NAMES and len(parts) >= 2:
        return ".".join([_TOP_NAMES[parts[0]], *parts[1:]])
    raise ModelLoadError(f"unexpected tensor {gguf_name!r} in a llama GGUF")


def _dequantize_all(weights: dict[str, mx.array], dtype: mx.Dtype) -> dict[str, mx.array]:
    """Replace every (weight, scales, biases) triple by a dense `dtype` weight; cast the rest.

    GGUF blocks hold 32 values, so group_size = 32 and bits = packed_cols / scale_cols."""
    out: dict[str, mx.array] = {}
    for name, w in weights.items():
        if name.endswith((".scales", ".biases")):
            continue
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        if base is not None and f"{base}.scales" in weights:
            scales, biases = weights[f"{base}.scales"], weights[f"{base}.biases"]
            bits = w.shape[-1] // scales.shape[-1]  # packed uint32 columns per 32-value block
            w = mx.dequantize(w, scales, biases, group_size=32, bits=bits)
        out[name] = w.astype(dtype)
    return out


def map_weights(
    weights: dict[str, mx.array], config: dict[str, Any], dtype: str = "keep"
) -> dict[str, mx.array]:
    """GGUF tensors -> mlx-lm llama tensors: rename, un-permute q/k rows, optionally dequantize.

    dtype: "keep" (quantized stays quantized, others as stored) or "float32" / "float16" /
    "bfloat16" (everything dense in that dtype)."""
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    out: dict[str, mx.array] = {}
    for name, w in weights.items():
        parts = name.split(".")
        if parts[0] == "blk" and parts[2] in heads:
            w = unpermute_rows(w, heads[parts[2]])
        out[_mlx_name(name)] = w
    if dtype != "keep":
        if dtype not in ("float32", "float16", "bfloat16"):
            raise ModelLoadError(f"unknown dtype {dtype!r}; use keep, float32, float16, bfloat16")
        out = _dequantize_all(out, getattr(mx, dtype))
    return out


def quantization_of(weights: dict[str, mx.array]) -> dict[str, int] | None:
    """{"group_size": 32, "bits": B} with B the most common bit width, or None if nothing is
    quantized. mlx-lm infers any layer whose bits differ from its own scales/weight shapes."""
    bits = Counter(
        w.shape[-1] // weights[n[: -len("weight")] + "scales"].shape[-1]
        for n, w in weights.items()
        if n.endswith(".weight") and n[: -len("weight")] + "scales" in weights
    )
    if not bits:
        return None
    return {"group_size": 32, "bits": bits.most_common(1)[0][0]}


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer llama.cpp uses for `tokenizer.ggml.pre` (unknown names: GPT-2's)."""
    regex = _PRE_REGEX.get(pre)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=regex is None)
    if regex is not None:
        split = pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)
        return pre_tokenizers.Sequence([split, byte_level])
    if pre == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    return byte_level


def build_tokenizer(meta: dict[str, Any]) -> Tokenizer:
    """Rebuild a byte-level BPE `tokenizers.Tokenizer` from `tokenizer.ggml.*` metadata.

    Control tokens (type 3) become special added tokens (never split, skipped when decoding with
    skip_special_tokens); user-defined tokens (type 4) become plain added tokens."""
    kind = _meta_str(meta, "tokenizer.ggml.model", "gpt2")
    if kind != "gpt2":
        raise ModelLoadError(
            f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2')"
        )
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    types = _meta_value(meta, "tokenizer.ggml.token_type") or [1] * len(tokens)
    vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}  # first id wins on duplicates
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(_meta_str(meta, "tokenizer.ggml.pre", "default"))
    tok.decoder = decoders.ByteLevel()
    special = [
        AddedToken(t, special=True, normalized=False)
        for t, k in zip(tokens, types, strict=False)
        if k == _TOKEN_CONTROL
    ]
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, k in zip(tokens, types, strict=False)
        if k == _TOKEN_USER_DEFINED
    ]
    tok.add_special_tokens(special)
    tok.add_tokens(user)
    steps: list[processors.PostProcessor] = [processors.ByteLevel(trim_offsets=False)]
    bos_id = _meta_value(meta, "tokenizer.ggml.bos_token_id")
    if _meta_value(meta, "tokenizer.ggml.add_bos_token", False) and bos_id is not None:
        bos = tokens[int(bos_id)]
        steps.append(
            processors.TemplateProcessing(
                single=f"{bos}:0 $A:0",
                pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                special_tokens=[(bos, int(bos_id))],
            )
        )
    tok.post_processor = processors.Sequence(steps)
    return tok


def tokenizer_config(meta: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tokenizer_config.json, special_tokens_map.json) contents: special tokens + chat template."""
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    special: dict[str, str] = {}
    for key, name in (
        ("bos", "bos_token"),
        ("eos", "eos_token"),
        ("unknown", "unk_token"),
        ("padding", "pad_token"),
    ):
        tid = _meta_value(meta, f"tokenizer.ggml.{key}_token_id")
        if tid is not None and 0 <= int(tid) < len(tokens):
            special[name] = tokens[int(tid)]
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(_meta_value(meta, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(_meta_value(meta, "tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(_meta_value(meta, "llama.context_length", 2048)),
        **special,
    }
    template = _meta_value(meta, "tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return config, special


def convert_gguf(
    gguf_path: str | Path, out_dir: str | Path, dtype: str = "keep", *, sha256: str | None = None
) -> Path:
    """Write an mlx-lm llama folder for `gguf_path` at `out_dir`, atomically (all files or none;
    an existing `out_dir` is kept as is). Returns `out_dir`.

    Files: config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
    special_tokens_map.json. dtype "keep" keeps GGUF quantized tensors as MLX 4/8-bit (group 32);
    "float32" / "float16" / "bfloat16" stores dense weights.
    """
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        write_mlx_folder(gguf_path, tmp, dtype, sha256=sha256)
    return out_dir


def write_mlx_folder(
    gguf_path: str | Path, folder: Path, dtype: str = "keep", *, sha256: str | None = None
) -> None:
    """The non-atomic part of `convert_gguf`: write the mlx-lm files into an existing `folder`."""
    gguf_path = Path(gguf_path)
    if gguf_architecture(gguf_path) == "gemma3":  # k-quants: read with NumPy, not mx.load
        from edgespec.loading.gguf_gemma3 import write_gemma3_folder

        write_gemma3_folder(gguf_path, folder, tokenizer_config, dtype, sha256=sha256)
        return
    weights, meta = read_gguf(gguf_path)
    config = llama_config(meta, weights)
    mapped = map_weights(weights, config, dtype)
    quant = quantization_of(mapped)
    if quant:
        config["quantization"] = config["quantization_config"] = quant
    config["edgespec_source"] = {
        "format": "gguf",
        "file": gguf_path.name,
        "name": _meta_value(meta, "general.name"),
        "license": _meta_value(meta, "general.license"),
        **({"sha256": sha256} if sha256 else {}),
    }
    tok = build_tokenizer(meta)
    tok_config, special_map = tokenizer_config(meta)
    mx.save_safetensors(str(folder / "model.safetensors"), mapped, metadata={"format": "mlx"})
    tok.save(str(folder / "tokenizer.json"))
    for name, obj in (
        ("config.json", config),
        ("tokenizer_config.json", tok_config),
        ("special_tokens_map.json", special_map),
    ):
        (folder / name).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
