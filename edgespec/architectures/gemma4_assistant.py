"""Gemma 4's assistant drafters: Google's `-assistant` checkpoints (model_type gemma4_assistant;
the 12B's gemma4_unified_assistant), a 4-layer head that drafts from its target's own states.

The format, as the reference implementations read it (sources: docs/architectures.md):
- config.json: `backbone_hidden_size` (the target's hidden size), `use_ordered_embeddings`,
  `num_centroids`, `centroid_intermediate_top_k`, `tie_word_embeddings` and a gemma4_text
  `text_config` (4 layers, sliding x3 then full, every one KV-shared: no key or value weights).
- weights: `model.embed_tokens.weight` [V, d] (also the head, tied), `model.norm.weight`,
  `model.layers.{i}.` {input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
  post_feedforward_layernorm}.weight, `layer_scalar`, `self_attn.{q_proj, o_proj, q_norm}`,
  `mlp.{gate_proj, up_proj, down_proj}`, `pre_projection.weight` [d, 2 B],
  `post_projection.weight` [B, d]; with ordered embeddings (E2B, E4B) also
  `masked_embedding.centroids.weight` [C, d] and `masked_embedding.token_ordering` [V] (int).

One draft step at committed context x_0..x_n (the target's cache holds x_0..x_{n-1}, the
verify computed h_{n-1}, the target's final-normed top hidden state at position n - 1):

    a = pre_projection(concat([target_embed(x_n) * sqrt(B), h]))
    y = norm(layers(a))          each layer's query at position n - 1 attends to the keys and
                                 values of the target's last cache layer of its kind (sliding:
                                 the last `sliding_window` positions; full: all n)
    logits = embed_tokens.as_linear(y)      (or the centroid-routed head, MaskedHead)
    h' = post_projection(y)      the next step's h, with the drafted token as x

Further tokens repeat the step at the same position over the same keys and values.

generation_config.json's `suppress_tokens` (Google's assistants list the image and audio
delimiters there) get -inf draft logits, on the dense and the centroid-routed head alike, as
vLLM masks them from its Gemma 4 drafter (vllm-project/vllm PR #53884; #52072 for the sparse
head): such a token is never proposed. Exactness does not depend on it (the target verifies
every token), acceptance does: a proposal the target's own sampling would never produce is
a wasted draft.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models import gemma4_text

from edgespec.architectures import ASSISTANTS
from edgespec.errors import ConfigError
from edgespec.taps import TOP, text_model

MODEL_TYPES = ASSISTANTS  # config.json model_type
TOP_FIELDS = ("backbone_hidden_size", "text_config")
TEXT_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "global_head_dim",
    "vocab_size",
    "layer_types",
    "sliding_window",
    "rope_parameters",
)
KV = dict[str, tuple[mx.array, mx.array]]  # layer type -> (keys, values) [1, heads, S, head]


def assistant_args(config: dict[str, Any], where: Any) -> gemma4_text.ModelArgs:
    """The text_config as mlx-lm's gemma4_text args, every layer KV-shared (as the checkpoint
    has no key or value weights); ConfigError naming the first field that is missing or that
    this head cannot run (per-layer inputs, experts)."""
    for key in TOP_FIELDS:
        if key not in config:
            raise ConfigError(f"{where}: the Gemma 4 assistant's config.json lacks {key!r}")
    text = dict(config["text_config"])
    for key in TEXT_FIELDS:
        if key not in text:
            raise ConfigError(f"{where}: the assistant's text_config lacks {key!r}")
    n = int(text["num_hidden_layers"])
    if int(text.get("num_kv_shared_layers") or n) != n:  # 0 or absent: all (as HF reads it)
        raise ConfigError(f"{where}: text_config num_kv_shared_layers must be {n} (all layers)")
    for key in ("hidden_size_per_layer_input", "enable_moe_block"):
        if text.get(key):
            raise ConfigError(f"{where}: text_config {key} is set; the assistant has none")
    if len(text["layer_types"]) != n:
        raise ConfigError(f"{where}: text_config layer_types does not name {n} layers")
    text |= {"model_type": "gemma4_text", "num_kv_shared_layers": n}
    text |= {"hidden_size_per_layer_input": 0, "use_double_wide_mlp": False}
    return gemma4_text.ModelArgs.from_dict(text)


class MaskedHead(nn.Module):
    """The centroid-routed head of the E2B / E4B assistants: `centroids` scores the clusters of
    `token_ordering` (cluster c holds its [c * V / C, (c + 1) * V / C) entries), the top-k
    clusters' tokens get their tied-embedding logits, every other token -inf (no draft mass)."""

    def __init__(self, hidden: int, vocab: int, clusters: int, top_k: int):
        super().__init__()
        self.centroids = nn.Linear(hidden, clusters, bias=False)
        self.token_ordering = mx.zeros((vocab,), dtype=mx.int32)
        self.clusters, self.top_k, self.vocab = clusters, top_k, vocab

    def __call__(self, h: mx.array, embed: nn.Module) -> mx.array:
        """h [..., d] -> logits [..., V]."""
        top = mx.argpartition(self.centroids(h), kth=-self.top_k, axis=-1)[..., -self.top_k :]
        ids = self.token_ordering.reshape(self.clusters, -1)[top]  # [..., k, V / C]
        ids = ids.reshape(*h.shape[:-1], -1)
        rows = embed(ids)  # [..., k V / C, d]
        picked = (rows @ h[..., None])[..., 0]
        out = mx.full((*h.shape[:-1], self.vocab), -mx.inf, dtype=picked.dtype)
        return mx.put_along_axis(out, ids, picked, axis=-1)


class _Trunk(nn.Module):
    """The checkpoint's `model.*`: its embedding (the head), KV-shared decoder layers, norm."""

    def __init__(self, args: gemma4_text.ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        n = args.num_hidden_layers
        self.layers = [gemma4_text.DecoderLayer(args, layer_idx=i) for i in range(n)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


class Gemma4Assistant(nn.Module):
    """A Gemma 4 assistant drafter (module docstring). `attach(target)` gives it the target
    whose embedding it reads; its keys and values come from the target's cache each call."""

    draft_family = "assistant"  # run by edgespec/families/assistant_family.py

    def __init__(self, config: dict[str, Any], args: gemma4_text.ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = str(config.get("model_type", MODEL_TYPES[0]))
        self.backbone = int(config["backbone_hidden_size"])
        d = args.hidden_size
        self.model = _Trunk(args)
        self.pre_projection = nn.Linear(2 * self.backbone, d, bias=False)
        self.post_projection = nn.Linear(d, self.backbone, bias=False)
        self.tied = bool(config.get("tie_word_embeddings", True))
        if not self.tied:
            self.lm_head = nn.Linear(d, args.vocab_size, bias=False)
        if config.get("use_ordered_embeddings"):
            clusters = int(config.get("num_centroids", 2048))
            if args.vocab_size % clusters:
                raise ConfigError(f"num_centroids {clusters} does not divide {args.vocab_size}")
            top_k = int(config.get("centroid_intermediate_top_k", 32))
            self.masked_embedding = MaskedHead(d, args.vocab_size, clusters, top_k)
        self.feature_layers = (TOP,)  # what the verify returns: the final-normed top state
        self.window = int(args.sliding_window)
        object.__setattr__(self, "target", None)  # not a parameter: shared, never saved
        object.__setattr__(self, "allowed", None)  # bool [V]: False at suppressed tokens

    def suppress(self, tokens: list[int]) -> None:
        """Never give `tokens` draft mass (generation_config.json's `suppress_tokens`)."""
        if not tokens:
            object.__setattr__(self, "allowed", None)
            return
        allowed = mx.ones((self.args.vocab_size,), dtype=mx.bool_)
        allowed[mx.array(sorted(set(tokens)))] = False
        object.__setattr__(self, "allowed", allowed)

    def attach(self, target: nn.Module) -> None:
        object.__setattr__(self, "target", target)

    def make_cache(self) -> list[Any]:
        """No cache of its own: it attends to the target's."""
        return []

    def embed(self, tokens: mx.array) -> mx.array:
        """The target's scaled input embedding of tokens [B, L] -> [B, L, backbone]."""
        trunk = text_model(self.target).model
        return trunk.embed_tokens(tokens) * trunk.embed_scale

    def __call__(
        self, inputs: mx.array, kv: KV, offset: int, masks: dict[str, Any] | None = None
    ) -> tuple[mx.array, mx.array]:
        """inputs [B, L, 2 * backbone] (embedding, then hidden state) with queries from position
        `offset` on, over `kv` -> (normed outputs [B, L, d], next hidden states [B, L, B])."""
        h = self.pre_projection(inputs)
        for layer in self.model.layers:
            kind = layer.layer_type
            mask = None if masks is None else masks[kind]
            h, _, _ = layer(h, mask, None, shared_kv=kv[kind], offset=offset)
        y = self.model.norm(h)
        return y, self.post_projection(y)

    def logits(self, y: mx.array) -> mx.array:
        """Normed outputs [..., d] -> draft logits [..., V] (-inf at suppressed tokens)."""
        if "masked_embedding" in self:
            out = self.masked_embedding(y, self.model.embed_tokens)
        elif self.tied:
            out = self.model.embed_tokens.as_linear(y)
        else:
            out = self.lm_head(y)
        if self.allowed is None:
            return out
        return mx.where(self.allowed, out, mx.array(-mx.inf, dtype=out.dtype))

    def draft_step(
        self, token: mx.array, hidden: mx.array, kv: KV, position: int
    ) -> tuple[mx.array, mx.array]:
        """One drafted token's logits [V] and the next step's hidden state [1, 1, backbone],
        from the token before it (token [1]) and the hidden state for it."""
        x = mx.concatenate([self.embed(token.reshape(1, 1)).astype(hidden.dtype), hidden], -1)
        y, nxt = self(x, kv, position)
        return self.logits(y)[0, 0], nxt


def check_target(model: Gemma4Assistant, target: nn.Module, where: Any) -> None:
    """ConfigError (one line) unless `target` is a Gemma 4 whose states this head reads: its
    hidden size, vocabulary and head widths, layer kinds, and head counts that share keys."""
    text = text_model(target)
    if not isinstance(text, gemma4_text.Model):
        raise ConfigError(f"{where}: a Gemma 4 assistant drafts for a Gemma 4 target only")
    t, a = text.args, model.args
    mine, theirs = list(a.layer_types or []), list(t.layer_types or [])
    full_kv = t.num_global_key_value_heads if t.attention_k_eq_v else None
    kv_heads = {"sliding_attention": t.num_key_value_heads}
    kv_heads["full_attention"] = full_kv or t.num_key_value_heads
    cached = set(theirs[: t.num_hidden_layers - t.num_kv_shared_layers])
    checks = [
        ("backbone_hidden_size", model.backbone, t.hidden_size),
        ("vocab_size", a.vocab_size, t.vocab_size),
        ("head_dim", a.head_dim, t.head_dim),
    ]
    if "full_attention" in mine:
        checks.append(("global_head_dim", a.global_head_dim, t.global_head_dim))
    for key, have, want in checks:
        if have != want:
            raise ConfigError(f"{where}: the assistant's {key} is {have}, its target's {want}")
    for kind in set(mine):
        if kind not in cached:
            raise ConfigError(f"{where}: the target has no {kind} layer for the assistant's")
        if a.num_attention_heads % kv_heads[kind]:
            raise ConfigError(
                f"{where}: {a.num_attention_heads} query heads cannot share the target's "
                f"{kv_heads[kind]} {kind} key heads"
            )


def read_weights(path: Path) -> dict[str, mx.array]:
    """Every array of the folder's safetensors, under the checkpoint's names (a tied head's
    `lm_head.weight` dropped, the token ordering as int32)."""
    found: dict[str, mx.array] = {}
    for file in sorted(path.glob("*.safetensors")):
        arrays = mx.load(str(file))
        assert isinstance(arrays, dict)
        found |= arrays
    if "masked_embedding.token_ordering" in found:
        found["masked_embedding.token_ordering"] = found["masked_embedding.token_ordering"].astype(
            mx.int32
        )
    return found


def fill(model: Gemma4Assistant, weights: dict[str, mx.array], config: dict, where: Any) -> None:
    """Load `weights` into `model` (quantized as stored: config `quantization`); ConfigError
    naming the first key missing, unexpected or of another shape."""
    if model.tied:
        weights = {k: v for k, v in weights.items() if k != "lm_head.weight"}
    quant = config.get("quantization")
    if quant:
        nn.quantize(
            model,
            group_size=int(quant["group_size"]),
            bits=int(quant["bits"]),
            class_predicate=lambda p, m: f"{p}.scales" in weights,
        )
    want = dict(tree_flatten(model.parameters()))
    missing = sorted(set(want) - set(weights))
    if missing:
        raise ConfigError(f"{where}: the assistant checkpoint lacks {missing[0]!r}")
    extra = sorted(set(weights) - set(want))
    if extra:
        raise ConfigError(f"{where}: the assistant checkpoint has {extra[0]!r}, unknown here")
    for key, value in want.items():
        if tuple(weights[key].shape) != tuple(value.shape):
            raise ConfigError(
                f"{where}: {key!r} is {tuple(weights[key].shape)}, this config.json makes it "
                f"{tuple(value.shape)}"
            )
    model.load_weights(list(weights.items()), strict=True)


def suppressed_tokens(path: Path, vocab: int) -> list[int]:
    """generation_config.json's `suppress_tokens` (none without the file or the field);
    ConfigError, in one line, for a list that is not token ids of this vocabulary."""
    file = path / "generation_config.json"
    try:
        raw = json.loads(file.read_text()) if file.is_file() else {}
    except (OSError, ValueError) as e:
        raise ConfigError(f"{file}: cannot read it ({e})") from None
    ids = raw.get("suppress_tokens") or [] if isinstance(raw, dict) else []
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab for i in ids
    ):
        raise ConfigError(f"{file}: suppress_tokens must be token ids below {vocab}")
    return ids


def load_assistant(
    path: Path, config: dict[str, Any], target: nn.Module | None
) -> tuple[Gemma4Assistant, dict[str, Any]]:
    """The assistant at `path`, checked against and attached to its loaded `target`."""
    if target is None:
        raise ConfigError(
            f"{path} is a Gemma 4 assistant (a drafter that reads its target's states): pass it "
            "as --draft beside its Gemma 4 target"
        )
    model = Gemma4Assistant(config, assistant_args(config, path))
    if "k_proj" in model.model.layers[0].self_attn:  # mlx-lm < 0.31.3 gives every layer keys
        raise ConfigError(
            f"{path}: a Gemma 4 assistant needs mlx-lm >= 0.31.3 (KV-shared layers without key "
            "weights); pip install -U mlx-lm"
        )
    check_target(model, target, path)
    fill(model, read_weights(path), config, path)
    model.suppress(suppressed_tokens(path, model.args.vocab_size))
    model.attach(target)
    mx.eval(model.parameters())
    return model, config
