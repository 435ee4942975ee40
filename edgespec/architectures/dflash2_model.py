"""DFlash2 block drafts (`architectures: ["DFlash2DraftModel"]`, z-lab and Inco AI): a DFlash
block draft (edgespec/architectures/block_model.py) with two additions, both in the checkpoint.

- A grouped dynamic causal convolution around each layer's attention and MLP
  (`attention_conv`, `mlp_conv`). With x [L, d] the sublayer's input (after its norm):
  kernel_projection(x) [L, 2 * taps * G] gives per-row coefficients `delta` for G = d /
  conv_group_size channel groups, two sides (0: before the sublayer, 1: after it) of `taps`
  (conv_kernel_size) taps each; side s maps y [L, d] to
  out[j, c] = sum_{t < taps, t <= j} (base_kernel[s, t, c] + delta[j, s, t, c // group]) * y[j - t, c],
  a causal convolution over the block's own rows (row 0, the anchor, sees itself only). Side 0
  convolves the sublayer's input, side 1 its output, both with the coefficients of its input.
- A candidate selector (`candidate_selector`): hidden_projection [rank, d] and two codebooks
  [vocab, rank] (predecessor, successor). Row i's logits (the target's head, times
  `output_multiplier`, soft-capped at `final_logit_softcapping`) give the top `selector_top_k`
  candidates and their logits (unary). The path is walked from the anchor:
  score_i(c | p) = unary_i(c) + sum_r P[p, r] * h_i[r] * S[c, r], h_i = hidden_projection(row i),
  p the token chosen at i - 1 (the anchor at i = 1). Choosing the path:
  edgespec/drafting/dflash2.py.

Everything else is DFlash's: fc + hidden_norm over the target's layer outputs, read as keys and
values by every layer; non-causal block attention (`is_causal: false`); sliding layers
(`layer_types`, `sliding_window`) see the keys less than the window away; the target's
embedding (times `input_embedding_scale`) and head.

config.json (dflash_config nesting as published): block_size, mask_token_id, target_layer_ids,
conv_kernel_size, conv_group_size, selector_rank, selector_top_k (all required), optional
input_embedding_scale, output_multiplier, final_logit_softcapping. Weights: DFlash's plus
layers.{i}.{attention,mlp}_conv.base_kernel [2, taps, d],
layers.{i}.{attention,mlp}_conv.kernel_projection.weight [2 * taps * G, d],
candidate_selector.hidden_projection.weight [rank, d],
candidate_selector.{predecessor,successor}_codebook [vocab, rank] (no `.weight`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn

from edgespec.architectures import DFLASH2
from edgespec.architectures.block_model import BlockArgs, BlockLayer, BlockModel
from edgespec.architectures.token_draft import quantize_as_stored, read_weights
from edgespec.architectures.weight_keys import load_checked

ARCHITECTURE = DFLASH2
REQUIRED = (
    "block_size",
    "mask_token_id",
    "target_layer_ids",
    "conv_kernel_size",
    "conv_group_size",
    "selector_rank",
    "selector_top_k",
)
SCALES = ("input_embedding_scale", "output_multiplier", "final_logit_softcapping")


@dataclass
class DFlash2Args(BlockArgs):
    """BlockArgs plus the convolution, the selector and the three output scalars."""

    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 0
    selector_top_k: int = 0
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float = 0.0  # 0: none

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> DFlash2Args:
        """A published DFlash2 config.json (the draft fields under `dflash_config`, also
        accepted at top level). ValueError (one line) naming a missing or unusable field."""
        flat = {**cfg, **cfg.get("dflash_config", {})}
        missing = [k for k in REQUIRED if k not in flat]
        if missing:
            raise ValueError(f"a DFlash2 draft's config.json needs {', '.join(missing)}")
        scales = {k: float(v) for k in SCALES if (v := flat.pop(k, None)) is not None}
        flat.pop("dflash_config", None)
        args = cast(DFlash2Args, super().from_config(flat))
        args = replace(args, **cast(dict[str, Any], scales))
        if args.hidden_size % args.conv_group_size:
            raise ValueError(
                f"conv_group_size {args.conv_group_size} does not divide hidden_size "
                f"{args.hidden_size}"
            )
        if not 0 < args.selector_top_k <= args.vocab_size or args.selector_rank < 1:
            raise ValueError("selector_top_k must be 1..vocab_size and selector_rank positive")
        if args.conv_kernel_size < 1:
            raise ValueError("conv_kernel_size must be positive")
        return args


def grouped_conv(y: mx.array, delta: mx.array, base: mx.array) -> mx.array:
    """y [B, L, d], delta [B, L, taps, G], base [taps, d] -> [B, L, d]: out[:, j] = sum over
    taps t <= j of (base[t] + delta[:, j, t] repeated over each group's channels) * y[:, j - t].
    Example (d = G = 1, base [[1], [2]], delta 0): y [1, 1, 1] -> [1, 3, 3]."""
    taps, d = base.shape
    group = d // delta.shape[-1]
    coef = base.astype(y.dtype) + mx.repeat(delta.astype(y.dtype), group, axis=-1)
    out = coef[:, :, 0] * y
    for t in range(1, min(taps, y.shape[1])):
        shifted = mx.pad(y[:, :-t], [(0, 0), (t, 0), (0, 0)])
        out = out + coef[:, :, t] * shifted
    return out


class GroupedConv(nn.Module):
    """One sublayer's convolution pair: `prepare` (side 0, and side 1's coefficients) before
    the sublayer, `finish` (side 1) after it."""

    def __init__(self, d: int, taps: int, group: int):
        super().__init__()
        self.taps, self.groups = taps, d // group
        self.base_kernel = mx.zeros((2, taps, d))
        self.kernel_projection = nn.Linear(d, 2 * taps * self.groups, bias=False)

    def prepare(self, x: mx.array) -> tuple[mx.array, mx.array]:
        B, L, _ = x.shape
        delta = self.kernel_projection(x).reshape(B, L, 2, self.taps, self.groups)
        return grouped_conv(x, delta[:, :, 0], self.base_kernel[0]), delta[:, :, 1]

    def finish(self, y: mx.array, delta: mx.array) -> mx.array:
        return grouped_conv(y, delta, self.base_kernel[1])


class DFlash2Layer(BlockLayer):
    """BlockLayer with its attention and MLP each wrapped in a GroupedConv."""

    def __init__(self, args: DFlash2Args, window: int = 0, causal: bool = False):
        super().__init__(args, window, causal)
        taps, group = args.conv_kernel_size, args.conv_group_size
        self.attention_conv = GroupedConv(args.hidden_size, taps, group)
        self.mlp_conv = GroupedConv(args.hidden_size, taps, group)

    def __call__(self, h: mx.array, ctx: mx.array, cache: Any, mask: mx.array | None) -> mx.array:
        x, delta = self.attention_conv.prepare(self.input_layernorm(h))
        h = h + self.attention_conv.finish(self.self_attn(x, ctx, cache, mask), delta)
        x, delta = self.mlp_conv.prepare(self.post_attention_layernorm(h))
        return h + self.mlp_conv.finish(self.mlp(x), delta)


class CandidateSelector(nn.Module):
    """The selector's weights and its edge scores (module docstring)."""

    def __init__(self, d: int, vocab: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.hidden_projection = nn.Linear(d, rank, bias=False)
        self.predecessor_codebook = mx.zeros((vocab, rank))
        self.successor_codebook = mx.zeros((vocab, rank))

    def candidates(self, logits: mx.array) -> tuple[mx.array, mx.array]:
        """logits [k, V] -> (ids [k, top_k], their logits [k, top_k]), in no set order."""
        k = self.top_k
        ids = mx.argpartition(-logits.astype(mx.float32), kth=k - 1, axis=-1)[:, :k]
        return ids.astype(mx.int32), mx.take_along_axis(logits, ids, axis=-1)

    def edges(self, hidden: mx.array, ids: mx.array, anchor: int) -> mx.array:
        """Edge scores [k, top_k, top_k]: [i, a, c] = sum_r P[pred_a, r] * h_i[r] * S[ids[i, c], r],
        pred_a the anchor for i = 0 (every a alike), else candidate a of row i - 1."""
        h = self.hidden_projection(hidden).astype(mx.float32)  # [k, r]
        first = mx.full((1, ids.shape[1]), anchor, dtype=mx.int32)
        preds = mx.concatenate([first, ids[:-1]], axis=0)  # [k, top_k]
        P = self.predecessor_codebook[preds].astype(mx.float32)  # [k, a, r]
        S = self.successor_codebook[ids].astype(mx.float32)  # [k, c, r]
        return (P * h[:, None, :]) @ S.transpose(0, 2, 1)


class DFlash2Model(BlockModel):
    """BlockModel with DFlash2's layers, selector and output scalars (module docstring). Run by
    the block family's DFlash2 variant (edgespec/families/block_family.py): its chains walk the
    selector (edgespec/drafting/dflash2.py)."""

    draft_family = "dflash2"

    def __init__(self, args: DFlash2Args):
        super().__init__(args)
        self.args: DFlash2Args = args
        types = args.layer_types or ("full_attention",) * args.num_hidden_layers
        slide = [args.sliding_window if t == "sliding_attention" else 0 for t in types]
        causal = args.causal_layers or (False,) * args.num_hidden_layers
        self.layers = [DFlash2Layer(args, w, c) for w, c in zip(slide, causal, strict=True)]
        self.candidate_selector = CandidateSelector(
            args.hidden_size, args.vocab_size, args.selector_rank, args.selector_top_k
        )

    def embed(self, tokens: mx.array) -> mx.array:
        """BlockModel's embedding times input_embedding_scale."""
        return super().embed(tokens) * self.args.input_embedding_scale

    def logits(self, hidden: mx.array) -> mx.array:
        """The target's head times output_multiplier, soft-capped (float32)."""
        z = super().logits(hidden).astype(mx.float32) * self.args.output_multiplier
        cap = self.args.final_logit_softcapping
        return mx.tanh(z / cap) * cap if cap > 0 else z


def load_dflash2(path: str | Path, target: nn.Module | None) -> tuple[DFlash2Model, dict]:
    """Load a DFlash2 folder and attach it to `target` (required). ValueError (one line) on a
    missing target, a config field or weight key missing or changed, or another target."""
    if target is None:
        raise ValueError("this is a DFlash2 block draft; load it together with its target")
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    model = DFlash2Model(DFlash2Args.from_config(config))
    weights = model.sanitize(read_weights(path))
    quantize_as_stored(model, config, weights)
    load_checked(model, weights)
    model.attach(target)
    mx.eval(model.parameters())
    return model, config
