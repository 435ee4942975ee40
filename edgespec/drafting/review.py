"""Reviews: how well an idle draft model would have drafted, read without a verify.

While adaptive K has the draft model off (plain steps win), it used to see the draft's acceptance
only in probe rounds: drafted tokens verified by the target, one more verify row each. At a long
context on a CPU a row costs a good part of a plain step, so probes made the off state dearer
than plain decoding, and between them the policy was blind: one unlucky streak could keep a
draft that pays off for a whole answer, which is why switching off needed plain steps to win by
a margin, and a draft that lost by less than the margin stayed on.

A review costs no verify row. The draft model catches up on the tokens committed while it was
off (one forward over them, which it needs before it drafts again anyway), and at each position
j whose token x_j the target sampled from its own distribution p_j (a plain step) it gives

    a_j = min(1, q_j(x_j) / p_j(x_j))     (T > 0; q_j: the draft's distribution there, warped)
    a_j = [argmax q_j == x_j]             (T = 0: every committed token is the target's argmax)

Over x_j ~ p_j, E[min(1, q_j(x_j) / p_j(x_j))] = sum_x min(p_j(x), q_j(x)), the probability that
a token drafted there from q_j passes the ratio test (acceptance.expected_acceptance). So the
a_j estimate the draft's acceptance without bias, one per plain step, and vary less than a
probe's accepted-or-not. At T > 0 only plain steps' positions count (a lookup round's correction
is drawn from a residual, not from p).

A hybrid's lookups, switched off by the policy, are reviewed the same way at every plain step
where the context has a match: a lookup is a point mass at its guess y, so a_j = min(1, [x_j =
y] / p_j(x_j)) = [x_j = y], whose expectation is p_j(y), the probability the lookup's token passes
(no device work at all: the n-gram index is on the host).

Exact: a review reads committed tokens and the target's probabilities of them; it changes no
token, only the estimates AdaptiveK picks K from (drafting/adaptive.py), never the output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import mlx.core as mx
import numpy as np

from edgespec.config import SamplingConfig
from edgespec.sampling import Softmax, warp


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
    so that it never holds up a pipelined run of plain steps (loop.plain_run)."""

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
    if sampling.greedy:
        best = mx.argmax(logits, axis=-1).astype(mx.int32)
        return ((best == columns) & present).astype(mx.float32)
    if probs is None:
        raise ValueError("a review at T > 0 needs the target's probabilities of the tokens")
    q = warp(logits, sampling, softmax)
    qx = mx.take_along_axis(q, columns[:, None], axis=-1)[:, 0]
    qx = mx.where(present, qx, mx.zeros_like(qx))
    return mx.minimum(qx / mx.array(probs, dtype=mx.float32), 1.0).astype(mx.float32)
