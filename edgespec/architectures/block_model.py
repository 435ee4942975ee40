"""Block drafts (DFlash-style), the model and its files: a few small layers that draft a whole
block of tokens in ONE forward (the drafter that runs it: edgespec/drafting/block.py).

The target's hidden states of a few chosen layers (`target_layer_ids`: the OUTPUT of each) are
concatenated and fused by one linear layer: ctx = hidden_norm(fc(raw)) [S, d]. Every draft layer
reads that context as extra keys and values. The block is the target embedding of
[anchor, mask, ..., mask] (anchor: the newest committed token; `mask_token_id` fills the rest);
each block query sees ALL context keys and ALL block keys (bar `causal_layers`), so one forward
gives a distribution for every masked position at once. Positions: the context sits at its own
positions 0..S-1 and the block follows, S..S+L-1 (the anchor is token S, the one whose features
the target has not computed yet). Output: normed hidden states, scored by the TARGET's head;
block position j >= 1 gives q_j, the draft distribution of the j-th token after the anchor.

Only the context K/V is cached across rounds (one mlx-lm KVCache per layer, `make_cache`); the
block's own K/V is recomputed every round. Example: target layer outputs known for 7 committed
tokens (S = 7), the 8th (the anchor) pending, block size 4: inputs [anchor, m, m, m] at positions
7..10, logits rows 1..3 -> q_1, q_2, q_3 for tokens 9, 10, 11 of the text.

Files: config.json with either `model_type: "edgespec_block"` (ours; `target_layer_ids` and
`mask_token_id` at top level, optional `qk_norm: false` for a llama-style draft, optional
`attention_bias`) or z-lab's `architectures: ["DFlashDraftModel"]` (both under `dflash_config`);
weights (safetensors, no `model.` prefix): fc.weight [d, n * d], hidden_norm.weight, norm.weight,
layers.{i}.self_attn.{q,k,v,o}_proj.weight, layers.{i}.self_attn.{q,k}_norm.weight,
layers.{i}.mlp.{gate,up,down}_proj.weight, layers.{i}.{input,post_attention}_layernorm.weight.
No embedding, no head: `attach(target)` lends the target's (ours: optionally only its rows of
`head_ids`, edgespec/architectures/block_head.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu
from mlx_lm.models.cache import KVCache
from mlx_lm.models.rope_utils import initialize_rope

from edgespec.architectures import BLOCK
from edgespec.architectures.block_head import ReducedHead, head_rows
from edgespec.architectures.block_mask import block_mask, causal_layers
from edgespec.architectures.token_draft import quantize_as_stored, read_weights
from edgespec.architectures.weight_keys import load_checked

MODEL_TYPE = BLOCK


@dataclass
class BlockArgs:
    """A block draft's shape. `num_target_layers` (0: not recorded) is the layer count of the
    target it was made for; attach checks it when set. `layer_types` (empty: all
    "full_attention") may make layers "sliding_attention": a block query then sees the keys
    less than `sliding_window` positions away; a layer of `causal_layers` (block_mask.py) hides
    the block rows after each query. `input_context` (ours): every block row's input
    also gets ctx_in(c), c the context of the newest context position (EAGLE-style fusion)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    rope_scaling: dict | None = None
    qk_norm: bool = True
    attention_bias: bool = False
    num_target_layers: int = 0
    sliding_window: int = 0
    layer_types: tuple[str, ...] = ()
    causal_layers: tuple[bool, ...] = ()
    input_context: bool = False
    head_size: int = 0  # ours: score only head_ids (0: the whole vocabulary)
    # Trained by EdgeSpec (model_type edgespec_block, research/block_draft/): on short answers,
    # so past 2K of context it drafts better through the draft window (families/block_family.py).
    ours: bool = False

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> BlockArgs:
        """Our config.json (fields at top level) or z-lab's (`dflash_config` nesting).
        head_dim defaults to hidden_size / num_attention_heads."""
        ours = bool(cfg.get("ours", cfg.get("model_type") == MODEL_TYPE))
        flat = {**cfg, **cfg.get("dflash_config", {}), "ours": ours}
        missing = [k for k in ("target_layer_ids", "mask_token_id", "block_size") if k not in flat]
        if missing:
            raise ValueError(f"a block draft's config.json needs {', '.join(missing)}")
        extra = unsupported(flat)
        if extra:
            raise ValueError(f"this block draft uses {extra}, which EdgeSpec does not run")
        flat.setdefault("head_dim", flat["hidden_size"] // flat["num_attention_heads"])
        flat["target_layer_ids"] = tuple(int(i) for i in flat["target_layer_ids"])
        flat.setdefault("num_target_layers", 0)
        flat.update(_rope(flat), **_windows(flat))
        flat["causal_layers"] = causal_layers(flat, flat["layer_types"], flat["num_hidden_layers"])
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in flat.items() if k in names})

    def to_config(self) -> dict[str, Any]:
        """Our config.json fields (model_type included). Round trip: from_config(to_config())."""
        cfg = {f.name: getattr(self, f.name) for f in fields(self)}
        cfg["target_layer_ids"] = list(self.target_layer_ids)
        cfg["layer_types"] = list(self.layer_types)
        cfg["causal_layers"] = list(self.causal_layers)
        return {"model_type": MODEL_TYPE, **cfg}


def _rope(flat: dict[str, Any]) -> dict[str, Any]:
    """rope_theta and rope_scaling, also from transformers 5's `rope_parameters` nesting."""
    params = flat.get("rope_parameters") or {}
    theta = flat.get("rope_theta") or params.get("rope_theta")
    if theta is None:
        raise ValueError("a block draft's config.json needs rope_theta")
    scaling = flat.get("rope_scaling")
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = params
    return {"rope_theta": float(theta), "rope_scaling": scaling}


def _windows(flat: dict[str, Any]) -> dict[str, Any]:
    """layer_types and sliding_window as transformers' Qwen3 config reads them: given, or with
    use_sliding_window the layers from max_window_layers (default 28) on slide, the rest not."""
    n = int(flat["num_hidden_layers"])
    types = flat.get("layer_types")
    window = int(flat.get("sliding_window") or 0)
    if not types:
        first = int(flat.get("max_window_layers", 28))
        slide = bool(flat.get("use_sliding_window")) and window > 0
        types = [
            "sliding_attention" if slide and i >= first else "full_attention" for i in range(n)
        ]
    if len(types) != n:
        raise ValueError(f"a block draft's layer_types names {len(types)} layers, not {n}")
    if "sliding_attention" not in types:
        return {"layer_types": (), "sliding_window": 0}
    return {"layer_types": tuple(types), "sliding_window": window}


def unsupported(flat: dict[str, Any]) -> str:
    """The first option of a DFlash config that this model does not implement ("" if none):
    layer types other than full and sliding attention, an input embedding scale, an output
    multiplier or a logit soft cap (refused rather than run as another model)."""
    kinds = ("full_attention", "sliding_attention")
    if any(t not in kinds for t in flat.get("layer_types") or []):
        return "draft layers other than full or sliding attention (layer_types)"
    for key in ("input_embedding_scale", "output_multiplier"):
        if float(flat.get(key) or 1.0) != 1.0:
            return key
    return "final_logit_softcapping" if flat.get("final_logit_softcapping") else ""


class BlockAttention(nn.Module):
    """Queries from the block; keys/values from the context (cached) and the block (never)."""

    def __init__(self, args: BlockArgs, window: int = 0, causal: bool = False):
        super().__init__()
        d, hd, bias = args.hidden_size, args.head_dim, args.attention_bias
        self.n_heads, self.n_kv = args.num_attention_heads, args.num_key_value_heads
        self.window, self.causal = window, causal  # width of a sliding window (0: every key)
        self.scale = hd**-0.5
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, self.n_kv * hd, bias=bias)
        self.v_proj = nn.Linear(d, self.n_kv * hd, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=bias)  # as transformers' Qwen3
        if args.qk_norm:
            self.q_norm = nn.RMSNorm(hd, eps=args.rms_norm_eps)
            self.k_norm = nn.RMSNorm(hd, eps=args.rms_norm_eps)
        rope: dict[str, Any] = {"base": args.rope_theta, "scaling_config": args.rope_scaling}
        rope["max_position_embeddings"] = args.max_position_embeddings
        self.rope = initialize_rope(hd, traditional=False, **rope)

    def _heads(self, x: mx.array, n: int, norm: str | None) -> mx.array:
        """[B, L, n * hd] -> [B, n, L, hd], through q_norm / k_norm when the draft has them."""
        B, L, _ = x.shape
        x = x.reshape(B, L, n, x.shape[-1] // n)
        if norm is not None and norm in self:
            x = self[norm](x)
        return x.transpose(0, 2, 1, 3)

    def _context_kv(self, ctx: mx.array, cache: Any) -> tuple[mx.array, mx.array]:
        """All context keys and values: the cached ones followed by `ctx`'s (appended)."""
        start = 0 if cache is None else cache.offset
        keys = self.rope(self._heads(self.k_proj(ctx), self.n_kv, "k_norm"), offset=start)
        values = self._heads(self.v_proj(ctx), self.n_kv, None)
        if cache is None:
            return keys, values
        if ctx.shape[1] > 0:
            return cache.update_and_fetch(keys, values)
        if cache.offset == 0:
            return keys, values
        return cache.keys[..., : cache.size(), :], cache.values[..., : cache.size(), :]

    def __call__(self, x: mx.array, ctx: mx.array, cache: Any, mask: mx.array | None) -> mx.array:
        B, L, _ = x.shape
        ck, cv = self._context_kv(ctx, cache)
        pos = int(ck.shape[2]) if cache is None else cache.offset  # the block follows the context
        q = self.rope(self._heads(self.q_proj(x), self.n_heads, "q_norm"), offset=pos)
        k = self.rope(self._heads(self.k_proj(x), self.n_kv, "k_norm"), offset=pos)
        v = self._heads(self.v_proj(x), self.n_kv, None)
        keys = mx.concatenate([ck, k], axis=2)
        values = mx.concatenate([cv, v], axis=2)
        mask = block_mask(mask, pos, L, self.window, self.causal, cache)
        out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


class BlockMLP(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


class BlockLayer(nn.Module):
    def __init__(self, args: BlockArgs, window: int = 0, causal: bool = False):
        super().__init__()
        d = args.hidden_size
        self.self_attn = BlockAttention(args, window, causal)
        self.mlp = BlockMLP(d, args.intermediate_size)
        self.input_layernorm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=args.rms_norm_eps)

    def __call__(self, h: mx.array, ctx: mx.array, cache: Any, mask: mx.array | None) -> mx.array:
        h = h + self.self_attn(self.input_layernorm(h), ctx, cache, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class BlockModel(nn.Module):
    """fc + hidden_norm over the target's layer outputs, `num_hidden_layers` layers that read
    them as keys and values, a final norm; the target's embedding and head (attach)."""

    draft_family = "block"  # run by edgespec/families/block_family.py

    def __init__(self, args: BlockArgs):
        super().__init__()
        self.args = args
        self.model_type = MODEL_TYPE
        d = args.hidden_size
        self.fc = nn.Linear(len(args.target_layer_ids) * d, d, bias=False)
        self.hidden_norm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        types = args.layer_types or ("full_attention",) * args.num_hidden_layers
        slide = [args.sliding_window if t == "sliding_attention" else 0 for t in types]
        causal = args.causal_layers or (False,) * args.num_hidden_layers
        self.layers = [BlockLayer(args, w, c) for w, c in zip(slide, causal, strict=True)]
        self.norm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        if args.input_context:
            self.ctx_in = nn.Linear(d, d, bias=False)
        if args.head_size:
            self.head_ids = mx.zeros((args.head_size,), dtype=mx.int32)
        # The target's embedding module and head: plain attributes, never saved or trained.
        object.__setattr__(self, "embedding", None)
        object.__setattr__(self, "head", None)

    @property
    def vocab_size(self) -> int:
        return self.args.vocab_size

    def attach(self, target: nn.Module) -> None:
        """Use `target`'s input embedding and output head; ValueError when the target is not
        the one this draft reads (layer count, layer ids, hidden size, vocabulary)."""
        inner, args = _text_parts(target)
        n_layers, width = len(inner.layers), int(args["hidden_size"])
        vocab = int(args["vocab_size"])
        a = self.args
        if a.num_target_layers and a.num_target_layers != n_layers:
            raise ValueError(
                f"this block draft was made for a target with {a.num_target_layers} layers; "
                f"the target given has {n_layers}"
            )
        if any(not 0 <= i < n_layers for i in a.target_layer_ids):
            raise ValueError(
                f"this block draft reads target layers {list(a.target_layer_ids)}, but the "
                f"target has layers 0-{n_layers - 1}"
            )
        if (width, vocab) != (a.hidden_size, a.vocab_size):
            raise ValueError(
                f"this block draft was made for a target of width {a.hidden_size} with "
                f"{a.vocab_size} tokens; the target given has width {width} and {vocab} tokens"
            )
        embedding = inner.embed_tokens
        tied = args.get("tie_word_embeddings", False) or not hasattr(_lm(target), "lm_head")
        head = embedding.as_linear if tied else _lm(target).lm_head
        if "head_ids" in self:  # the rows of head_ids only, dense: [head_size, d]
            ids = self.head_ids
            head = ReducedHead(embedding(ids) if tied else head_rows(head, ids), ids, vocab)
        object.__setattr__(self, "embedding", embedding)
        object.__setattr__(self, "head", head)

    def context(self, raw: mx.array) -> mx.array:
        """The target's layer outputs, concatenated [..., n * d] -> context [..., d]."""
        return self.hidden_norm(self.fc(raw))

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The target layers whose outputs the draft reads (KVState.feature_layers)."""
        return self.args.target_layer_ids

    def fuse(self, raw: mx.array) -> mx.array:
        """`context`, under the name the feature-draft state uses (drafting/feature.py)."""
        return self.context(raw)

    def __call__(
        self,
        tokens: mx.array,
        ctx: mx.array,
        cache: list | None = None,
        mask: mx.array | None = None,
        last: mx.array | None = None,
    ) -> mx.array:
        """tokens [B, L], ctx [B, S, d] (from `context`) -> normed hidden states [B, L, d].
        With a cache, ctx is appended at cache offset and the block follows it. `last` [B, d]:
        the newest context position's context, required by an `input_context` draft."""
        h = self.embed(tokens)
        if "ctx_in" in self:
            if last is None:
                raise ValueError("this block draft reads the newest context position (last)")
            h = h + self.ctx_in(last.astype(h.dtype))[:, None]
        ctx = ctx.astype(h.dtype)
        layer_caches = cache if cache is not None else [None] * len(self.layers)
        for layer, c in zip(self.layers, layer_caches, strict=True):
            h = layer(h, ctx, c, mask)
        return self.norm(h)

    def embed(self, tokens: mx.array) -> mx.array:
        """tokens [B, L] -> [B, L, d] through the target's embedding."""
        if self.embedding is None:
            raise ValueError("a block draft runs with its target; attach(target) first")
        return self.embedding(tokens)

    def logits(self, hidden: mx.array) -> mx.array:
        """[..., d] -> logits [..., V] through the target's head."""
        if self.head is None:
            raise ValueError("a block draft runs with its target; attach(target) first")
        return self.head(hidden)

    def make_cache(self) -> list[KVCache]:
        """One context K/V cache per layer."""
        return [KVCache() for _ in self.layers]

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        return {k: v for k, v in weights.items() if "rotary_emb.inv_freq" not in k}


def _lm(target: nn.Module) -> nn.Module:
    """The language model part of `target` (itself, or a multimodal model's language_model)."""
    return cast(nn.Module, getattr(target, "language_model", target))


def _text_parts(target: nn.Module) -> tuple[nn.Module, dict[str, Any]]:
    """(the decoder with .layers and .embed_tokens, its args as a dict) of a target."""
    lm = _lm(target)
    if not hasattr(lm, "model") or not hasattr(lm.model, "layers"):
        raise ValueError("this is a block draft; load it together with its (llama-style) target")
    args = getattr(target, "args", None) or getattr(lm, "args", None)
    d = dict(vars(args)) if args is not None else {}
    d = {**d, **(d.get("text_config") or {})}
    if "vocab_size" not in d:
        d["vocab_size"] = lm.model.embed_tokens.weight.shape[0]
    return lm.model, d


def load_block(path: str | Path, target: nn.Module | None) -> tuple[BlockModel, dict[str, Any]]:
    """Load a block-draft folder and attach it to `target` (required: the draft has no embedding
    or head of its own). ValueError on a missing target or a target it was not made for."""
    if target is None:
        raise ValueError("this is a block draft; load it together with its target")
    config = json.loads((Path(path) / "config.json").read_text())
    model = BlockModel(BlockArgs.from_config(config))
    weights = model.sanitize(read_weights(Path(path)))
    quantize_as_stored(model, config, weights)
    load_checked(model, weights)
    model.attach(target)
    mx.eval(model.parameters())
    return model, config
