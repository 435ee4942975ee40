"""Running a block draft (edgespec/architectures/block_model.py): its state across rounds and its
drafter.

State across rounds (BlockState, kept by the Engine between generations): FeatureState's, read
for a block draft. `features` [P, d] are the block draft's contexts (BlockModel.context of the
target's chosen layer outputs) of context[:-1], P = len(context) - 1: the newest committed token
is the anchor, whose layer outputs the next verify computes. Its cache (`kv`, one KVCache per
draft layer) holds the context keys and values of positions 0..kv.offset - 1, always from true
features (a block's own keys and values are never cached, so nothing drafted needs rolling
back); when the target rewinds (rejections, prefix reuse) `set_features` rewinds it with it.

A round (BlockDrafter.propose): ONE draft forward over [anchor, mask * k], appending the
features the cache lacks; row i (1..k) of its logits, warped like the target's, is q_i, the
proposal for drafted position i. At T > 0 token i is drawn from q_i with the round's uniform
u_i; at temperature 0 it is the argmax of row i (q None). Exact: q_i does not depend on the
tokens drafted before position i, and the ratio test min(1, p_i / q_i) with its residual only
needs each token to have been drawn from the q_i it is tested with (docs/drafting.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from edgespec.architectures.block_model import BlockModel
from edgespec.config import SamplingConfig
from edgespec.drafting.base import Capabilities, Drafter, Proposal, no_proposal
from edgespec.drafting.feature import FeatureState
from edgespec.sampling import Softmax, sampler


class BlockState(FeatureState):
    """FeatureState's bookkeeping over a block draft (module docstring). Invariants: features[i]
    was computed from context[: i + 1]; cache position i holds the keys and values of
    features[i] for every i < kv.offset."""

    def __init__(
        self,
        model: BlockModel,
        name: str = "draft",
        new_cache: Callable[[Any], list[Any]] = make_prompt_cache,
        softmax: Softmax | None = None,
    ):
        super().__init__(cast(Any, model), name, new_cache, softmax)
        self.block = model

    def block_logits(self, context: list[int], k: int) -> mx.array | None:
        """The draft's logits [k', V] for the k' = min(k, block_size - 1) positions after the
        anchor context[-1] (lazy), from one forward that also caches the context positions it
        lacked; None when the features do not cover context[:-1] (a one-token prompt)."""
        hidden = self.block_hidden(context, k)
        return None if hidden is None else self.block.logits(hidden)

    def block_hidden(self, context: list[int], k: int) -> mx.array | None:
        """block_logits' rows before the head: the draft's normed hidden states [k', d]."""
        if not self.covers(context):
            return None
        p = self.n_features
        k = min(k, self.block.args.block_size - 1)
        if k < 1:
            return None
        assert self.features is not None
        self.kv.catch_up(context[:p], lambda a, b: self.read(context, a, b))  # a bounded draft
        new = self.features[self.kv.offset : p][None]
        self.kv.layers.before_forward(int(new.shape[1]))
        toks = mx.array([context[-1]] + [self.block.args.mask_token_id] * k, dtype=mx.int32)
        last = self.features[p - 1][None]  # covers(): p >= 1
        hidden = self.block(toks[None], new, cache=self.kv.cache, last=last)[0, 1:]
        self.kv.tokens = list(context[:p])
        return hidden

    def read(self, context: list[int], start: int, stop: int) -> None:
        """Cache the context keys and values of positions start..stop - 1, lazily (a bounded
        draft's sinks, KVState.catch_up): a block forward whose block rows nothing reads."""
        assert self.features is not None
        toks = mx.array([[self.block.args.mask_token_id]], dtype=mx.int32)
        self.block(toks, self.features[start:stop][None], self.kv.cache, last=self.features[:1])


def draw_block(
    logits: mx.array, sampling: SamplingConfig, key: mx.array, softmax: Softmax | None = None
) -> tuple[mx.array, mx.array | None]:
    """Tokens [k] and q [k, V] from a block's logits rows [k, V]: argmax per row and q None at
    temperature 0; else q = warp(rows) and token i = sample(q_i, u_i), u = uniforms(key, k).
    Example (T = 1): rows giving q_1 = [.7, .3], q_2 = [.2, .8] and u = [.5, .1] -> tokens [0, 0]."""
    return sampler(sampling).draw(logits, key, softmax)


class BlockDrafter(Drafter):
    """Drafter over a BlockState: one draft forward per round (module docstring). The loop hands
    the verify's features to `take_features`, which also rewinds the context cache."""

    method = "block"  # Round.method: adaptive K counts its cost per round (drafting/adaptive.py)

    def __init__(self, state: BlockState, sampling: SamplingConfig, vocab: int):
        self.state, self.sampling, self.vocab = state, sampling, vocab

    @property
    def bound(self) -> int:
        """The most tokens a round drafts: the block's, as trained (block size - 1)."""
        return int(self.state.block.args.block_size) - 1

    def take_features(self, context: list[int], start: int, features: mx.array) -> None:
        self.state.set_features(context, start, features)

    def capabilities(self) -> Capabilities:
        return Capabilities(features=self)  # it reads the verify's features

    def propose(self, context: list[int], k: int, key: mx.array) -> Proposal:
        logits = self.state.block_logits(context, k)
        if logits is None:
            return no_proposal(self.method)  # no features yet (a one-token prompt): a plain step
        tokens, q = draw_block(logits, self.sampling, key, self.state.kv.softmax)
        mx.async_eval(tokens)
        return Proposal(tokens, q, self.method)

    def commit(self, context: list[int]) -> None:
        """Nothing drafted is cached; positions past the context are rewound with it."""
        st = self.state
        st.rewind(min(st.kv.offset, st.n_features, max(len(context) - 1, 0)))
