"""Next-n prediction layers (DeepSeek-V3 style): the MTP draft of GLM-4.5 / GLM-4.6 checkpoints.

A GLM-4.5 checkpoint (`model_type` glm4_moe) stores its MTP layer as one more decoder layer after
the model's own, `model.layers.{num_hidden_layers}` (`num_nextn_predict_layers: 1` in its
config), with five extra modules. At context position t, with h_t the target's hidden state
before its final norm and x_{t+1} the token that followed:

    e = enorm(embed(x_{t+1}))                      the target's own embedding
    h = hnorm(h_t)
    y = shared_head.norm(layer(eh_proj(concat([e, h]))))    a decoder layer of the model's class
    logits = lm_head(y)                            the target's own head -> token t + 2

the MTP contract of edgespec/drafting/mtp.py under other names, so a NextnModel is an MtpModel
(the same feature draft, the same `--method mtp`). The layer also stores `embed_tokens` and
`shared_head.head`, copies of the target's embedding and head (shared by design): they are not
kept. mlx-lm's glm4_moe sanitize drops the whole layer, so an mlx-community folder has no head;
`edgespec pull FOLDER` converts an original checkpoint keeping it (edgespec/loading/mtp.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import glm4_moe
from mlx_lm.models.base import create_attention_mask

from edgespec.cache import text_model
from edgespec.drafting import mtp
from edgespec.errors import ConfigError

# model_type -> (its args class, its decoder layer class): the next-n layer is the model's own.
FAMILIES: dict[str, tuple[Any, Any]] = {
    "glm4_moe": (glm4_moe.ModelArgs, glm4_moe.DecoderLayer),
}
OWN = ("enorm.", "hnorm.", "eh_proj.", "shared_head.norm.")  # the layer's extra modules
SHARED = ("embed_tokens.", "shared_head.head.")  # copies of the target's: not kept


class SharedHead(nn.Module):
    """The next-n layer's output norm (its `head`, the target's own, is not held)."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.norm = nn.RMSNorm(d, eps=eps)


class NextnModel(mtp.MtpModel):
    """The next-n layer of a GLM-4.5 target, run as a feature draft (module docstring).

    Example: a target with 46 layers -> the layer `model.layers.46` of its checkpoint, reading
    layer 45's output beside the embedding of the token after it."""

    def __init__(self, args: Any, family: str = "glm4_moe"):
        nn.Module.__init__(self)
        self.args = args
        self.model_type = "edgespec_nextn"
        d, eps = args.hidden_size, args.rms_norm_eps
        self.enorm = nn.RMSNorm(d, eps=eps)
        self.hnorm = nn.RMSNorm(d, eps=eps)
        self.eh_proj = nn.Linear(2 * d, d, bias=False)
        self.layers = [FAMILIES[family][1](args, args.num_hidden_layers)]
        self.shared_head = SharedHead(d, eps)
        self.feature_layers = (args.num_hidden_layers - 1,)
        self.head_ids = None
        self.chain = "guess"
        object.__setattr__(self, "target", None)

    def __call__(self, features: mx.array, tokens: mx.array, cache: Any = None) -> mx.array:
        """features [B, L, d], tokens [B, L] (token i + 1 for feature i) -> outputs [B, L, d]."""
        if self.target is None:
            raise ValueError("an MTP head runs with its target; attach(target) first")
        e = self.enorm(text_model(self.target).model.embed_tokens(tokens))
        x = self.eh_proj(mx.concatenate([e, self.hnorm(features)], axis=-1))
        caches = cache if cache is not None else [None] * len(self.layers)
        mask = create_attention_mask(x, caches[0])
        for layer, c in zip(self.layers, caches, strict=True):
            x = layer(x, mask, c)
        return self.shared_head.norm(x)


def nextn_layers(config: dict[str, Any]) -> int:
    """How many next-n layers the config declares (`num_nextn_predict_layers`; 0: none)."""
    return int(config.get("num_nextn_predict_layers", 0) or 0)


def is_nextn(config: dict[str, Any]) -> bool:
    """Whether the config's head is stored as next-n layers (its family is one of FAMILIES)."""
    return config.get("model_type") in FAMILIES


def layer_prefix(config: dict[str, Any]) -> str:
    """The checkpoint's names of the first next-n layer: `model.layers.{num_hidden_layers}.`."""
    return f"model.layers.{int(config['num_hidden_layers'])}."


def sanitize_nextn(weights: dict[str, mx.array], prefix: str) -> dict[str, mx.array]:
    """A checkpoint's next-n layer -> NextnModel names: the prefix dropped, the decoder layer's
    weights under `layers.0.`, the shared copies left out, experts stacked. Example, prefix
    `model.layers.4.`: {"model.layers.4.enorm.weight": w, "model.layers.4.self_attn.q_proj.weight":
    q, "model.layers.4.embed_tokens.weight": E} -> {"enorm.weight": w,
    "layers.0.self_attn.q_proj.weight": q}."""
    out = {}
    for key, value in weights.items():
        name = key.removeprefix(prefix)
        if name.startswith(SHARED):
            continue
        out[name if name.startswith(OWN) else f"layers.0.{name}"] = value
    return mtp.stack_experts(out)


def build_nextn(config: dict[str, Any]) -> NextnModel:
    """A NextnModel for a target config (ConfigError without exactly one next-n layer)."""
    n = nextn_layers(config)
    if n == 0:
        raise ConfigError("this target declares no MTP layer (num_nextn_predict_layers in config)")
    if n != 1:
        raise ConfigError(
            f"--method mtp runs targets with one MTP layer; this one declares {n} "
            "(num_nextn_predict_layers in config.json)"
        )
    family = config["model_type"]
    return NextnModel(FAMILIES[family][0].from_dict(config), family)


def read_nextn(path: Path, config: dict[str, Any]) -> dict[str, mx.array]:
    """The next-n weights of a model folder under NextnModel's names: a converted folder's
    mtp.safetensors, else the checkpoint's layer `num_hidden_layers`. One-line ConfigError when
    the folder has neither."""
    prefix = layer_prefix(config)
    converted = mtp.converted_weights(path, prefix)
    if converted is not None:
        return converted
    found = mtp.hf_mtp_weights(path, prefix)
    if not found:
        raise mtp.no_weights(path)
    return sanitize_nextn(found, prefix)


# Either way of storing a head: Qwen3.5 / Qwen3-Next `mtp.*`, or next-n layers.


def head_layers(config: dict[str, Any]) -> int:
    """The MTP layers a config declares, in either way of storing them."""
    return nextn_layers(config) if is_nextn(config) else mtp.mtp_layers(config)


def has_raw_head(path: Path, config: dict[str, Any]) -> bool:
    """Whether the safetensors of `path` hold the head under a checkpoint's own names (an
    mlx-community conversion keeps the config's declaration but drops the weights)."""
    prefix = layer_prefix(config) if is_nextn(config) else "mtp."
    return bool(mtp.hf_mtp_weights(path, prefix))


def build_head(config: dict[str, Any]) -> mtp.MtpModel:
    """The head for a target config: a NextnModel for next-n families, else mtp.build's
    (ConfigError, one line, for a family with neither)."""
    family = config.get("model_type", "")
    if is_nextn(config):
        return build_nextn(config)
    if family not in mtp.FAMILIES:
        raise ConfigError(
            f"--method mtp runs Qwen3.5, Qwen3-Next and GLM-4.5 targets (model_type "
            f"{', '.join([*mtp.FAMILIES, *FAMILIES])}), not {family or 'a config without model_type'}"
        )
    return mtp.build(config)


def read_head(path: Path, config: dict[str, Any]) -> dict[str, mx.array]:
    """The head's weights stored in `path`, under the names of `build_head(config)`."""
    return read_nextn(path, config) if is_nextn(config) else mtp.read_mtp(path, config)


def load_head(path: Path, config: dict[str, Any], target: nn.Module) -> mtp.MtpModel:
    """The MTP head stored with the target at `path`, attached to the loaded `target`."""
    return mtp.fill(build_head(config), read_head(path, config), config, path, target)
