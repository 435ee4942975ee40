"""Multi-token prediction (MTP) heads: the draft a model ships inside its own checkpoint.

Qwen3.5 checkpoints carry `mtp.*` weights beside the model: one more decoder layer trained to
predict the token after next. At context position t, with h_t the target's hidden state BEFORE its
final norm (the output of its last layer) and x_{t+1} the token that followed:

    e = pre_fc_norm_embedding(embed(x_{t+1}))      the target's own embedding
    h = pre_fc_norm_hidden(h_t)
    y = norm(layer(fc(concat([e, h]))))             one full-attention layer, its own KV cache
    logits = lm_head(y)                             the target's own head -> token t + 2

Further drafted tokens run the same layer recursively: its output y replaces h_t and the token it
just proposed replaces x_{t+1}. That is the feature-draft contract of edgespec/drafting/eagle.py
(draft cache position i holds (f_i, context[i + 1])), with f_i the last layer's output instead of
the top hidden state, so an MtpModel runs in an EagleState under the EagleDrafter
(edgespec/drafting/features.py): features come from the verify forward, q per position from the
target's head, and exactness from the ratio test like any draft.

Weights: `mtp.fc.weight` [d, 2d] (embedding half first), `mtp.pre_fc_norm_embedding.weight`,
`mtp.pre_fc_norm_hidden.weight`, `mtp.layers.0.*` (names of the model's own decoder layer),
`mtp.norm.weight`. They are read from the original Hugging Face safetensors (whose norm weights
are stored as offsets from 1, as mlx-lm's sanitize knows for the rest of the model) or from a
converted folder's `mtp.safetensors` (sanitized, with `mtp_quantization` in config.json). mlx-lm
and mlx-community conversions drop every `mtp.` key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models import qwen3_5
from mlx_lm.models.base import create_attention_mask

from edgespec.cache import output_head, text_model
from edgespec.errors import ConfigError

MTP_FILE = "mtp.safetensors"  # a converted folder's MTP layer, beside its model.safetensors
FAMILIES = ("qwen3_5", "qwen3_5_text")


class MtpModel(nn.Module):
    """The MTP layer of a Qwen3.5 target, run as a feature draft (see the module docstring).

    Example: a target with 32 layers -> feature_layers (31,): the verify forward records layer
    31's output, which `__call__` reads beside the embedding of the token after it."""

    def __init__(self, args: qwen3_5.TextModelArgs, n_layers: int = 1):
        super().__init__()
        self.args = args
        self.model_type = "edgespec_mtp"
        d = args.hidden_size
        self.pre_fc_norm_embedding = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.fc = nn.Linear(2 * d, d, bias=False)
        attention = args.full_attention_interval - 1  # a full-attention layer index
        self.layers = [qwen3_5.DecoderLayer(args, attention) for _ in range(n_layers)]
        self.norm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.feature_layers = (args.num_hidden_layers - 1,)
        self.head_ids = None  # the target's full head: q is over the whole vocabulary
        self.chain = "guess"  # later tokens read the layer's own output
        object.__setattr__(self, "target", None)  # not a parameter: shared, never saved

    def attach(self, target: nn.Module) -> None:
        """Read the embedding and output head of `target` (looked up at each call, so the CPU
        rewrites applied to the target later are used too)."""
        object.__setattr__(self, "target", target)

    def fuse(self, raw: mx.array) -> mx.array:
        """The features as recorded: the last layer's output, read as is."""
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
    """Original Hugging Face `mtp.*` weights -> MtpModel names: the prefix dropped and every norm
    weight offset by 1 (stored as w - 1, as the model's other norms). Example:
    {"mtp.norm.weight": [0.0, 0.5]} -> {"norm.weight": [1.0, 1.5]}."""
    out = {}
    for key, value in weights.items():
        name = key.removeprefix("mtp.")
        if name.endswith("norm.weight") and value.ndim == 1:
            value = value + 1.0
        out[name] = value
    return out


def hf_mtp_weights(path: Path) -> dict[str, mx.array]:
    """The `mtp.*` arrays of a folder's safetensors (lazy; an index file, when present, names the
    shards that hold them). Empty when the folder has none."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(
            {
                f
                for k, f in json.loads(index.read_text())["weight_map"].items()
                if k.startswith("mtp.")
            }
        )
    else:
        files = sorted(f.name for f in path.glob("*.safetensors") if f.name != MTP_FILE)
    found: dict[str, mx.array] = {}
    for name in files:
        arrays = mx.load(str(path / name))
        assert isinstance(arrays, dict)
        found |= {k: v for k, v in arrays.items() if k.startswith("mtp.")}
    return found


def read_mtp(path: Path, config: dict[str, Any]) -> dict[str, mx.array]:
    """The MTP weights of a model folder under MtpModel's names: a converted folder's
    mtp.safetensors, else the original checkpoint's `mtp.*` keys. ConfigError (one line, saying
    how to get them) when the folder has none."""
    if (path / MTP_FILE).is_file():
        arrays = mx.load(str(path / MTP_FILE))
        assert isinstance(arrays, dict)
        return arrays
    found = hf_mtp_weights(path)
    if not found:
        raise ConfigError(
            f"{path} has no MTP weights (mlx-lm and mlx-community conversions drop them); "
            "convert the original Hugging Face checkpoint with `edgespec pull FOLDER`"
        )
    return sanitize_hf(found)


def build(config: dict[str, Any]) -> MtpModel:
    """An MtpModel for a target config (ConfigError for a family or config without MTP)."""
    text = text_config(config)
    family = text.get("model_type", config.get("model_type"))
    if family not in FAMILIES and config.get("model_type") not in FAMILIES:
        raise ConfigError(
            f"--method mtp runs Qwen3.5 targets (model_type {', '.join(FAMILIES)}), not {family}"
        )
    n = mtp_layers(config)
    if n < 1:
        raise ConfigError("this target declares no MTP layer (mtp_num_hidden_layers in config)")
    args = qwen3_5.TextModelArgs.from_dict(text)
    if args.num_experts > 0:
        raise ConfigError("MTP heads of mixture-of-experts Qwen3.5 models are not supported yet")
    return MtpModel(args, n)


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


def load_mtp(path: Path, config: dict[str, Any], target: nn.Module) -> MtpModel:
    """The MTP head stored with the target at `path`, attached to the loaded `target`."""
    model = build(config)
    weights = read_mtp(path, config)
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
