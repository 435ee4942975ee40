"""A numpy reference of one block-draft forward (DFlash), written from the architecture as
published (docs/drafting.md, Block drafts) and sharing no code with
edgespec/architectures/block_model.py: explicit rotate-half RoPE, grouped heads repeated by hand, a
softmax over every key."""

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
    conv: bool = False,
    causal: set[int] | None = None,
) -> np.ndarray:
    """Logits [L, V] of the block `tokens` after a context of raw target layer outputs [S, n*d]:
    context at positions 0..S-1, block at S..S+L-1, every block query over every key (in a layer
    of `windows`, {layer: width}, over the keys less than width positions away). `conv`: DFlash2's
    grouped dynamic convolutions around each attention and MLP (the weights' `*_conv.*`). In a
    layer of `causal`, a block query also skips the block keys after it."""
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    s, n = raw.shape[0], len(tokens)
    ctx = _rms(raw @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    h = embed[tokens]
    pos_q, pos_k = np.arange(s, s + n), np.arange(s + n)
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        x = _rms(h, w[p + "input_layernorm.weight"], eps)
        x, after = _conv_pair(w, p + "attention_conv.", x) if conv else (x, None)
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
        if i in (causal or set()):
            scores = np.where(pos_k[None, :] <= pos_q[:, None], scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out = np.einsum("hqk,khd->qhd", probs, v).reshape(n, heads * hd)
        out = out @ w[p + "self_attn.o_proj.weight"].T
        h = h + (after(out) if after else out)
        x = _rms(h, w[p + "post_attention_layernorm.weight"], eps)
        x, after = _conv_pair(w, p + "mlp_conv.", x) if conv else (x, None)
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        out = (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
        h = h + (after(out) if after else out)
    return _rms(h, w["norm.weight"], eps) @ head.T


def _conv_pair(w: dict[str, np.ndarray], p: str, x: np.ndarray) -> tuple[np.ndarray, Any]:
    """DFlash2's convolution pair read from `p` + base_kernel [2, taps, d] and
    kernel_projection.weight [2 * taps * G, d]: (side 0 applied to x, side 1 as a function),
    both with the coefficients of x, written as the per-row sum over taps."""
    base = w[p + "base_kernel"]
    taps, d = base.shape[1], base.shape[2]
    delta = (x @ w[p + "kernel_projection.weight"].T).reshape(len(x), 2, taps, -1)
    group = d // delta.shape[-1]

    def side(s: int, y: np.ndarray) -> np.ndarray:
        out = np.zeros_like(y)
        for j in range(len(y)):
            for t in range(min(taps, j + 1)):
                coef = base[s, t] + np.repeat(delta[j, s, t], group)
                out[j] += coef * y[j - t]
        return out

    return side(0, x), lambda y: side(1, y)
