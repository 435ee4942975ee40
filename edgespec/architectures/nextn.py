"""Next-n prediction layers: the MTP draft of DeepSeek-V3, GLM-4.5 and MiMo checkpoints.

A DeepSeek-V3 or GLM-4.5 checkpoint (`model_type` deepseek_v3, glm4_moe) stores its MTP layer as
one more decoder layer after the model's own, `model.layers.{num_hidden_layers}`
(`num_nextn_predict_layers: 1` in its config), with five extra modules. At context position t,
with h_t the target's hidden state as its family feeds the head (`mtp.FEEDS`) and x_{t+1} the
token that followed:

    e = enorm(embed(x_{t+1}))                      the target's own embedding
    h = hnorm(h_t)
    r = layer(eh_proj(concat([e, h])))             a decoder layer of the model's class
    logits = lm_head(shared_head.norm(r))          the target's own head -> token t + 2

the MTP contract of edgespec/architectures/mtp.py under other names, so a NextnModel is an MtpModel
(the same feature draft, the same `--method mtp`). The layer also stores `embed_tokens` and
`shared_head.head`, copies of the target's embedding and head (shared by design): they are not
kept. MiMo (`mimo`) stores the same thing as `model.mtp_layers.{i}` under its own names
(token_layernorm, hidden_layernorm, input_proj, final_layernorm; a Qwen2 block) and feeds
[h, e], hidden state first, to its projection (`Layout`). The feed is each family's reference
implementation's (docs/architectures.md): DeepSeek-V3 and GLM-4.5 read the target's hidden state
AFTER its final norm (vLLM's DeepseekV2Model and Glm4MoeModel return it normed to the proposer),
MiMo the state BEFORE it (Xiaomi's MiMoModel in vLLM returns the residual stream unnormed and
norms only for its own logits). A further chained draft step reads the head's own output in place of h_t, and which output
is each family's reference's too (RECYCLES): DeepSeek-V3 and GLM-4.5 recycle r, the residual
stream before `shared_head.norm` (vLLM's DeepSeekMultiTokenPredictorLayer.forward and
Glm4MoeMultiTokenPredictorLayer.forward return `residual + hidden_states`; the norm is applied
only in compute_logits), MiMo the normed output (its MiMoMultiTokenPredictorLayer returns
`final_layernorm(...)`). DeepSeek-V3's layer goes through
mlx-lm's own deepseek_v3 sanitize (fp8 weights, the MLA `kv_b_proj` split). mlx-lm's sanitize
drops these layers, so an mlx-community folder has no head; `edgespec pull FOLDER` converts an
original checkpoint keeping it (edgespec/loading/mtp_checkpoint.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import deepseek_v3, glm4_moe, mimo
from mlx_lm.models.base import create_attention_mask

from edgespec.architectures import mtp
from edgespec.errors import ConfigError
from edgespec.taps import output_head, text_model


@dataclass(frozen=True)
class Layout:
    """How a family stores its next-n layers: its args and decoder layer classes, where layer i
    lives in the checkpoint, the checkpoint's names of the extra modules (NextnModel's name ->
    the family's), and whether the projection reads [h, e] instead of [e, h]."""

    args: Any
    make_layer: Callable[[Any, int], nn.Module]  # (args, layer index) -> a decoder layer
    prefix: Callable[[dict[str, Any], int], str]  # (config, i) -> "model.layers.46."
    names: dict[str, str]
    hidden_first: bool = False
    # The family's own rules for the layer's weights, under names relative to the layer
    # (DeepSeek-V3: fp8 dequantized, kv_b_proj split); whether its attention wants an array mask.
    fix: Callable[[dict[str, mx.array], dict[str, Any]], dict[str, mx.array]] | None = None
    mask_array: bool = False


DEEPSEEK_NAMES = {n: n for n in ("enorm", "hnorm", "eh_proj", "shared_head.norm")}


def deepseek_fix(weights: dict[str, mx.array], config: dict[str, Any]) -> dict[str, mx.array]:
    """mlx-lm's own deepseek_v3 sanitize on the layer's weights, as if they were layer 0's (it
    reads nothing but the args): fp8 weights dequantized, experts stacked, the MLA `kv_b_proj`
    split into `self_attn.embed_q` / `unembed_out`."""
    holder = SimpleNamespace(args=deepseek_v3.ModelArgs.from_dict(config))
    renamed = {f"model.layers.0.{k}": v for k, v in weights.items()}
    fixed = deepseek_v3.Model.sanitize(holder, renamed)  # type: ignore[arg-type]
    return {k.removeprefix("model.layers.0."): v for k, v in fixed.items()}


FAMILIES: dict[str, Layout] = {
    "glm4_moe": Layout(
        glm4_moe.ModelArgs,
        glm4_moe.DecoderLayer,
        lambda config, i: f"model.layers.{int(config['num_hidden_layers']) + i}.",
        DEEPSEEK_NAMES,
    ),
    "deepseek_v3": Layout(
        deepseek_v3.ModelArgs,
        deepseek_v3.DeepseekV3DecoderLayer,
        lambda config, i: f"model.layers.{int(config['num_hidden_layers']) + i}.",
        DEEPSEEK_NAMES,
        fix=deepseek_fix,
        mask_array=True,
    ),
    "mimo": Layout(  # MiMo-7B: Qwen2 blocks, `model.mtp_layers.{i}`, [h, e] into input_proj
        mimo.ModelArgs,
        lambda args, index: mimo.TransformerBlock(args),
        lambda config, i: f"model.mtp_layers.{i}.",
        {
            "enorm": "token_layernorm",
            "hnorm": "hidden_layernorm",
            "eh_proj": "input_proj",
            "shared_head.norm": "final_layernorm",
        },
        hidden_first=True,
    ),
}
SHARED = ("embed_tokens.", "shared_head.head.")  # copies of the target's: not kept
# What a chained draft step reads in place of the target's state: the layer's output before the
# output norm ("raw") or after it ("normed"), as each family's reference (vLLM) recycles it.
RAW, NORMED = "raw", "normed"
RECYCLES: dict[str, str] = {"deepseek_v3": RAW, "glm4_moe": RAW, "mimo": NORMED}


class SharedHead(nn.Module):
    """The next-n layer's output norm (its `head`, the target's own, is not held)."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.norm = nn.RMSNorm(d, eps=eps)


class NextnModel(mtp.MtpModel):
    """The next-n layer of a DeepSeek-V3, GLM-4.5 or MiMo target, run as a feature draft (module
    docstring).

    Example: a GLM-4.5 target with 46 layers -> the layer `model.layers.46` of its checkpoint,
    reading the target's final-normed top hidden state beside the embedding of the token after
    it; a MiMo target with 36 layers -> `model.mtp_layers.0`, reading layer 35's output."""

    def __init__(self, args: Any, family: str = "glm4_moe"):
        nn.Module.__init__(self)
        self.args = args
        self.model_type = "edgespec_nextn"
        d, eps = args.hidden_size, args.rms_norm_eps
        self.enorm = nn.RMSNorm(d, eps=eps)
        self.hnorm = nn.RMSNorm(d, eps=eps)
        self.eh_proj = nn.Linear(2 * d, d, bias=False)
        self.layers = [FAMILIES[family].make_layer(args, args.num_hidden_layers)]
        self.hidden_first = FAMILIES[family].hidden_first
        self.mask_array = FAMILIES[family].mask_array
        self.shared_head = SharedHead(d, eps)
        self.feed = mtp.FEEDS[family]
        self.feature_layers = mtp.feed_layers(self.feed, args.num_hidden_layers)
        self.recycle = RECYCLES[family]
        self.head_ids = None
        self.chain = "guess"
        object.__setattr__(self, "target", None)

    def __call__(self, features: mx.array, tokens: mx.array, cache: Any = None) -> mx.array:
        """features [B, L, d], tokens [B, L] (token i + 1 for feature i) -> outputs [B, L, d]:
        what the next chained step reads (`recycle`: the layer's output, or it normed);
        `head_logits` scores them."""
        if self.target is None:
            raise ValueError("an MTP head runs with its target; attach(target) first")
        e = self.enorm(text_model(self.target).model.embed_tokens(tokens))
        h = self.hnorm(features)
        x = self.eh_proj(mx.concatenate([h, e] if self.hidden_first else [e, h], axis=-1))
        caches = cache if cache is not None else [None] * len(self.layers)
        mask = create_attention_mask(x, caches[0], return_array=self.mask_array)
        for layer, c in zip(self.layers, caches, strict=True):
            x = layer(x, mask, c)
        return x if self.recycle == RAW else self.shared_head.norm(x)

    def head_logits(self, outputs: mx.array) -> mx.array:
        """Outputs of `__call__` [..., d] -> logits [..., V]: normed by `shared_head.norm` first
        where they were recycled raw."""
        normed = self.shared_head.norm(outputs) if self.recycle == RAW else outputs
        return output_head(self.target, normed)


def nextn_layers(config: dict[str, Any]) -> int:
    """How many next-n layers the config declares (`num_nextn_predict_layers`; 0: none)."""
    return int(config.get("num_nextn_predict_layers", 0) or 0)


def is_nextn(config: dict[str, Any]) -> bool:
    """Whether the config's head is stored as next-n layers (its family is one of FAMILIES)."""
    return config.get("model_type") in FAMILIES


def layer_prefix(config: dict[str, Any]) -> str:
    """The checkpoint's names of the first next-n layer: DeepSeek-V3 and GLM-4.5
    `model.layers.{num_hidden_layers}.`, MiMo `model.mtp_layers.0.`."""
    return FAMILIES[config["model_type"]].prefix(config, 0)


def sanitize_nextn(weights: dict[str, mx.array], config: dict[str, Any]) -> dict[str, mx.array]:
    """A checkpoint's next-n layer -> NextnModel names: the prefix dropped, the extra modules
    renamed (MiMo's `input_proj` -> `eh_proj`), the decoder layer's weights under `layers.0.`,
    the shared copies left out, experts stacked. Example, GLM-4.5 with 4 layers:
    {"model.layers.4.enorm.weight": w, "model.layers.4.self_attn.q_proj.weight": q,
    "model.layers.4.embed_tokens.weight": E} -> {"enorm.weight": w,
    "layers.0.self_attn.q_proj.weight": q}."""
    prefix, layout = layer_prefix(config), FAMILIES[config["model_type"]]
    theirs = {f"{v}.": f"{k}." for k, v in layout.names.items()}
    layer = {k.removeprefix(prefix): v for k, v in weights.items()}
    layer = {k: v for k, v in layer.items() if not k.startswith(SHARED)}
    if layout.fix is not None:
        layer = layout.fix(layer, config)
    out = {}
    for name, value in layer.items():
        own = next((t for t in theirs if name.startswith(t)), None)
        out[theirs[own] + name[len(own) :] if own else f"layers.0.{name}"] = value
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
    return NextnModel(FAMILIES[family].args.from_dict(config), family)


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
    return sanitize_nextn(found, config)


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
    if family.startswith("gemma4"):  # its head is a checkpoint of its own
        raise ConfigError(
            "a Gemma 4 target's MTP-style head is Google's -assistant checkpoint: use a "
            "gemma4-*-assistant pair (--method mtp, draft or hybrid) or pass it as --draft "
            "(e.g. google/gemma-4-31B-it-assistant) with --method draft or hybrid"
        )
    if family not in mtp.FAMILIES:
        raise ConfigError(
            "--method mtp runs Qwen3.5, Qwen3-Next, DeepSeek-V3, GLM-4.5 and MiMo targets "
            f"(model_type {', '.join([*mtp.FAMILIES, *FAMILIES])}), "
            f"not {family or 'a config without model_type'}"
        )
    return mtp.build(config)


def read_head(path: Path, config: dict[str, Any]) -> dict[str, mx.array]:
    """The head's weights stored in `path`, under the names of `build_head(config)`."""
    return read_nextn(path, config) if is_nextn(config) else mtp.read_mtp(path, config)


def load_head(path: Path, config: dict[str, Any], target: nn.Module) -> mtp.MtpModel:
    """The MTP head stored with the target at `path`, attached to the loaded `target`."""
    return mtp.fill(build_head(config), read_head(path, config), config, path, target)
