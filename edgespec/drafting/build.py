"""Drafters beyond the plain draft model, and the choice of drafter from SpecConfig.method.

- ConfidentDrafter: the draft model, stopping a round early when its top probability falls below a
  threshold. Still exact: how many tokens are drafted depends only on the draft's own information,
  and the acceptance test does not depend on how K was chosen.
- HybridDrafter: n-gram prompt lookup when the context has a match, the draft model otherwise.

Draft-cache invariant (hybrid): the draft model's cache always holds a prefix of the committed
context. Rounds drafted by the n-gram do not touch it; the next model round feeds every token past
its offset first (ModelDrafter.propose feeds context[offset:]), so it catches up lazily, in one
forward, and only when it is actually used.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from edgespec.cache import KVState
from edgespec.config import SamplingConfig, SpecConfig
from edgespec.drafting.eagle import EagleDrafter, EagleState
from edgespec.drafting.ngram import NgramDrafter
from edgespec.errors import ConfigError
from edgespec.loop import Drafter, ModelDrafter, Proposal, no_proposal
from edgespec.sampling import sample, uniforms, warp

# A one-token suffix match is a weak guess next to a trained draft: hybrid wants >= 2 tokens.
HYBRID_MIN_MATCH = 2


class ConfidentDrafter(ModelDrafter):
    """ModelDrafter that stops drafting at the first token whose top draft probability is below
    `stop_below` (that token is not proposed; a round may then draft nothing). At temperature 0
    the confidence is the softmax of the raw logits (the warped q is one-hot there).

    Costs one host read per drafted token (the stop decision), which the plain ModelDrafter avoids.
    """

    def __init__(self, state: KVState, sampling: SamplingConfig, vocab: int, stop_below: float):
        super().__init__(state, sampling, vocab)
        if not 0.0 <= stop_below < 1.0:
            raise ConfigError(f"the early-stop threshold must be in [0, 1), got {stop_below}")
        self.stop_below = stop_below

    def propose(self, context: list[int], k: int, key: mx.array) -> Proposal:
        inputs = mx.array(context[self.state.offset :], dtype=mx.int32)
        u = None if self.sampling.greedy else uniforms(key, k)
        tokens: list[mx.array] = []
        rows: list[mx.array] = []
        for i in range(k):
            logits = self._logits(inputs)
            q = mx.softmax(logits.astype(mx.float32)) if u is None else warp(logits, self.sampling)
            if mx.max(q).item() < self.stop_below:
                break
            tok = mx.argmax(logits).astype(mx.int32) if u is None else sample(q, u[i])
            if self.head_ids is not None:
                tok = self.head_ids[tok]
            if u is not None:
                rows.append(q)
            tokens.append(tok)
            inputs = tok.reshape(1)
        if not tokens:
            return no_proposal()
        return Proposal(mx.stack(tokens), self._full_q(rows) if rows else None)


class HybridDrafter:
    """Drafter: n-gram lookup when the last >= min_match tokens occurred before, else the model.

    `method` names the drafter of the latest proposal ("ngram" or "draft"), so Round events say
    who drafted each round. A lookup proposes up to max(K, free_k) tokens (SpecConfig.ngram_k).
    `propose_free` is the lookup alone (up to `free_k` tokens; the loop cuts any proposal to the
    room left in the context window): the loop uses it in rounds where an adaptive K policy
    switched drafting off (K = 0), because a lookup costs next to nothing and a match is often
    accepted.
    """

    def __init__(
        self,
        ngram: NgramDrafter,
        model: Drafter,
        min_match: int = HYBRID_MIN_MATCH,
        free_k: int = 4,
        lookup_k: Callable[[str, int], int] | None = None,
    ):
        self.ngram, self.model, self.min_match, self.free_k = ngram, model, min_match, free_k
        # lookup_k("ngram", default) -> how many tokens a lookup proposes (AdaptiveK.lookup_k);
        # None: free_k, or the model's k when larger.
        self.lookup_k = lookup_k
        self.method = "draft"

    def _lookup_len(self, k: int) -> int:
        return self.lookup_k("ngram", self.free_k) if self.lookup_k else max(k, self.free_k)

    def propose_free(self, context: list[int], key: mx.array) -> Proposal:
        self.method = "ngram"
        return self.ngram.propose_min(context, self._lookup_len(0), self.min_match)

    def propose_behind(self, context: list[int], k: int) -> list[int] | None:
        """For loop._plain_run: while drafting is off (K <= 0), the lookup one token behind
        (NgramDrafter.propose_behind); None when the policy wants the model (K > 0): the run ends
        so the model can draft from the full context."""
        if k > 0:
            return None
        tokens = self.ngram.propose_behind(context, self._lookup_len(0), self.min_match)
        if tokens:
            self.method = "ngram"
        return tokens

    def propose(self, context: list[int], k: int, key: mx.array) -> Proposal:
        # A lookup may propose more than the model's k: it costs no draft steps (the loop cuts
        # any proposal to the room left in the context window).
        prop = self.ngram.propose_min(context, self._lookup_len(k), self.min_match)
        if prop.tokens.shape[0] > 0:
            self.method = "ngram"
            return prop
        self.method = "draft"
        return self.model.propose(context, k, key)

    @property
    def match(self) -> int:
        """The n-gram suffix length behind the latest proposal (0: the model drafted it)."""
        return self.ngram.match if self.method == "ngram" else 0

    @property
    def wants_features(self) -> bool:
        return bool(getattr(self.model, "wants_features", False))

    def take_features(self, context: list[int], start: int, features: mx.array) -> None:
        self.model.take_features(context, start, features)  # type: ignore[attr-defined]

    def commit(self, context: list[int]) -> None:
        self.ngram.commit(context)
        self.model.commit(context)  # keeps its cache a prefix of context (it may lag behind)


def build_drafter(
    spec: SpecConfig,
    sampling: SamplingConfig,
    draft: KVState | EagleState | None,
    vocab: int,
    engine_name: str,
    stop_below: float = 0.0,
) -> Drafter:
    """The drafter for spec.method ("draft", "ngram" or "hybrid"), fresh for one generation.

    stop_below > 0 makes the draft model stop early below that top probability (ConfidentDrafter).
    Raises ConfigError when the method needs a draft model the engine does not have.
    """
    if spec.method == "ngram":
        return NgramDrafter(spec.ngram_min, spec.ngram_max, spec.long_match, spec.ngram_long_k)
    if spec.method not in ("draft", "hybrid"):
        raise ConfigError(f"method {spec.method!r} has no drafter; use draft, ngram or hybrid")
    if draft is None:
        raise ConfigError(
            f"{engine_name} has no draft model; pass a draft, use --method ngram, or --no-spec"
        )
    model: Drafter
    if isinstance(draft, EagleState):
        model = EagleDrafter(draft, sampling, vocab)
    elif stop_below > 0:
        model = ConfidentDrafter(draft, sampling, vocab, stop_below)
    else:
        model = ModelDrafter(draft, sampling, vocab)
    if spec.method == "draft":
        return model
    min_match = max(spec.ngram_min, min(HYBRID_MIN_MATCH, spec.ngram_max))
    ngram = NgramDrafter(spec.ngram_min, spec.ngram_max, spec.long_match, spec.ngram_long_k)
    return HybridDrafter(ngram, model, min_match, max(spec.k, spec.ngram_k))
