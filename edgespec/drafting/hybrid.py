"""HybridDrafter: n-gram prompt lookup when the context has a match, the draft model otherwise.

Draft-cache invariant: the draft model's cache always holds a prefix of the committed context.
Rounds drafted by the n-gram do not touch it; the next model round feeds every token past its
offset first (ModelDrafter.propose feeds context[offset:]), so it catches up lazily, in one
forward, and only when it is actually used.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from edgespec.drafting.base import Drafter, Proposal, adopt_features
from edgespec.drafting.ngram import NgramDrafter

# A one-token suffix match is a weak guess next to a trained draft: hybrid wants >= 2 tokens.
HYBRID_MIN_MATCH = 2


class HybridDrafter(Drafter):
    """Drafter: n-gram lookup when the last >= min_match tokens occurred before, else the model.

    Each proposal names who made it (Proposal.method "ngram" or "draft"). A lookup proposes up to
    max(K, free_k) tokens (SpecConfig.ngram_k), or `lookup_k("ngram", free_k)` when an adaptive
    policy sizes lookups (AdaptiveK.lookup_k). `propose_free` is the lookup alone: the loop uses
    it in rounds where an adaptive K policy switched drafting off (K = 0), because a lookup costs
    next to nothing and a match is often accepted.
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
        self.lookup_k = lookup_k
        adopt_features(self, model)  # a feature draft's features reach the model (FeatureInput)

    def _lookup_len(self, k: int) -> int:
        return self.lookup_k("ngram", self.free_k) if self.lookup_k else max(k, self.free_k)

    def propose_free(self, context: list[int], key: mx.array) -> Proposal:
        return self.ngram.propose_min(context, self._lookup_len(0), self.min_match)

    def propose_behind(self, context: list[int], k: int) -> Proposal | None:
        """While drafting is off (K <= 0), the lookup one token behind
        (NgramDrafter.propose_behind); None when the policy wants the model (K > 0): the
        pipelined run ends so the model can draft from the full context."""
        if k > 0:
            return None
        return self.ngram.propose_behind(context, self._lookup_len(0), self.min_match)

    def propose(self, context: list[int], k: int, key: mx.array) -> Proposal:
        # A lookup may propose more than the model's k: it costs no draft steps (the loop cuts
        # any proposal to the room left in the context window).
        prop = self.ngram.propose_min(context, self._lookup_len(k), self.min_match)
        return prop if prop.size > 0 else self.model.propose(context, k, key)

    def commit(self, context: list[int]) -> None:
        self.ngram.commit(context)
        self.model.commit(context)  # keeps its cache a prefix of context (it may lag behind)
