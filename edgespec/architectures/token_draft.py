"""EdgeSpec's own draft architecture: a few llama layers + a reduced-vocabulary output head.

The draft scores only `head_ids` (the target's most frequent output tokens); every other token gets
q = 0. Exactness does not need q to cover the vocabulary: the residual max(0, p - q) covers the rest.
Files on disk (config.json `model_type: "edgespec_draft"`, weights in safetensors):
  model.embed_tokens.weight  [vocab, hidden]        (the target's own embedding, frozen in training;
                                                     absent when config.edgespec.shared_embedding
                                                     is true: the loader then uses the target's)
  model.layers.{i}.*         llama layers            (initialised from chosen target layers)
  model.norm.weight          [hidden]
  lm_head.weight             [head_size, hidden]
  head_ids                   [head_size] int32       (full-vocabulary id of each head row)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models import llama

from edgespec.architectures import TOKEN_DRAFT

MODEL_TYPE = TOKEN_DRAFT


class DraftModel(nn.Module):
    """Llama (or Gemma 3) trunk + reduced head. `__call__` returns full-vocabulary logits (-inf off
    the head), so the draft is a drop-in mlx-lm model (mlx-lm's speculative decoding can use it).

    config["trunk"]: "llama" (default) or "gemma3_text" (architectures/gemma3_trunk.py: the
    target's Gemma 3 blocks, each keeping its sliding / global kind)."""

    def __init__(self, args: Any, head_size: int, trunk: nn.Module | None = None):
        super().__init__()
        self.args = args
        self.model_type = MODEL_TYPE
        self.model = trunk if trunk is not None else llama.LlamaModel(args)
        self.lm_head = nn.Linear(args.hidden_size, head_size, bias=False)
        self.head_ids = mx.zeros((head_size,), dtype=mx.int32)

    @property
    def layers(self) -> list[Any]:
        return self.model.layers

    @property
    def vocab_size(self) -> int:
        return self.args.vocab_size

    def head_logits(self, inputs: mx.array, cache: Any = None) -> mx.array:
        """Logits over the head only: [B, L, head_size]; column j scores token head_ids[j]."""
        return self.lm_head(self.model(inputs, cache=cache))

    def __call__(self, inputs: mx.array, cache: Any = None) -> mx.array:
        return onto_vocab(self.head_logits(inputs, cache), self.head_ids, self.args.vocab_size)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        return {k: v for k, v in weights.items() if "rotary_emb.inv_freq" not in k}


def args_from_config(config: dict[str, Any]) -> tuple[llama.ModelArgs, int]:
    """Split a (llama-trunk) draft config.json into llama args and the head size."""
    head_size = int(config["head_size"])
    return llama.ModelArgs.from_dict(config), head_size


def trunk_of(config: dict[str, Any]) -> str:
    """The draft's trunk architecture: "llama" unless the config names "gemma3_text"."""
    trunk = str(config.get("trunk", "llama"))
    if trunk not in ("llama", "gemma3_text"):
        raise ValueError(f"unknown draft trunk {trunk!r} (llama or gemma3_text)")
    return trunk


def build(config: dict[str, Any]) -> DraftModel:
    if trunk_of(config) == "gemma3_text":
        from edgespec.architectures.gemma3_trunk import Gemma3Trunk, gemma3_args

        g_args, layers = gemma3_args(config)
        return DraftModel(g_args, int(config["head_size"]), Gemma3Trunk(g_args, layers))
    args, head_size = args_from_config(config)
    return DraftModel(args, head_size)


def shares_embedding(config: dict[str, Any]) -> bool:
    """True for drafts saved without an embedding: they use their target's (it was frozen in
    training, so it is the same matrix; a shared module also saves memory and disk)."""
    return bool(config.get("edgespec", {}).get("shared_embedding"))


def load_draft(
    path: str | Path, embedding: nn.Module | None = None
) -> tuple[DraftModel, dict[str, Any]]:
    """Load a draft folder (config.json + *.safetensors). Quantized layers stay quantized here;
    the loader decides whether to dequantize (CPU backend) or keep 4-bit (Metal/CUDA).

    embedding: the target's input embedding module, required (and used as is, not copied) when
    the draft shares it. Raises ValueError when it is missing or has the wrong shape."""
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    model = build(config)
    weights = read_weights(path)
    quantize_as_stored(model, config, weights)
    if shares_embedding(config):
        _attach_embedding(model, config, embedding)
        model.load_weights(list(weights.items()), strict=False)
        names = [str(kv[0]) for kv in tree_flatten(model.parameters())]
        own = {k for k in names if not k.startswith(EMBED)}
        missing = sorted(own - set(weights))
        if missing:
            raise ValueError(f"missing weights: {', '.join(missing[:3])}")
    else:
        model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    return model, config


def read_weights(path: Path) -> dict[str, mx.array]:
    """Every tensor of a folder's *.safetensors files."""
    weights: dict[str, mx.array] = {}
    for f in sorted(path.glob("*.safetensors")):
        weights.update(cast(dict[str, mx.array], mx.load(str(f))))
    return weights


def quantize_as_stored(model: nn.Module, config: dict[str, Any], weights: dict) -> None:
    """Quantize the layers that were saved quantized (those with `.scales` in `weights`), with the
    group size and bits of config["quantization"]; nothing when the config has none."""
    q = config.get("quantization")
    if q:
        nn.quantize(
            model,
            group_size=q["group_size"],
            bits=q["bits"],
            class_predicate=lambda p, m: f"{p}.scales" in weights,
        )


def onto_vocab(z: mx.array, ids: mx.array, vocab: int) -> mx.array:
    """A reduced head's logits [..., len(ids)] as full-vocabulary ones [..., vocab]: column j at
    token ids[j], -inf everywhere else (so those tokens get probability 0)."""
    full = mx.full((*z.shape[:-1], vocab), -mx.inf, dtype=z.dtype)
    full[..., ids] = z
    return full


EMBED = "model.embed_tokens."


def _attach_embedding(model: DraftModel, config: dict[str, Any], embedding: nn.Module | None):
    if embedding is None:
        raise ValueError(
            "this draft shares its target's embedding; load it together with its target"
        )
    vocab = getattr(embedding, "num_embeddings", None) or embedding.weight.shape[0]
    dims = getattr(embedding, "dims", None) or embedding.weight.shape[1]
    want = (int(config["vocab_size"]), int(config["hidden_size"]))
    if (int(vocab), int(dims)) != want:
        target = config.get("edgespec", {}).get("target", "its target")
        raise ValueError(
            f"this draft shares the embedding of {target} ({want[0]} x {want[1]}); "
            f"the target given has a {vocab} x {dims} embedding"
        )
    model.model.embed_tokens = embedding  # type: ignore[assignment]


def reduced_head(model: Any) -> mx.array | None:
    """A reduced-head draft's id table (it scores these tokens with `head_logits`), else None."""
    return model.head_ids if hasattr(model, "head_logits") else None


def input_embedding(model: nn.Module) -> nn.Module | None:
    """A llama-style model's input embedding module (model.model.embed_tokens), if it has one."""
    return getattr(getattr(model, "model", None), "embed_tokens", None)


def save_draft(model: DraftModel, config: dict[str, Any], path: str | Path) -> None:
    """Write config.json + model.safetensors (config must already carry `quantization` if quantized).
    A draft that shares its target's embedding is written without it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    if shares_embedding(config):
        weights = {k: v for k, v in weights.items() if not k.startswith(EMBED)}
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
