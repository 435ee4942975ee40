"""A numpy reference of one block-draft forward (DFlash), written from the architecture as
published (docs/drafting.md, Block drafts) and sharing no code with edgespec/architectures/block.py:
explicit rotate-half RoPE, grouped heads repeated by hand, a softmax over every key."""

from __future__ import annotations

from typing import Any

import numpy as np


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """x [T, heads, D] rotated at `positions` [T] (the rotate-half form, non-interleaved)."""
    d = x.shape[-1]
    angles = positions[:, None] * theta ** (-np.arange(0, d, 2) / d)[None, :]
    cos = np.concatenate([np.cos(angles)] * 2, -1)[:, None, :]
    sin = np.concatenate([np.sin(angles)] * 2, -1)[:, None, :]
    half = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + half * sin


def block_logits(
    w: dict[str, np.ndarray],
    cfg: dict[str, Any],
    tokens: list[int],
    raw: np.ndarray,
    embed: np.ndarray,
    head: np.ndarray,
    windows: dict[int, int] | None = None,
) -> np.ndarray:
    """Logits [L, V] of the block `tokens` after a context of raw target layer outputs [S, n*d]:
    context at positions 0..S-1, block at S..S+L-1, every block query over every key (in a layer
    of `windows`, {layer: width}, over the keys less than width positions away)."""
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    s, n = raw.shape[0], len(tokens)
    ctx = _rms(raw @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    h = embed[tokens]
    pos_q, pos_k = np.arange(s, s + n), np.arange(s + n)
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        x = _rms(h, w[p + "input_layernorm.weight"], eps)
        both = np.concatenate([ctx, x])
        q = _rms(
            (x @ w[p + "self_attn.q_proj.weight"].T).reshape(n, heads, hd),
            w[p + "self_attn.q_norm.weight"],
            eps,
        )
        k = _rms(
            (both @ w[p + "self_attn.k_proj.weight"].T).reshape(s + n, kv, hd),
            w[p + "self_attn.k_norm.weight"],
            eps,
        )
        v = (both @ w[p + "self_attn.v_proj.weight"].T).reshape(s + n, kv, hd)
        q, k = _rope(q, pos_q, theta), _rope(k, pos_k, theta)
        group = heads // kv
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
        width = (windows or {}).get(i)
        if width:
            scores = np.where(np.abs(pos_q[:, None] - pos_k[None, :]) < width, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out = np.einsum("hqk,khd->qhd", probs, v).reshape(n, heads * hd)
        h = h + out @ w[p + "self_attn.o_proj.weight"].T
        x = _rms(h, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    return _rms(h, w["norm.weight"], eps) @ head.T
