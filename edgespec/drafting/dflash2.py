"""Running a DFlash2 draft (edgespec/architectures/dflash2_model.py): one block forward a round, as
a DFlash draft (BlockState, drafting/block.py), then the candidate selector's walk picks the path.

A round: the block forward gives hidden rows h_1..h_k and their logits (the target's head, the
draft's output scalars). Row i's top `selector_top_k` tokens are its candidates C_i; the walk
goes from the anchor x_0 = context[-1]:
    s_i(c) = unary_i(c) + edge_i(x_{i-1}, c)   for c in C_i,
    q_i = warp(s_i) over C_i (the sampling settings' temperature, top-k, top-p, min-p; 0 off C_i),
    x_i ~ q_i with the round's uniform u_i (temperature 0: x_i = the argmax of s_i, q None),
as z-lab's reference (dflash/model.py, CandidateSelector.select) and vLLM's walk do (they apply
the temperature only, which is the same when the other settings are off).

Why the ratio test stays exact. The ratio test at position i (accept x_i with probability
min(1, p_i(x_i) / q_i(x_i)), else draw from the residual max(p_i - q_i, 0)) emits a token with
law p_i exactly when, given everything the test conditions on, x_i was drawn from the q_i it is
handed. It runs only when x_1..x_{i-1} were all accepted, so it conditions on the committed
context plus x_1..x_{i-1}. Everything the walk reads is either computed from the committed
context by the block forward (h, the logits, the candidates C_i: draft-side quantities, fixed
before any token of the round is drawn and independent of the verify's uniforms) or is the
previous tokens x_1..x_{i-1} themselves; the only fresh randomness is u_i, independent of the
rest. So, given that conditioning, x_i has law exactly q_i = warp(s_i( . | x_{i-1})), the row
this module hands over with it, whatever the selector did: a proposal may depend on the drafted
prefix, as any autoregressive draft's does. Not exact would be handing over another row: the
unary row (the logits before the edges), the row of another predecessor, or a row for tokens
chosen by argmax at T > 0 (tests/loop/test_dflash2.py plants these). Tokens off C_i have q = 0:
never drafted, and the residual p - q gives them their whole p mass. At temperature 0 the walk
is deterministic and the verify compares argmaxes: point masses, nothing to hand over.
"""

from __future__ import annotations

from typing import cast

import mlx.core as mx
import numpy as np

from edgespec.architectures.dflash2_model import DFlash2Model
from edgespec.config import SamplingConfig
from edgespec.drafting.base import Proposal, no_proposal
from edgespec.drafting.block import BlockDrafter
from edgespec.sampling import Softmax, sampler, uniforms


def path_scores(
    model: DFlash2Model, hidden: mx.array, logits: mx.array, anchor: int
) -> tuple[mx.array, mx.array]:
    """(candidates [k, K], scores [k, K, K]): scores[i, a, c] = s_{i+1}(candidate c) when the
    token before is candidate a of the row before (the anchor for i = 0, every a alike)."""
    sel = model.candidate_selector
    ids, unary = sel.candidates(logits)
    return ids, unary.astype(mx.float32)[:, None, :] + sel.edges(hidden, ids, anchor)


def walk(scores: np.ndarray, u: np.ndarray | None) -> list[int]:
    """Candidate indices of the path through `scores` [k, K, K] (path_scores' rows, or their
    warped probabilities when `u` is given): argmax at each step, or with u [k] the inverse-CDF
    draw of edgespec.sampling.sample. Example: scores[0, :] = [.2, .8], scores[1, 1] = [.9, .1],
    u None -> [1, 0]."""
    path, prev = [], 0
    for i in range(scores.shape[0]):
        row = scores[i, prev]
        if u is None:
            prev = int(np.argmax(row))
        else:
            cdf = np.cumsum(row, dtype=np.float32)
            prev = min(int(np.sum(cdf <= u[i] * cdf[-1])), len(row) - 1)
        path.append(prev)
    return path


def choose_path(
    model: DFlash2Model,
    hidden: mx.array,
    anchor: int,
    sampling: SamplingConfig,
    key: mx.array,
    softmax: Softmax | None = None,
    logits: mx.array | None = None,
) -> tuple[mx.array, mx.array | None]:
    """Tokens [k] and the rows q [k, V] they were drawn from (None at temperature 0) for a
    block's hidden rows [k, d] after `anchor` (module docstring); `logits` [k, V]: the rows'
    logits when given (None: the draft's own, model.logits(hidden))."""
    logits = model.logits(hidden) if logits is None else logits
    ids, scores = path_scores(model, hidden, logits, anchor)
    k, K = ids.shape
    probs = sampler(sampling).probs(scores.reshape(k * K, K), softmax)
    if probs is None:  # temperature 0: the argmax walk
        picks = walk(np.array(scores), None)
    else:
        probs = probs.reshape(k, K, K)
        picks = walk(np.array(probs), np.array(uniforms(key, k)))
    steps = mx.arange(k)
    chosen = mx.array(picks, dtype=mx.int32)
    tokens = ids[steps, chosen]
    if probs is None:
        return tokens, None
    prev = mx.array([0, *picks[:-1]], dtype=mx.int32)
    rows = probs[steps, prev]  # [k, K]: the row each token was drawn from
    q = mx.put_along_axis(mx.zeros((k, model.vocab_size)), ids, rows, axis=-1)
    return tokens, q


class DFlash2Drafter(BlockDrafter):
    """BlockDrafter whose tokens come from the candidate selector's walk (module docstring)."""

    def propose(self, context: list[int], k: int, key: mx.array) -> Proposal:
        st = self.state
        hidden = st.block_hidden(context, k)
        if hidden is None:
            return no_proposal(self.method)  # no features yet (a one-token prompt)
        model = cast(DFlash2Model, st.block)
        tokens, q = choose_path(model, hidden, context[-1], self.sampling, key, st.kv.softmax)
        return Proposal(tokens, q, self.method)
