"""Drafting with a token draft: a small model with its own KV cache (ModelDrafter), and the
helpers the feature and block drafters share (pick_token, full_q, fit_vocab)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from edgespec.acceptance import PendingReview, review_values
from edgespec.architectures.token_draft import reduced_head
from edgespec.cache import KVState
from edgespec.config import SamplingConfig
from edgespec.drafting.base import Capabilities, Drafter, Proposal
from edgespec.sampling import Softmax, sampler


class DraftSteps:
    """What a token draft's K forwards feed: first the context its cache lacks, then each drafted
    token alone. A backend may feed them otherwise (the CPU backend's PairedSteps, edgespec/cpu/
    pairs.py: two rows a step) as long as each forward's last row predicts the next token."""

    def first(self, state: KVState, context: list[int]) -> mx.array:
        """The first forward's inputs [L]: context[state.offset:]."""
        return mx.array(context[state.offset :], dtype=mx.int32)

    def next(self, state: KVState, inputs: mx.array, token: mx.array) -> mx.array:
        """The next forward's inputs after the forward over `inputs` drafted `token`: [token]."""
        return token.reshape(1)


ONE_BY_ONE = DraftSteps()


def fit_vocab(logits: mx.array, vocab: int) -> mx.array:
    """Cut or -inf-pad draft logits [..., Vd] to the target's width V (padded embedding tables)."""
    width = logits.shape[-1]
    if width == vocab:
        return logits
    if width > vocab:
        return logits[..., :vocab]
    pad = mx.full((*logits.shape[:-1], vocab - width), -mx.inf, dtype=logits.dtype)
    return mx.concatenate([logits, pad], axis=-1)


class ModelDrafter(Drafter):
    """Drafts with a small model and its own KV cache.

    Its cache holds a prefix of the context; the tokens after it (`pending`) are fed at the start of
    the next proposal. Usually one token, two after a bonus round: the draft never ran its K-th
    drafted token, which the target then accepted.

    A draft with a reduced output head (EdgeSpec's own drafts: `head_logits` + `head_ids`) is run
    head-only: argmax, warp and sampling over its H head columns instead of the full vocabulary,
    and q is scattered to the vocabulary once per round. Same tokens and same q as the full-width
    path (off-head tokens have q = 0 either way; head ids are sorted, so the inverse-CDF sample and
    the argmax tie-break pick the same token), for a fraction of the per-token work.

    `steps` (DraftSteps, below; the backend's) says what each of the K draft forwards feeds. A
    drafter whose cache restores rather than trims (recurrent layers) feeds one token a step.
    """

    method = "draft"

    def __init__(
        self,
        state: KVState,
        sampling: SamplingConfig,
        vocab: int,
        steps: DraftSteps | None = None,
    ):
        self.state, self.sampling, self.vocab = state, sampling, vocab
        self.head_ids = reduced_head(state.model)
        # a backend's steps may trim the cache: not where it keeps restore points instead
        self.steps = steps if steps is not None and state.trims else ONE_BY_ONE
        self._head = None if self.head_ids is None else np.array(self.head_ids)  # (review)

    def _logits(self, inputs: mx.array) -> mx.array:
        if self.head_ids is not None:
            return self.state.forward(inputs, head_only=True)[-1]
        return fit_vocab(self.state.forward(inputs)[-1], self.vocab)

    def propose(self, context: list[int], k: int, key: mx.array) -> Proposal:
        state, steps = self.state, self.steps
        state.catch_up(context)  # a bounded draft far behind reads only what it attends to
        inputs = steps.first(state, context)
        u = sampler(self.sampling).uniforms(key, k)
        tokens: list[mx.array] = []
        rows: list[mx.array] = []
        for i in range(k):
            if i > 0:
                inputs = steps.next(state, inputs, tokens[-1])
            logits = self._logits(inputs)
            tok = pick_token(logits, self.sampling, u, i, self.head_ids, rows, state.softmax)
            tokens.append(tok)
            mx.async_eval(tok)
        return Proposal(mx.stack(tokens), self._full_q(rows) if rows else None)

    def review(self, context: list[int], probs: dict[int, float]) -> PendingReview | None:
        """How well this draft would have drafted the tokens committed since its cache last
        grew (acceptance.py, reviews), from one catch-up forward over them, lazy: it then holds
        context[:-1], as after a round. `probs`: the target's probabilities of tokens sampled in
        plain steps, by position (T > 0; positions without one are not reviewed). None when
        there is nothing to review."""
        state = self.state
        state.catch_up(context)  # a bounded draft far behind reads only what it attends to
        start, end = state.offset, len(context) - 1
        if end <= start:
            return None
        logits = state.forward(
            mx.array(context[start:end], dtype=mx.int32), self.head_ids is not None
        )
        state.rewind(context, state.offset)
        # Row i predicts the token at start + i + 1.
        reads = sampler(self.sampling)
        rows = [i for i in range(end - start) if reads.reviews(start + i + 1, probs)]
        if not rows:
            return None
        tokens = [context[start + i + 1] for i in rows]
        px = [probs.get(start + i + 1, 1.0) for i in rows]  # read at T > 0 only, where all are
        if self.head_ids is None:
            logits = fit_vocab(logits, self.vocab)
        if len(rows) < end - start:
            logits = logits[mx.array(rows)]
        values = review_values(logits, tokens, px, self.sampling, state.softmax, self._head)
        mx.async_eval(values)
        return PendingReview(self.method, values)

    def capabilities(self) -> Capabilities:
        return Capabilities(reviews=self)

    def _full_q(self, rows: list[mx.array]) -> mx.array:
        return full_q(rows, self.head_ids, self.vocab)

    def commit(self, context: list[int]) -> None:
        self.state.rewind(context, min(self.state.offset, len(context) - 1))


def pick_token(
    logits: mx.array,
    sampling: SamplingConfig,
    u: mx.array | None,
    i: int,
    head_ids: mx.array | None,
    rows: list[mx.array],
    softmax: Softmax | None = None,
) -> mx.array:
    """The i-th drafted token from one row of draft logits (lazy), as `sampling`'s sampler picks
    it (sampling.Sampler.pick: argmax at temperature 0, else an inverse-CDF sample with uniform
    u[i] from the warped row, which is appended to `rows`, the drafted q). A reduced-head draft's
    column index is mapped to its token id."""
    tok = sampler(sampling).pick(logits, u, i, rows, softmax)
    return tok if head_ids is None else head_ids[tok]


def full_q(rows: list[mx.array], head_ids: mx.array | None, vocab: int) -> mx.array:
    """Stack drafted q rows; a reduced head's rows are scattered to the vocabulary (0 elsewhere)."""
    q = mx.stack(rows)
    if head_ids is None:
        return q
    full = mx.zeros((q.shape[0], vocab), dtype=q.dtype)
    full[:, head_ids] = q
    return full
