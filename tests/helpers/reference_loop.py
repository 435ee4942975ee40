"""A slow, obviously-correct numpy reference of the whole draft-verify loop (llm.c style).

No KV caches: every distribution comes from a full forward over the token list so far, and all maths
(warps, ratio tests, residuals, inverse-CDF sampling) is plain numpy in float64, one token at a time.
Randomness: the reference follows the engine's documented key schedule (`round_keys`: per round a
drafting key giving K uniforms and a verify key giving K + 1 uniforms; plain decoding splits
(next, sample) per token) and turns those MLX-drawn uniforms into numpy floats, so both
implementations consume identical uniforms and must emit identical tokens.
"""

from __future__ import annotations

from collections.abc import Iterable

import mlx.core as mx
import numpy as np

from edgespec.config import SamplingConfig
from edgespec.sampling import make_key, round_keys, split, uniforms


def warp_np(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """Same contract as edgespec.sampling.warp, for one row, in float64."""
    z = np.asarray(logits, dtype=np.float64)
    if cfg.greedy:
        return (np.arange(len(z)) == np.argmax(z)).astype(np.float64)
    z = z / cfg.temperature
    if 0 < cfg.top_k < len(z):
        kth = np.sort(z)[len(z) - cfg.top_k]
        z = np.where(z >= kth, z, -np.inf)
    e = np.exp(z - z.max())
    probs = e / e.sum()
    if cfg.top_p < 1.0:
        desc = np.sort(probs)[::-1]
        before = np.cumsum(desc) - desc
        cut = desc[before < cfg.top_p].min()
        probs = np.where(probs >= cut, probs, 0.0)
    if cfg.min_p > 0.0:
        probs = np.where(probs >= cfg.min_p * probs.max(), probs, 0.0)
    return probs / probs.sum()


def sample_np(weights: np.ndarray, u: float) -> int:
    """Inverse CDF: first index whose cumulative weight exceeds u * total."""
    cdf = np.cumsum(np.asarray(weights, dtype=np.float64))
    return int(min(np.sum(cdf <= u * cdf[-1]), len(cdf) - 1))


def verify_np(
    x: list[int], q: list[np.ndarray], p: list[np.ndarray], u: np.ndarray
) -> tuple[int, int]:
    """One round, token by token: ratio test, residual at the first rejection, bonus otherwise."""
    for i, tok in enumerate(x):
        if u[i] * q[i][tok] < p[i][tok]:
            continue
        residual = np.maximum(p[i] - q[i], 0.0)
        if residual.sum() <= 0:
            residual = p[i]
        return i, sample_np(residual, u[len(x)])
    return len(x), sample_np(p[len(x)], u[len(x)])


def full_logits(model, tokens: list[int]) -> np.ndarray:
    """Logits [L, V] of a full, cache-free forward over `tokens`."""
    out = model(mx.array(tokens, dtype=mx.int32)[None])[0]
    return np.array(out.astype(mx.float32), dtype=np.float64)


def _draft(model, ctx: list[int], k: int, cfg: SamplingConfig, u: np.ndarray | None):
    xs: list[int] = []
    qs: list[np.ndarray] = []
    for i in range(k):
        q = warp_np(full_logits(model, ctx + xs)[-1], cfg)
        xs.append(int(np.argmax(q)) if u is None else sample_np(q, float(u[i])))
        qs.append(q)
    return xs, qs


def _take(new: Iterable[int], out: list[int], eos: set[int], max_tokens: int) -> bool:
    """Append committed tokens to `out`; True when generation ends (EOS or length)."""
    for tok in new:
        if tok in eos:
            return True
        out.append(tok)
        if len(out) >= max_tokens:
            return True
    return False


def reference_speculative(
    target, draft, prompt: list[int], cfg: SamplingConfig, k: int, max_tokens: int, eos=()
) -> list[int]:
    """The generated token ids (EOS excluded) of speculative decoding with a fixed K."""
    key, ctx, out = make_key(cfg.seed), list(prompt), []
    while True:
        key, draft_key, verify_key = round_keys(key)
        ud = None if cfg.greedy else np.array(uniforms(draft_key, k))
        xs, qs = _draft(draft, ctx, k, cfg, ud)
        logits = full_logits(target, ctx + xs)[-(k + 1) :]
        ps = [warp_np(row, cfg) for row in logits]
        if cfg.greedy:
            best = [int(np.argmax(row)) for row in logits]
            n = next((i for i in range(k) if xs[i] != best[i]), k)
            nxt = best[n]
        else:
            n, nxt = verify_np(xs, qs, ps, np.array(uniforms(verify_key, k + 1)))
        new = xs[:n] + [nxt]
        if _take(new, out, set(eos), max_tokens):
            return out
        ctx += new


def reference_plain(target, prompt: list[int], cfg: SamplingConfig, max_tokens: int, eos=()):
    """Plain target decoding with the engine's per-token key schedule."""
    key, ctx, out = make_key(cfg.seed), list(prompt), []
    while True:
        key, sample_key = split(key, 2)
        p = warp_np(full_logits(target, ctx)[-1], cfg)
        tok = int(np.argmax(p)) if cfg.greedy else sample_np(p, float(uniforms(sample_key, 1)[0]))
        if _take([tok], out, set(eos), max_tokens):
            return out
        ctx.append(tok)
