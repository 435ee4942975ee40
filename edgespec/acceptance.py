"""Verification of one speculative round (Leviathan et al. 2023, Chen et al. 2023). Pure MLX maths.

Notation: x_1..x_K drafted tokens, q_i the draft's warped distribution x_i was drawn from, p_i the
target's warped distribution at the same position, p_{K+1} the target's next distribution after all
drafts. Accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection sample from
norm(max(0, p_i - q_i)) and drop the rest; if all K pass, sample a bonus token from p_{K+1}. Every
emitted token is then distributed exactly as p (the target alone).

Every function accepts leading batch dimensions, so the statistical tests run 10^5 rounds in one call.
"""

from __future__ import annotations

import mlx.core as mx

from edgespec.config import SamplingConfig
from edgespec.sampling import Softmax, sample, uniforms, warp


def _leading_run(ok: mx.array) -> mx.array:
    """Length of the leading run of True along the last axis: [T, T, F, T] -> 2."""
    return mx.sum(mx.cumsum(mx.logical_not(ok).astype(mx.int32), axis=-1) == 0, axis=-1)


def _pick_row(rows: mx.array, index: mx.array) -> mx.array:
    """rows [..., R, V], index [...] -> rows[..., index, :] as [..., V]."""
    return mx.take_along_axis(rows, index[..., None, None], axis=-2)[..., 0, :]


def verify(x: mx.array, q: mx.array | None, p: mx.array, u: mx.array) -> tuple[mx.array, mx.array]:
    """One round of speculative sampling.

    x [..., K] int drafted tokens; q [..., K, V] draft probabilities, or None for a deterministic
    proposal (a point mass at x_i, as an n-gram drafter makes); p [..., K+1, V] target probabilities;
    u [..., K+1] uniforms in [0, 1): u_i for the ratio test of x_i, u_{K+1} for the final sample.
    Returns (n_accepted [...], next_token [...]); the round commits x_1..x_n, next_token.

    Point mass: q_i(x_i) = 1, so x_i is accepted with probability p_i(x_i), and the residual
    max(0, p_i - onehot(x_i)) is p_i with x_i removed.

    Invariant behind the zero-residual guard: max(0, p_i - q_i) sums to zero only if p_i <= q_i
    everywhere, i.e. p_i == q_i (both sum to one). Then p_i(x_i) / q_i(x_i) = 1 and x_i is accepted
    with certainty, so a rejection there has probability 0 and the guard (fall back to p_i) only
    absorbs float rounding; it never changes the distribution.
    Example (K=1, V=2): p_1 = [0.5, 0.5], q_1 = [1, 0], x_1 = 0. Accept with prob 0.5, else the
    residual [0, 0.5] gives token 1: P(0) = 0.5, P(1) = 0.5 = p_1.
    """
    k, vocab = x.shape[-1], p.shape[-1]
    x = x.astype(mx.int32)
    p_draft = p[..., :k, :]
    px = mx.take_along_axis(p_draft, x[..., None], axis=-1)[..., 0]
    if q is None:
        qx = mx.ones_like(px)
    else:
        qx = mx.take_along_axis(q, x[..., None], axis=-1)[..., 0]
    n = _leading_run(u[..., :k] * qx < px)  # u < p/q without dividing; p(x) = 0 always rejects
    # Only row n is sampled from: the residual at the first rejection (n < K), else the bonus
    # p_{K+1}, whose q is 0 (so max(0, p - q) = p there too).
    p_n = _pick_row(p, n)
    if k == 0:  # nothing drafted: a plain sample from p_1
        chosen = p_n
    else:
        rejected, last = (n < k)[..., None], mx.minimum(n, k - 1)
        if q is None:
            x_n = mx.take_along_axis(x, last[..., None], axis=-1)
            chosen = mx.where((mx.arange(vocab) == x_n) & rejected, 0.0, p_n)
        else:
            chosen = mx.where(rejected, mx.maximum(p_n - _pick_row(q, last), 0.0), p_n)
    mass = mx.sum(chosen, axis=-1, keepdims=True)
    chosen = mx.where(mass > 0, chosen, p_n)
    return n, sample(chosen, u[..., k])


def verify_greedy(x: mx.array, target_logits: mx.array) -> tuple[mx.array, mx.array]:
    """Temperature 0: keep the longest prefix where x_i == argmax of the target, then the target's
    argmax at the first disagreement (a correction) or after all K (a bonus).

    x [..., K] int; target_logits [..., K+1, V]. Returns (n_accepted, next_token).
    Example: x = [5, 7, 2], target argmaxes [5, 7, 9, 4] -> (2, 9).
    """
    k = x.shape[-1]
    best = mx.argmax(target_logits, axis=-1).astype(mx.int32)  # [..., K+1]
    n = _leading_run(x.astype(mx.int32) == best[..., :k])
    return n, mx.take_along_axis(best, n[..., None], axis=-1)[..., 0]


def accept(
    x: mx.array,
    q: mx.array | None,
    logits: mx.array,
    cfg: SamplingConfig,
    key: mx.array,
    softmax: Softmax | None = None,
) -> tuple[mx.array, mx.array, mx.array | None]:
    """The acceptance step of one round on the target's logits [K + 1, V] of the pending token and
    the K drafted ones x (q: verify's): (n_accepted, next_token, p), lazy; K = 0 is a plain target
    step. The one place temperature 0 is decided: there the longest prefix agreeing with the
    target's argmax (verify_greedy, what `verify` gives on warp's one-hot rows, without them) and
    p None; else the ratio test on p = warp(logits) (`softmax`: the target's, KVState.softmax)
    with uniforms(key, K + 1), the key schedule's verify key (sampling.round_keys). p is returned
    for a caller that wants the probability of what was sampled (a plain step's p[0, next]: the
    review of an idle draft, drafting/review.py)."""
    if cfg.greedy:
        return (*verify_greedy(x, logits), None)
    p = warp(logits, cfg, softmax)
    return (*verify(x, q, p, uniforms(key, x.shape[-1] + 1)), p)


def expected_acceptance(p: mx.array, q: mx.array) -> mx.array:
    """Probability that one drafted token is accepted: sum_x min(p(x), q(x)) over the last axis."""
    return mx.sum(mx.minimum(p, q), axis=-1)
