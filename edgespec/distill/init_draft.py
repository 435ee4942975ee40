"""Build a draft from its target: chosen target layers (renumbered 0..n-1), the target's embedding
and final norm, and a reduced head over the tokens the target emits most (rows initialised from
the target's output matrix, i.e. its tied embedding)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from edgespec.architectures.token_draft import MODEL_TYPE, DraftModel, build
from edgespec.distill.shards import Sequence
from edgespec.errors import ConfigError

DEFAULT_LAYERS = "0,1,-2,-1"


def resolve_layers(spec: str | None, n_layers: int) -> list[int]:
    """Parse a layer list ("0,1,-2,-1"; negatives count from the end) into sorted distinct indices.

    >>> resolve_layers("0,1,-2,-1", 30), resolve_layers("0,1,28,29", 30), resolve_layers(None, 3)
    ([0, 1, 28, 29], [0, 1, 28, 29], [0, 1, 2])
    """
    out = set()
    for part in (spec or DEFAULT_LAYERS).split(","):
        try:
            i = int(part)
        except ValueError:
            raise ConfigError(f"--layers: {part!r} is not an integer") from None
        if not -n_layers <= i < n_layers:
            raise ConfigError(f"--layers: layer {i} does not exist (the target has {n_layers})")
        out.add(i % n_layers)
    return sorted(out)


def choose_head(
    seqs: list[Sequence], size: int, vocab: int, always: tuple[int, ...] = ()
) -> np.ndarray:
    """The `size` tokens that carry the most target probability mass at completion positions
    (from the saved top-k), plus `always` (EOS); sorted ids.

    >>> s = Sequence(0, 1, np.array([9, 3, 3]), np.array([[3, 4], [3, 5]]), np.log(np.array([[.9, .1], [.6, .4]])))
    >>> choose_head([s], 2, 10).tolist()
    [3, 5]
    """
    mass = np.zeros(vocab, np.float64)
    for s in seqs:
        if s.topk_ids is not None and s.topk_logprobs is not None:
            np.add.at(mass, s.topk_ids.ravel(), np.exp(s.topk_logprobs.astype(np.float64)).ravel())
        np.add.at(mass, s.ids[s.prompt_len :], 1e-3)  # tie-break: tokens actually emitted
    size = min(size, vocab)
    mass[list(always)] = np.inf
    top = np.argsort(-mass, kind="stable")[:size]
    return np.sort(top).astype(np.int32)


def draft_config(
    target_config: dict[str, Any], layers: list[int], head_size: int, target_name: str
) -> dict[str, Any]:
    """The draft's config.json: the target's llama settings with fewer layers and a head size."""
    cfg = {
        k: v
        for k, v in target_config.items()
        if k not in ("quantization", "quantization_config", "architectures")
    }
    if target_config.get("model_type") == "gemma3_text":  # keep each layer's kind (gemma3_trunk)
        cfg["trunk"] = "gemma3_text"
    cfg |= {
        "model_type": MODEL_TYPE,
        "num_hidden_layers": len(layers),
        "head_size": int(head_size),
        "edgespec": {"target": target_name, "source_layers": layers},
    }
    return cfg


def build_draft(
    target: nn.Module,
    target_config: dict[str, Any],
    layers: list[int],
    head_ids: np.ndarray,
    target_name: str,
) -> tuple[DraftModel, dict[str, Any]]:
    """A DraftModel initialised from the target (weights copied, fp32)."""
    config = draft_config(target_config, layers, len(head_ids), target_name)
    draft = build(config)
    tw = dict(tree_flatten(target.parameters()))
    weights: dict[str, mx.array] = {}
    for dst, src in enumerate(layers):
        prefix = f"model.layers.{src}."
        for k, v in tw.items():
            if k.startswith(prefix):
                weights[f"model.layers.{dst}." + k[len(prefix) :]] = v
    emb = tw["model.embed_tokens.weight"]
    out_w = tw.get("lm_head.weight", emb)  # tied embeddings: the output matrix is the embedding
    ids = mx.array(head_ids.astype(np.int32))
    weights |= {
        "model.embed_tokens.weight": emb,
        "model.norm.weight": tw["model.norm.weight"],
        "lm_head.weight": out_w[ids],
        "head_ids": ids,
    }
    weights = {k: v.astype(mx.float32) if k != "head_ids" else v for k, v in weights.items()}
    draft.load_weights(list(weights.items()), strict=True)
    mx.eval(draft.parameters())
    return draft, config


def freeze_for_training(draft: DraftModel) -> DraftModel:
    """Train layers, final norm and head; keep the embedding (shared with the target) and the
    head's id table fixed."""
    draft.unfreeze()
    draft.model.embed_tokens.freeze()
    draft.freeze(recurse=False, keys=["head_ids"])
    return draft
