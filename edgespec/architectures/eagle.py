"""Feature drafts (EAGLE-style), the model and its files: one small llama layer that reads the
target's own top hidden state (the drafter that runs it: edgespec/drafting/feature.py).

A token draft (draft_model.py) must rebuild from tokens alone what the target's 30 layers know; a
feature draft starts from what they computed. At context position i the target's top hidden state
f_i (final-normed, the input of its output head) decides token i + 1. The draft's position i
reads (f_i, embedding of token i + 1), one linear layer mixes the two, one llama layer runs, and its
normed output is a guess of f_{i+1}; the target's own output head rows for `head_ids` turn that guess
into logits for token i + 2. Further drafted tokens feed the draft its own guesses (f') instead of f.

Exactness does not depend on the drafter (the ratio test only needs the q it drafted from), so this is
as lossless as any draft. The features come free: the verify forward computes them anyway.

State across rounds (FeatureState, kept by the Engine between generations):
- `features` [P, d]: f_0 .. f_{P-1} of `context` (the target's features of committed tokens; the
  newest committed token's feature is computed by the next verify, so P = len(context) - 1);
- the draft's KV cache: position i holds (f_i, context[i + 1]) for i < kv.offset, always from true
  features (positions run on the draft's own guesses are rolled back after every round).

Files (config.json `model_type: "edgespec_eagle"`, weights in safetensors): fc.weight [d, 2d],
fc.bias [d], layers.{i}.* (llama blocks), norm.weight [d], head_ids [H], and lm_head.weight [H, d]
when config `eagle_head` is "own" (a head of its own, e.g. grown from a token draft); otherwise the
draft scores with the target's own head rows. The embedding (and the target's head rows) are
never stored: the loader attaches the target's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.models.base import create_attention_mask

from edgespec.architectures import EAGLE
from edgespec.architectures.token_draft import quantize_as_stored, read_weights
from edgespec.errors import ConfigError
from edgespec.files import sha256_file
from edgespec.taps import TOP

MODEL_TYPE = EAGLE
# What the draft reads in place of a feature for its 2nd, 3rd ... drafted token: its own guess
# (EAGLE; needs the feature-regression loss) or zeros (a draft grown from a token draft: later
# tokens then run on the token path alone).
CHAINS = ("guess", "zero")


class EagleModel(nn.Module):
    """fc(concat(f_i, emb(t_{i+1}))) -> llama blocks -> norm = guess of f_{i+1}; with several
    `feature_layers` (EAGLE-3), f_i = fuse(the target's hidden states of those layers)."""

    draft_family = "feature"  # run by edgespec/families/feature_family.py

    def __init__(
        self,
        args: llama.ModelArgs,
        n_layers: int,
        head_size: int,
        own_head: bool = False,
        feature_layers: tuple[int, ...] = (TOP,),
    ):
        super().__init__()
        self.args = args
        self.model_type = MODEL_TYPE
        d = args.hidden_size
        self.feature_layers = feature_layers
        if len(feature_layers) > 1:  # concat(low, mid, top) [k * d] -> d
            self.fuse_fc = nn.Linear(len(feature_layers) * d, d, bias=False)
        self.layer_scale = 1.0  # the RMS lower layers are normalised to (the top's, measured)
        self.fc = nn.Linear(2 * d, d, bias=True)
        self.layers = [llama.TransformerBlock(args) for _ in range(n_layers)]
        self.norm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        # A trained head of its own (e.g. grown from a token draft's), else the target's rows.
        if own_head:
            self.lm_head = nn.Linear(d, head_size, bias=False)
        self.head_ids = mx.zeros((head_size,), dtype=mx.int32)
        # The target's embedding module and head rows: plain attributes (not parameters: never
        # saved, never trained, shared with the target rather than copied).
        object.__setattr__(self, "embedding", None)
        object.__setattr__(self, "head_weight", None)
        # The head's product x @ w.T, replaced by the CPU rewrites where one-row products run
        # faster as two rows (edgespec.cpu.rowpad); None: the plain product.
        object.__setattr__(self, "head_product", None)
        self.chain = "guess"
        self.feature_scale = 1.0  # features are multiplied by this before the mixer

    @property
    def vocab_size(self) -> int:
        return self.args.vocab_size

    def attach(self, target: nn.Module) -> None:
        """Use `target`'s input embedding and the rows of its output head that score head_ids."""
        check_layers(self.feature_layers, len(target.model.layers))
        embedding = target.model.embed_tokens
        vocab = embedding.weight.shape[0]
        if vocab != self.args.vocab_size or target.args.hidden_size != self.args.hidden_size:
            raise ValueError(
                f"this feature draft was made for a target with {self.args.vocab_size} tokens "
                f"and width {self.args.hidden_size}; the target given has {vocab} tokens and "
                f"width {target.args.hidden_size}"
            )
        head = embedding if target.args.tie_word_embeddings else target.lm_head
        object.__setattr__(self, "embedding", embedding)
        object.__setattr__(self, "head_weight", _rows(head, self.head_ids))

    def __call__(self, features: mx.array, tokens: mx.array, cache: Any = None) -> mx.array:
        """features [B, L, d], tokens [B, L] (token i + 1 for feature i) -> guesses [B, L, d]."""
        if self.embedding is None:
            raise ValueError("a feature draft runs with its target; attach(target) first")
        if self.feature_scale != 1.0:
            features = features * self.feature_scale
        h = self.fc(mx.concatenate([features, self.embedding(tokens)], axis=-1))
        layer_caches = cache if cache is not None else [None] * len(self.layers)
        mask = create_attention_mask(h, layer_caches[0])
        for layer, c in zip(self.layers, layer_caches, strict=True):
            h = layer(h, mask, cache=c)
        return self.norm(h)

    def fuse(self, raw: mx.array) -> mx.array:
        """The target's hidden states of `feature_layers`, concatenated [..., k * d], -> the
        feature the draft reads [..., d]: the top one itself, or (several layers) one linear
        layer over them, the lower ones RMS-normalised to `layer_scale` first."""
        if "fuse_fc" not in self:
            return raw
        d = self.args.hidden_size
        parts = []
        for j, layer in enumerate(self.feature_layers):
            x = raw[..., j * d : (j + 1) * d]
            if layer != TOP:
                x = x.astype(mx.float32)
                x = x * mx.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * self.layer_scale
            parts.append(x.astype(raw.dtype))
        return self.fuse_fc(mx.concatenate(parts, axis=-1))

    def head_logits(self, guesses: mx.array) -> mx.array:
        """[..., d] -> logits over the head [..., H]; column j scores token head_ids[j]."""
        if "lm_head" in self:
            return self.lm_head(guesses)
        if self.head_product is not None:
            return self.head_product(guesses, self.head_weight)
        return guesses @ self.head_weight.T

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        return weights


def _rows(layer: nn.Module, ids: mx.array) -> mx.array:
    """Rows `ids` of an embedding / linear weight, dequantized if the layer is quantized."""
    if "scales" in layer:
        return mx.dequantize(
            layer["weight"][ids],
            scales=layer["scales"][ids],
            biases=layer["biases"][ids] if "biases" in layer else None,
            group_size=layer.group_size,
            bits=layer.bits,
        )
    return layer.weight[ids]


def check_layers(layers: tuple[int, ...], n_layers: int) -> None:
    """ConfigError unless every entry of a draft's feature_layers names a layer the target has."""
    bad = [i for i in layers if i != TOP and not 0 <= i < n_layers]
    if bad or not layers:
        raise ConfigError(
            f"this feature draft reads target layers {list(layers)} (feature_layers), but the "
            f"target has layers 0-{n_layers - 1} (and -1, its top); use the draft made for it"
        )


def build(config: dict[str, Any]) -> EagleModel:
    args = llama.ModelArgs.from_dict(config)
    own = config.get("eagle_head", "target") == "own"
    layers = tuple(int(i) for i in config.get("feature_layers", [TOP]))
    model = EagleModel(args, int(config["eagle_layers"]), int(config["head_size"]), own, layers)
    model.layer_scale = float(config.get("layer_scale", 1.0))
    model.chain = config.get("eagle_chain", "guess")
    model.feature_scale = float(config.get("feature_scale", 1.0))
    if model.chain not in CHAINS:
        raise ValueError(f"eagle_chain must be one of {', '.join(CHAINS)}, not {model.chain!r}")
    return model


def load_eagle(path: str | Path, target: nn.Module | None) -> tuple[EagleModel, dict[str, Any]]:
    """Load a feature-draft folder and attach it to `target` (required: the draft has no
    embedding or head of its own). Raises ValueError on a missing target or a shape mismatch."""
    if target is None or not hasattr(target, "model") or not hasattr(target, "args"):
        raise ValueError("this is a feature draft (EAGLE-style); load it together with its target")
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    model = build(config)
    weights = base_weights(path, config) | read_weights(path)
    quantize_as_stored(model, config, weights)
    model.load_weights(list(weights.items()), strict=True)
    model.attach(target)
    mx.eval(model.parameters(), model.head_weight)
    return model, config


def base_weights(path: Path, config: dict[str, Any]) -> dict[str, mx.array]:
    """A feature draft grown from a token draft may store only what it added (the feature mixer)
    and name its base (`eagle_base`: a folder relative to its own, with the sha256 of the base's
    weights): the layers, final norm, head and head ids are then read from the base draft."""
    base = config.get("eagle_base")
    if not base:
        return {}
    folder = (path / base["path"]).resolve()
    file = folder / "model.safetensors"
    if not file.is_file():
        raise ValueError(f"its base draft {base['path']} is missing ({file} not found)")
    if sha256_file(file) != base["sha256"]:
        raise ValueError(f"its base draft {base['path']} changed since it was made (sha256)")
    renamed = {}
    for k, v in cast(dict[str, mx.array], mx.load(str(file))).items():
        if k.startswith("model.layers.") or k.startswith("model.norm."):
            renamed[k.removeprefix("model.")] = v
        elif k.startswith("lm_head.") or k == "head_ids":
            renamed[k] = v
    return renamed
