"""Multi-token prediction (MTP) heads: the draft a model ships inside its own checkpoint.

Qwen3.5 and Qwen3-Next checkpoints carry `mtp.*` weights beside the model: one more decoder layer
trained to predict the token after next. At context position t, with h_t the target's hidden
state as its family feeds the head (`feed`: AFTER the final norm for Qwen3.5 / Qwen3-Next, the
tensor the target's own head scores) and x_{t+1} the token that followed:

    e = pre_fc_norm_embedding(embed(x_{t+1}))      the target's own embedding
    h = pre_fc_norm_hidden(h_t)
    y = norm(layer(fc(concat([e, h]))))             one full-attention layer, its own KV cache
    logits = lm_head(y)                             the target's own head -> token t + 2

Further drafted tokens run the same layer recursively: its output y replaces h_t and the token it
just proposed replaces x_{t+1}. That is the feature-draft contract of edgespec/architectures/eagle.py
(draft cache position i holds (f_i, context[i + 1])), so an MtpModel runs in an FeatureState under
the FeatureDrafter (edgespec/drafting/feature.py): features come from the verify forward, q per
position from the target's head, and exactness from the ratio test like any draft.

The feed is the family's, as its reference implementation gives it (FEEDS; the sources are in
docs/architectures.md): POST_NORM reads the target's top hidden state (feature_layers (TOP,)),
PRE_NORM the output of its last layer (feature_layers (n - 1,)). Either is recorded by the verify
forward as it passes (edgespec/taps.py target_features): the target's logits do not change. An
RMSNorm in the head absorbs the scale, so a wrong feed never looks broken: only acceptance drops.

Weights: `mtp.fc.weight` [d, 2d] (embedding half first), `mtp.pre_fc_norm_embedding.weight`,
`mtp.pre_fc_norm_hidden.weight`, `mtp.layers.0.*` (names of the model's own decoder layer, experts
stacked as mlx-lm stacks the model's: `stack_experts`), `mtp.norm.weight`. They are read from the
original Hugging Face safetensors (whose norm weights are stored as offsets from 1, as mlx-lm's
sanitize knows for the rest of the model) or from a converted folder's `mtp.safetensors`
(sanitized, with `mtp_quantization` in config.json). mlx-lm and mlx-community conversions drop
every `mtp.` key.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models import qwen3_5, qwen3_next
from mlx_lm.models.base import create_attention_mask

from edgespec.errors import ConfigError
from edgespec.taps import TOP, output_head, text_model

MTP_FILE = "mtp.safetensors"  # a converted folder's MTP layer, beside its model.safetensors
# model_type -> (its text args class, its decoder layer class): the MTP layer is the model's own.
FAMILIES: dict[str, tuple[Any, Any]] = {
    "qwen3_5": (qwen3_5.TextModelArgs, qwen3_5.DecoderLayer),
    "qwen3_5_text": (qwen3_5.TextModelArgs, qwen3_5.DecoderLayer),
    "qwen3_5_moe": (qwen3_5.TextModelArgs, qwen3_5.DecoderLayer),
    "qwen3_next": (qwen3_next.ModelArgs, qwen3_next.Qwen3NextDecoderLayer),
}
# Which hidden state the head reads: the target's after its final norm, or before it.
POST_NORM, PRE_NORM = "post-norm", "pre-norm"
# model_type (these and the next-n families of nextn.py) -> the feed of its reference
# implementation, vLLM's: its Qwen3-Next (and Qwen3.5), DeepSeek-V2/V3 and GLM-4.5 models return
# the final-normed state to the MTP proposer, its MiMo model (Xiaomi's) the unnormed one
# (docs/architectures.md names the files).
FEEDS: dict[str, str] = {family: POST_NORM for family in FAMILIES} | {
    "deepseek_v3": POST_NORM,
    "glm4_moe": POST_NORM,
    "mimo": PRE_NORM,
}


def feed_layers(feed: str, n_layers: int) -> tuple[int, ...]:
    """The target hidden states (feature_layers) a head with `feed` reads: POST_NORM the top,
    final-normed one (TOP), PRE_NORM the output of the last layer. Example: (PRE_NORM, 32) ->
    (31,)."""
    if feed not in (POST_NORM, PRE_NORM):
        raise ValueError(f"unknown MTP feed {feed!r} (want {POST_NORM!r} or {PRE_NORM!r})")
    return (TOP,) if feed == POST_NORM else (n_layers - 1,)


class MtpModel(nn.Module):
    """The MTP layer of a Qwen3.5 / Qwen3-Next target, run as a feature draft (module docstring).

    Example: a Qwen3.5 target (feed POST_NORM) -> feature_layers (TOP,): the verify forward
    records its final-normed top hidden state, which `__call__` reads beside the embedding of the
    token after it."""

    draft_family = (
        "mtp"  # a feature draft that is the target's own head (families/feature_family.py)
    )

    def __init__(self, args: Any, family: str = "qwen3_5"):
        super().__init__()
        self.args = args
        self.model_type = "edgespec_mtp"
        d = args.hidden_size
        self.pre_fc_norm_embedding = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.fc = nn.Linear(2 * d, d, bias=False)
        layer = FAMILIES[family][1]
        attention = args.full_attention_interval - 1  # a full-attention layer index
        self.layers = [layer(args, attention)]
        self.norm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.feed = FEEDS[family]
        self.feature_layers = feed_layers(self.feed, args.num_hidden_layers)
        self.head_ids = None  # the target's full head: q is over the whole vocabulary
        self.chain = "guess"  # later tokens read the layer's own output
        object.__setattr__(self, "target", None)  # not a parameter: shared, never saved

    def attach(self, target: nn.Module) -> None:
        """Read the embedding and output head of `target` (looked up at each call, so the CPU
        rewrites applied to the target later are used too)."""
        object.__setattr__(self, "target", target)

    def fuse(self, raw: mx.array) -> mx.array:
        """The features as recorded (the hidden state of `feed`), read as is."""
        return raw

    def __call__(self, features: mx.array, tokens: mx.array, cache: Any = None) -> mx.array:
        """features [B, L, d], tokens [B, L] (token i + 1 for feature i) -> outputs [B, L, d]."""
        if self.target is None:
            raise ValueError("an MTP head runs with its target; attach(target) first")
        e = self.pre_fc_norm_embedding(text_model(self.target).model.embed_tokens(tokens))
        x = self.fc(mx.concatenate([e, self.pre_fc_norm_hidden(features)], axis=-1))
        caches = cache if cache is not None else [None] * len(self.layers)
        mask = create_attention_mask(x, caches[0])
        for layer, c in zip(self.layers, caches, strict=True):
            x = layer(x, mask, c)
        return self.norm(x)

    def head_logits(self, outputs: mx.array) -> mx.array:
        """[..., d] -> logits over the vocabulary [..., V], by the target's own head."""
        return output_head(self.target, outputs)


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text part of a config: `text_config` of a conditional-generation model, else itself."""
    return config.get("text_config", config)


def mtp_layers(config: dict[str, Any]) -> int:
    """How many MTP layers the config declares (`mtp_num_hidden_layers`; 0: none)."""
    return int(text_config(config).get("mtp_num_hidden_layers", 0) or 0)


def sanitize_hf(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Original Hugging Face `mtp.*` weights -> MtpModel names: the prefix dropped, every norm
    weight offset by 1 (stored as w - 1, as the model's other norms), experts stacked. Example:
    {"mtp.norm.weight": [0.0, 0.5]} -> {"norm.weight": [1.0, 1.5]}."""
    out = {}
    for key, value in weights.items():
        name = key.removeprefix("mtp.")
        if name.endswith("norm.weight") and value.ndim == 1:
            value = value + 1.0
        out[name] = value
    return stack_experts(out)


_EXPERT = re.compile(r"(.+\.mlp)\.experts\.(\d+)\.(\w+_proj)\.weight")
_FUSED = re.compile(r"(.+\.mlp)\.experts\.(gate_up_proj|down_proj)")


def stack_experts(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Experts as mlx-lm's SwitchGLU holds them, [E, out, in] per projection, from one weight per
    expert (Qwen3-Next: `mlp.experts.{e}.up_proj.weight`) or fused ones (Qwen3.5 MoE:
    `mlp.experts.gate_up_proj` [E, 2 I, d], gate rows first, and `mlp.experts.down_proj`)."""
    out: dict[str, mx.array] = {}
    experts: dict[tuple[str, str], dict[int, mx.array]] = {}
    for key, value in weights.items():
        if one := _EXPERT.fullmatch(key):
            experts.setdefault((one[1], one[3]), {})[int(one[2])] = value
        elif fused := _FUSED.fullmatch(key):
            if fused[2] == "down_proj":
                out[f"{fused[1]}.switch_mlp.down_proj.weight"] = value
            else:
                mid = value.shape[-2] // 2
                out[f"{fused[1]}.switch_mlp.gate_proj.weight"] = value[..., :mid, :]
                out[f"{fused[1]}.switch_mlp.up_proj.weight"] = value[..., mid:, :]
        else:
            out[key] = value
    for (mlp, proj), found in experts.items():
        out[f"{mlp}.switch_mlp.{proj}.weight"] = mx.stack([found[e] for e in sorted(found)])
    return out


def hf_mtp_weights(path: Path, prefix: str = "mtp.") -> dict[str, mx.array]:
    """The arrays of a folder's safetensors whose names start with `prefix` (lazy; an index file,
    when present, names the shards that hold them). Empty when the folder has none."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(
            {
                f
                for k, f in json.loads(index.read_text())["weight_map"].items()
                if k.startswith(prefix)
            }
        )
    else:
        files = sorted(f.name for f in path.glob("*.safetensors"))
    found: dict[str, mx.array] = {}
    for name in files:
        arrays = mx.load(str(path / name))
        assert isinstance(arrays, dict)
        found |= {k: v for k, v in arrays.items() if k.startswith(prefix)}
    return found


def converted_weights(path: Path, raw_prefix: str) -> dict[str, mx.array] | None:
    """A converted folder's mtp.safetensors (the head's own names), or None: no such file, or
    one that holds a checkpoint's raw names (they start with `raw_prefix`)."""
    if not (path / MTP_FILE).is_file():
        return None
    arrays = mx.load(str(path / MTP_FILE))
    assert isinstance(arrays, dict)
    return None if any(k.startswith(raw_prefix) for k in arrays) else arrays


def no_weights(path: Path) -> ConfigError:
    """The one-line error for a folder without the head's weights, saying how to get them."""
    return ConfigError(
        f"{path} has no MTP weights (mlx-lm and mlx-community conversions drop them); "
        "convert the original Hugging Face checkpoint with `edgespec pull FOLDER`"
    )


def read_mtp(path: Path, config: dict[str, Any]) -> dict[str, mx.array]:
    """The MTP weights of a model folder under MtpModel's names: a converted folder's
    mtp.safetensors, else the original checkpoint's `mtp.*` keys. ConfigError (one line, saying
    how to get them) when the folder has none."""
    converted = converted_weights(path, "mtp.")
    if converted is not None:
        return converted
    found = hf_mtp_weights(path)
    if not found:
        raise no_weights(path)
    return sanitize_hf(found)


def build(config: dict[str, Any]) -> MtpModel:
    """An MtpModel for a target config (ConfigError for a family or config without MTP)."""
    family = config.get("model_type", "")
    if family not in FAMILIES:
        raise ConfigError(
            f"--method mtp runs Qwen3.5 and Qwen3-Next targets (model_type "
            f"{', '.join(FAMILIES)}), not {family or 'a config without model_type'}"
        )
    n = mtp_layers(config)
    if n == 0:
        raise ConfigError("this target declares no MTP layer (mtp_num_hidden_layers in config)")
    if n != 1:  # several MTP layers take turns per drafted token elsewhere: not supported here
        raise ConfigError(
            f"--method mtp runs targets with one MTP layer; this one declares {n} "
            "(mtp_num_hidden_layers in config.json)"
        )
    return MtpModel(FAMILIES[family][0].from_dict(text_config(config)), family)


def quantize_as_stored(model: MtpModel, config: dict[str, Any], weights: dict) -> None:
    """Quantize `model` the way its stored weights are (config `mtp_quantization`), so that
    load_weights finds the packed weights' modules."""
    quant = config.get("mtp_quantization")
    if not quant:
        return
    nn.quantize(
        model,
        group_size=int(quant["group_size"]),
        bits=int(quant["bits"]),
        class_predicate=lambda p, m: f"{p}.scales" in weights,
    )


def fill(
    model: MtpModel, weights: dict, config: dict[str, Any], path: Path, target: nn.Module
) -> MtpModel:
    """`model` with the stored `weights` (quantized as stored), attached to `target`;
    ConfigError when their names do not match the model's."""
    quantize_as_stored(model, config, weights)
    want = set(dict(tree_flatten(model.parameters())))
    if set(weights) != want:
        missing, extra = sorted(want - set(weights)), sorted(set(weights) - want)
        raise ConfigError(
            f"{path}: the MTP weights do not match the config (missing {missing[:3]}, "
            f"unexpected {extra[:3]})"
        )
    model.load_weights(list(weights.items()), strict=True)
    model.attach(target)
    mx.eval(model.parameters())
    return model
