"""EdgeSpec's own draft architecture: a few llama layers + a reduced-vocabulary output head.

The draft scores only `head_ids` (the target's most frequent output tokens); every other token gets
q = 0. Exactness does not need q to cover the vocabulary: the residual max(0, p - q) covers the rest.
Files on disk (config.json `model_type: "edgespec_draft"`, weights in safetensors):
  model.embed_tokens.weight  [vocab, hidden]        (the target's own embedding, frozen in training)
  model.layers.{i}.*         llama layers            (initialised from chosen target layers)
  model.norm.weight          [hidden]
  lm_head.weight             [head_size, hidden]
  head_ids                   [head_size] int32       (full-vocabulary id of each head row)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama

MODEL_TYPE = "edgespec_draft"


class DraftModel(nn.Module):
    """Llama trunk + reduced head. `__call__` returns full-vocabulary logits (-inf off the head), so
    the draft is a drop-in mlx-lm model (mlx-lm's speculative decoding can use it too)."""

    def __init__(self, args: llama.ModelArgs, head_size: int):
        super().__init__()
        self.args = args
        self.model_type = MODEL_TYPE
        self.model = llama.LlamaModel(args)
        self.lm_head = nn.Linear(args.hidden_size, head_size, bias=False)
        self.head_ids = mx.zeros((head_size,), dtype=mx.int32)

    @property
    def layers(self) -> list[nn.Module]:
        return self.model.layers

    @property
    def vocab_size(self) -> int:
        return self.args.vocab_size

    def head_logits(self, inputs: mx.array, cache: Any = None) -> mx.array:
        """Logits over the head only: [B, L, head_size]; column j scores token head_ids[j]."""
        return self.lm_head(self.model(inputs, cache=cache))

    def __call__(self, inputs: mx.array, cache: Any = None) -> mx.array:
        z = self.head_logits(inputs, cache)
        full = mx.full((*z.shape[:-1], self.args.vocab_size), -mx.inf, dtype=z.dtype)
        full[..., self.head_ids] = z
        return full

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        return {k: v for k, v in weights.items() if "rotary_emb.inv_freq" not in k}


def args_from_config(config: dict[str, Any]) -> tuple[llama.ModelArgs, int]:
    """Split a draft config.json into llama args and the head size."""
    head_size = int(config["head_size"])
    return llama.ModelArgs.from_dict(config), head_size


def build(config: dict[str, Any]) -> DraftModel:
    args, head_size = args_from_config(config)
    return DraftModel(args, head_size)


def load_draft(path: str | Path) -> tuple[DraftModel, dict[str, Any]]:
    """Load a draft folder (config.json + *.safetensors). Quantized layers stay quantized here;
    the loader decides whether to dequantize (CPU backend) or keep 4-bit (Metal/CUDA)."""
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    model = build(config)
    weights: dict[str, mx.array] = {}
    for f in sorted(path.glob("*.safetensors")):
        weights.update(mx.load(str(f)))
    q = config.get("quantization")
    if q:
        nn.quantize(
            model,
            group_size=q["group_size"],
            bits=q["bits"],
            class_predicate=lambda p, m: f"{p}.scales" in weights,
        )
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    return model, config


def save_draft(model: DraftModel, config: dict[str, Any], path: str | Path) -> None:
    """Write config.json + model.safetensors (config must already carry `quantization` if quantized)."""
    from mlx.utils import tree_flatten

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
