"""Training a feature draft along EAGLE-3's lines (the model: edgespec.architectures.eagle with several
`feature_layers`; data, feature cache and training loop: research.distill.eagle).

Two changes from the first feature draft:
- Fused features: the draft reads fuse(low, middle, top) = one linear layer over the target's
  hidden states of three layers (EagleModel.fuse), not the top one alone.
- Training-time test: the draft is unrolled `steps` times on its own outputs, as it runs in the
  loop. Step s at position i reads (step s - 1's guess at position i - 1, token i + 1) and attends
  to the true positions up to i - s plus its own chain's positions i - s + 1 .. i (what its cache
  holds when it drafts its (s + 1)-th token there). Every step is scored against the target's
  distribution for token i + 2 (soft cross-entropy over the head), weighted decay ** s; there is
  no feature-regression loss (EAGLE-3 drops it).

Warm start (warm_start): the layer, norm, mixer and feature scale of an existing one-layer feature
draft (dequantized), and a fusion that passes the top block through unchanged (identity on it,
zeros on the others): training starts from that draft's quality.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from edgespec.architectures.eagle import EagleModel, build
from edgespec.architectures.token_draft import read_weights
from edgespec.taps import TOP
from research.distill.eagle import Item, _num, make_batch, target_head_logits, top_block


def ttt_mask(width: int, step: int) -> mx.array:
    """[width, (step + 1) * width] bool: which keys a query of training-time-test step `step` sees.
    Block 0 holds the true positions (step 0's keys), block r the keys of step r."""
    i = np.arange(width)[:, None]
    m = np.arange(width)[None, :]
    blocks = [m <= i - step] + [m == i - step + r for r in range(1, step + 1)]
    return mx.array(np.concatenate(blocks, axis=1))


def _block(layer: Any, h: mx.array, mask: mx.array, past: list[tuple[mx.array, mx.array]]):
    """One llama block over h [B, L, d] (positions 0 .. L - 1) whose attention also reads the
    keys / values of the earlier steps in `past` (this step's are appended)."""
    attn = layer.self_attn
    b, n, _ = h.shape
    x = layer.input_layernorm(h)
    q = attn.q_proj(x).reshape(b, n, attn.n_heads, -1).transpose(0, 2, 1, 3)
    k = attn.k_proj(x).reshape(b, n, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    v = attn.v_proj(x).reshape(b, n, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    past.append((attn.rope(k), v))
    keys = mx.concatenate([p[0] for p in past], axis=2)
    values = mx.concatenate([p[1] for p in past], axis=2)
    o = mx.fast.scaled_dot_product_attention(
        attn.rope(q), keys, values, scale=attn.scale, mask=mask
    )
    h = h + attn.o_proj(o.transpose(0, 2, 1, 3).reshape(b, n, -1))
    return h + layer.mlp(layer.post_attention_layernorm(h))


def unroll(model: EagleModel, feats: mx.array, tokens: mx.array, steps: int) -> list[mx.array]:
    """The draft's guesses [B, L, d] at each of `steps` training-time-test steps; `feats` are
    the fused true features [B, L, d] (step 0 is exactly model(feats, tokens))."""
    emb = model.embedding(tokens)  # type: ignore[misc]
    pasts: list[list[tuple[mx.array, mx.array]]] = [[] for _ in model.layers]
    guesses = []
    width = int(tokens.shape[1])
    for s in range(steps):
        h = model.fc(mx.concatenate([feats * model.feature_scale, emb], axis=-1))
        mask = ttt_mask(width, s)
        for layer, past in zip(model.layers, pasts, strict=True):
            h = _block(layer, h, mask, past)
        guess = model.norm(h)
        guesses.append(guess)
        feats = mx.concatenate([mx.zeros_like(guess[:, :1]), guess[:, :-1]], axis=1)
    return guesses


def ttt_loss(
    model: EagleModel,
    f: mx.array,
    t: mx.array,
    ft: mx.array,
    m: mx.array,
    steps: int = 3,
    decay: float = 0.8,
) -> tuple[mx.array, mx.array]:
    """(loss, step-0 agreement) over a batch of distill.eagle.make_batch (f, ft: the target's
    concatenated features at i and i + 1). Step s counts at positions i >= s."""
    z_target = target_head_logits(model, top_block(model, ft))
    p = mx.softmax(z_target, axis=-1)
    best = mx.argmax(z_target, -1)
    pos = mx.arange(int(t.shape[1]))[None]
    total = mx.array(0.0)
    hit0 = mx.array(0.0)
    for s, guess in enumerate(unroll(model, model.fuse(f), t, steps)):
        z = model.head_logits(guess)
        ce = -(p * nn.log_softmax(z, axis=-1)).sum(-1)
        ms = m * (pos >= s)
        den = mx.maximum(ms.sum(), 1.0)
        total = total + decay**s * (ce * ms).sum() / den
        if s == 0:
            hit0 = ((mx.argmax(z, -1) == best) * ms).sum() / den
    return total, hit0


def chain_agreement(
    model: EagleModel, items: list[Item], steps: int, batch: int = 8, greedy: bool = False
) -> list[float]:
    """Teacher-forced argmax agreement of each training-time-test step (step s: the draft's
    (s + 1)-th token when its first s agreed, on its own guesses), over `items`: with the
    target's argmax over the head, or (`greedy`: the items are the target's greedy answers) with
    the answer's own next-next token, over the full vocabulary (off-head tokens count as misses)."""
    hits = np.zeros(steps)
    total = np.zeros(steps)
    for i in range(0, len(items), batch):
        f, t, ft, m = make_batch(items[i : i + batch])
        if greedy:  # position i decides token i + 2 = t[:, i + 1]
            best = mx.concatenate([t[:, 1:], mx.zeros_like(t[:, :1])], axis=1)
        else:
            best = mx.argmax(target_head_logits(model, top_block(model, ft)), -1)
        pos = mx.arange(int(t.shape[1]))[None]
        for s, guess in enumerate(unroll(model, model.fuse(f), t, steps)):
            pick = mx.argmax(model.head_logits(guess), -1)
            if greedy:
                pick = model.head_ids[pick]
            ms = m * (pos >= s)
            hits[s] += _num(((pick == best) * ms).sum())
            total[s] += _num(ms.sum())
    return [float(h / max(n, 1.0)) for h, n in zip(hits, total, strict=True)]


def dequantized(path: Path, config: dict[str, Any]) -> dict[str, mx.array]:
    """A draft folder's weights with every quantized matrix back in float32."""
    raw = read_weights(path)
    q = config.get("quantization") or {}
    out: dict[str, mx.array] = {}
    for k, v in raw.items():
        if k.endswith(".scales") or (k.endswith(".biases") and k[:-7] + ".scales" in raw):
            continue
        base = k[: -len(".weight")] if k.endswith(".weight") else None
        if base is not None and base + ".scales" in raw:
            v = mx.dequantize(
                v, raw[base + ".scales"], raw.get(base + ".biases"), q["group_size"], q["bits"]
            )
        out[k] = v if k == "head_ids" else v.astype(mx.float32)
    return out


def warm_start(
    target: nn.Module, old: Path, layers: tuple[int, ...], items: list[Item]
) -> tuple[EagleModel, dict[str, Any]]:
    """A multi-layer feature draft that starts as the draft in folder `old` exactly: its weights
    (dequantized) and a fusion that is the identity on the top block and zero on the others.
    `layer_scale` = the RMS of the top features in `items` (the lower blocks are normalised to
    it). Attached to `target`."""
    config = json.loads((old / "config.json").read_text())
    weights = dequantized(old, config)
    config.pop("quantization", None)
    config["feature_layers"] = list(layers)
    d = int(config["hidden_size"])
    j = layers.index(TOP)
    top = np.concatenate([it.feats[:, j * d : (j + 1) * d] for it in items[:64]])
    config["layer_scale"] = float(np.sqrt((top.astype(np.float32) ** 2).mean()))
    model = build(config)
    eye = np.zeros((d, len(layers) * d), np.float32)
    eye[:, j * d : (j + 1) * d] = np.eye(d)
    weights["fuse_fc.weight"] = mx.array(eye)
    model.load_weights(list(weights.items()), strict=True)
    model.attach(target)
    mx.eval(model.parameters())
    return model, config
