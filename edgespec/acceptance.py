"""Verification of one speculative round (Leviathan et al. 2023, Chen et al. 2023). Pure MLX maths.

Notation: x_1..x_K drafted tokens, q_i the draft's warped distribution x_i was drawn from, p_i the
target's warped distribution at the same position, p_{K+1} the target's next distribution after all
drafts. Accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection sample from
norm(max(0, p_i - q_i)) and drop the rest; if all K pass, sample a bonus token from p_{K+1}. Every
emitted token is then distributed exactly as p (the target alone).

Every function accepts leading batch dimensions, so the statistical tests run 10^5 rounds in one call.
Below them, reviews: how well an idle draft would have drafted, read from plain steps (adaptive K's
off state, drafting/adaptive.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import mlx.core as mx
import numpy as np

from edgespec.config import SamplingConfig
from edgespec.sampling import Softmax, sample, sampler, uniforms


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
    step. p is what cfg's sampler hands over (sampling.sampler): at temperature 0 none, and the
    longest prefix agreeing with the target's argmax is kept (verify_greedy, what `verify` gives
    on warp's one-hot rows, without them); else the ratio test on p = warp(logits) (`softmax`:
    the target's, KVState.softmax) with uniforms(key, K + 1), the key schedule's verify key
    (sampling.round_keys). p is returned for a caller that wants the probability of what was
    sampled (a plain step's p[0, next]: the review of an idle draft, below)."""
    p = sampler(cfg).probs(logits, softmax)
    if p is None:
        return (*verify_greedy(x, logits), None)
    return (*verify(x, q, p, uniforms(key, x.shape[-1] + 1)), p)


def expected_acceptance(p: mx.array, q: mx.array) -> mx.array:
    """Probability that one drafted token is accepted: sum_x min(p(x), q(x)) over the last axis."""
    return mx.sum(mx.minimum(p, q), axis=-1)


# ------------------------------------------------------------------ reviews
# Reviews: how well an idle draft model would have drafted, read without a verify.
#
# While adaptive K has the draft model off (plain steps win), it used to see the draft's acceptance
# only in probe rounds: drafted tokens verified by the target, one more verify row each. At a long
# context on a CPU a row costs a good part of a plain step, so probes made the off state dearer
# than plain decoding, and between them the policy was blind: one unlucky streak could keep a
# draft that pays off for a whole answer, which is why switching off needed plain steps to win by
# a margin, and a draft that lost by less than the margin stayed on.
#
# A review costs no verify row. The draft model catches up on the tokens committed while it was
# off (one forward over them, which it needs before it drafts again anyway), and at each position
# j whose token x_j the target sampled from its own distribution p_j (a plain step) it gives
#
#     a_j = min(1, q_j(x_j) / p_j(x_j))     (T > 0; q_j: the draft's distribution there, warped)
#     a_j = [argmax q_j == x_j]             (T = 0: every committed token is the target's argmax)
#
# Over x_j ~ p_j, E[min(1, q_j(x_j) / p_j(x_j))] = sum_x min(p_j(x), q_j(x)), the probability that
# a token drafted there from q_j passes the ratio test (acceptance.expected_acceptance). So the
# a_j estimate the draft's acceptance without bias, one per plain step, and vary less than a
# probe's accepted-or-not. At T > 0 only plain steps' positions count (a lookup round's correction
# is drawn from a residual, not from p).
#
# A hybrid's lookups, switched off by the policy, are reviewed the same way at every plain step
# where the context has a match: a lookup is a point mass at its guess y, so a_j = min(1, [x_j =
# y] / p_j(x_j)) = [x_j = y], whose expectation is p_j(y), the probability the lookup's token passes
# (no device work at all: the n-gram index is on the host).
#
# Exact: a review reads committed tokens and the target's probabilities of them; it changes no
# token, only the estimates AdaptiveK picks K from (drafting/adaptive.py), never the output.


@dataclass(frozen=True)
class Review:
    """A review's outcome: `method` (the draft model's, or "ngram": a lookup's) and one a_j per
    reviewed position; `match`: a lookup's suffix match length."""

    method: str
    values: tuple[float, ...]
    match: int = 0


@dataclass(frozen=True)
class PendingReview:
    """A review whose forward is queued: its values are read (`done`) a step later, once computed,
    so that it never holds up a pipelined run of plain steps (drafting/review.py)."""

    method: str
    values: mx.array

    def done(self) -> Review:
        return Review(self.method, tuple(cast(list[float], self.values.tolist())))


def review_values(
    logits: mx.array,
    tokens: list[int],
    probs: list[float] | None,
    sampling: SamplingConfig,
    softmax: Softmax | None = None,
    head: np.ndarray | None = None,
) -> mx.array:
    """The a_j (module docstring) of draft logits [m, W] at m positions whose committed tokens are
    `tokens`: the target's probabilities of them `probs` at T > 0 (None at T = 0). `head`: a
    reduced-head draft's sorted token ids (W of them; a token outside it has q = 0).

        review_values(mx.array([[0.0, 9.0]]), [1], None, SamplingConfig())  # -> [1.0]
    """
    ids = np.asarray(tokens, dtype=np.int64)
    if head is None:
        cols, inside = ids, np.ones(len(ids), dtype=bool)
    else:
        cols = np.minimum(np.searchsorted(head, ids), len(head) - 1)
        inside = head[cols] == ids
    columns, present = mx.array(cols.astype(np.int32)), mx.array(inside)
    q = sampler(sampling).probs(logits, softmax)
    if q is None:  # temperature 0: whether the draft's argmax is the token
        best = mx.argmax(logits, axis=-1).astype(mx.int32)
        return ((best == columns) & present).astype(mx.float32)
    if probs is None:
        raise ValueError("a review at T > 0 needs the target's probabilities of the tokens")
    qx = mx.take_along_axis(q, columns[:, None], axis=-1)[:, 0]
    qx = mx.where(present, qx, mx.zeros_like(qx))
    return mx.minimum(qx / mx.array(probs, dtype=mx.float32), 1.0).astype(mx.float32)
