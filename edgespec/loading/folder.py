"""A model folder: its config, its tokenizer, the LoadedModel record a loader returns, and its
weights as this backend runs them.

Backend policy for weights (docs/cpu-backend.md): 4-bit matmuls are the fast path on Metal/CUDA
but a naive, slow kernel on the CPU backend, and fp16/bf16 compute on CPU is slow too. So on a GPU
quantized weights stay quantized (and an unquantized draft is quantized to `draft_bits`); on the
CPU every quantized layer is dequantized and every float weight cast to fp32 at load time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear
from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

from edgespec.errors import ModelLoadError, one_line

DEFAULT_CONTEXT = 2048
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
# every file a tokenizer may be read from: two folders with the same bytes in all of them load
# the same tokenizer
_TOKENIZER_PARTS = (
    *_TOKENIZER_FILES,
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)


@dataclass
class LoadedModel:
    """A model ready to run: weights, tokenizer, where it came from and its context window."""

    model: nn.Module
    tokenizer: Any  # mlx_lm.tokenizer_utils.TokenizerWrapper
    name: str
    path: Path
    context_window: int
    config: dict


def read_config(path: Path) -> dict:
    try:
        return json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"{path} has no config.json (not a model folder)") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path / 'config.json'} is not valid JSON: {one_line(e)}") from None


def load_tokenizer(path: Path, config: dict, fallback: Path | LoadedModel | None) -> Any:
    """The tokenizer of the model folder `path`; a folder that ships none takes `fallback`'s (a
    folder's, loaded). With a loaded model as `fallback` (a draft's target), a folder that ships
    none or the same files shares that model's tokenizer object instead of loading it again:
    check_tokenizers then has nothing to compare."""
    own = any((path / f).is_file() for f in _TOKENIZER_FILES)
    if isinstance(fallback, LoadedModel):
        if not own or same_tokenizer_files(path, fallback.path):
            return fallback.tokenizer
        fallback = fallback.path
    source = path if own else fallback
    if source is None:
        raise ModelLoadError(f"{path} has no tokenizer (tokenizer.json / tokenizer_config.json)")
    try:
        return mlx_load_tokenizer(source, eos_token_ids=config.get("eos_token_id"))
    except Exception as e:
        raise ModelLoadError(f"cannot load the tokenizer of {source}: {one_line(e)}") from None


def same_tokenizer_files(a: Path, b: Path) -> bool:
    """Whether folders `a` and `b` hold the same tokenizer files, byte for byte."""
    if a.resolve() == b.resolve():
        return True
    for name in _TOKENIZER_PARTS:
        fa, fb = a / name, b / name
        if fa.is_file() != fb.is_file():
            return False
        if fa.is_file() and (
            fa.stat().st_size != fb.stat().st_size or fa.read_bytes() != fb.read_bytes()
        ):
            return False
    return True


def context_window(config: dict) -> int:
    """The model's context window from its config (a multimodal model's text_config), else
    DEFAULT_CONTEXT."""
    context = config.get("max_position_embeddings") or config.get("text_config", {}).get(
        "max_position_embeddings"
    )
    return int(context or DEFAULT_CONTEXT)


# ------------------------------------------------------------------ weights for this backend


def _float32_weight(m: nn.Module) -> mx.array:
    """A quantized layer's weight as float32. fp16 arithmetic is slow on the CPU: dequantize with
    fp32 scales and biases (3x faster)."""
    biases = m.get("biases")
    return mx.dequantize(
        m.weight,
        m.scales.astype(mx.float32),
        None if biases is None else biases.astype(mx.float32),
        group_size=m.group_size,
        bits=m.bits,
        mode=getattr(m, "mode", "affine"),
    ).astype(mx.float32)


def _dense_experts(m: QuantizedSwitchLinear) -> nn.Module:
    """A float32 SwitchLinear twin of a mixture-of-experts layer's quantized experts."""
    if m.get("global_scale") is not None:  # nvfp4 with a per-expert scale: left quantized
        return m
    w = _float32_weight(m)
    out = SwitchLinear(w.shape[2], w.shape[1], w.shape[0], bias="bias" in m)
    out.weight = w
    if "bias" in m:
        out.bias = m.bias.astype(mx.float32)
    return out


def dense_twin(m: nn.Module) -> nn.Module:
    """A float32 dense twin of a quantized layer (other modules returned unchanged)."""
    if isinstance(m, QuantizedSwitchLinear):
        return _dense_experts(m)
    if not isinstance(m, nn.QuantizedLinear | nn.QuantizedEmbedding):
        return m
    w = _float32_weight(m)
    if isinstance(m, nn.QuantizedEmbedding):
        out: nn.Module = nn.Embedding(w.shape[0], w.shape[1])
    else:
        out = nn.Linear(w.shape[1], w.shape[0], bias="bias" in m)
        if "bias" in m:
            out.bias = m.bias.astype(mx.float32)
    out.weight = w
    return out


def dequantize_model(model: nn.Module) -> nn.Module:
    """In place: every QuantizedLinear / QuantizedEmbedding -> fp32 dense, quantized experts
    (QuantizedSwitchLinear) -> fp32 SwitchLinear; fp16/bf16 -> fp32."""
    leaves = tree_map(dense_twin, model.leaf_modules(), is_leaf=nn.Module.is_module)
    model.update_modules(leaves)
    halfs = (mx.float16, mx.bfloat16)
    model.update(
        tree_map(lambda a: a.astype(mx.float32) if a.dtype in halfs else a, model.parameters())
    )
    mx.eval(model.parameters())
    return model


def is_quantized(model: nn.Module) -> bool:
    return any(
        isinstance(m, nn.QuantizedLinear | nn.QuantizedEmbedding) for _, m in model.named_modules()
    )


def quantize_model(model: nn.Module, bits: int) -> nn.Module:
    """In place: quantize every Linear/Embedding whose input size divides a group size (64, else
    32); layers that divide neither stay dense (nn.quantize needs divisibility)."""

    def group_for(m: nn.Module) -> int | None:
        if not hasattr(m, "to_quantized") or isinstance(
            m, nn.QuantizedLinear | nn.QuantizedEmbedding
        ):
            return None
        dims = m.weight.shape[-1]
        return next((g for g in (64, 32) if dims % g == 0), None)

    def predicate(_path: str, m: nn.Module) -> bool | dict:
        g = group_for(m)
        return False if g is None else {"group_size": g, "bits": bits}

    nn.quantize(model, group_size=64, bits=bits, class_predicate=predicate)
    mx.eval(model.parameters())
    return model


DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def cast_floats(model: nn.Module, dtype: str) -> nn.Module:
    """In place: every floating-point parameter (norms, dense weights, quantization scales and
    biases) to `dtype`; packed integer weights stay as they are."""
    to = DTYPES[dtype]
    model.update(
        tree_map(
            lambda a: a.astype(to) if mx.issubdtype(a.dtype, mx.floating) else a,
            model.parameters(),
        )
    )
    mx.eval(model.parameters())
    return model
