"""N-gram prompt lookup: draft the continuation that followed the most recent earlier occurrence of
the context's last n tokens (n from n_max down to n_min). No draft model.

The proposal is deterministic, so q is a point mass and the loop verifies it with the point-mass
path of `acceptance.verify` (accept x with probability p(x), else resample from p without x): the
output is still distributed exactly as the target's. At temperature 0 it is a plain argmax match.

Cost: the index is incremental. Each committed token adds one entry per n (a dict write), and a
lookup is at most n_max - n_min + 1 dict reads, so a round costs O(new tokens * n_max), not O(L^2).

HybridDrafter (method "hybrid"): the lookup when the context has a match, the draft model
otherwise. The draft model's cache always holds a prefix of the committed context: rounds drafted
by the lookup do not touch it; the next model round feeds every token past its offset first
(ModelDrafter.propose feeds context[offset:]), so it catches up lazily, in one forward, and only
when it is actually used.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from edgespec.drafting.base import Capabilities, Drafter, Proposal, point_mass


class NgramIndex:
    """For every n in [n_min, n_max]: n-gram -> position of the token that followed its most recent
    occurrence. Only n-grams whose next token is known are indexed, so the context's own suffix
    never matches itself.

    Example (n_min = n_max = 2): tokens [5, 6, 7, 5, 6] index (5,6)->2, (6,7)->3, (7,5)->4; the
    suffix (5, 6) maps to position 2, so `lookup(k=3)` proposes tokens[2:5] = [7, 5, 6].
    """

    def __init__(self, n_min: int, n_max: int):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}, {n_max}")
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token after it

    def extend(self, context: list[int]) -> None:
        """Catch up with `context`, which must extend the tokens already indexed (a shorter context
        means a new conversation: the index is rebuilt)."""
        if len(context) < len(self.tokens):
            self.tokens, self._next = [], {}
        start = len(self.tokens)
        self.tokens.extend(context[start:])
        toks = self.tokens
        for i in range(max(start, 1), len(toks)):  # token i is known: index n-grams before it
            for n in range(self.n_min, min(self.n_max, i) + 1):
                self._next[tuple(toks[i - n : i])] = i

    def find(self, n_min: int | None = None) -> tuple[int, int]:
        """(position of the token that followed the longest matching suffix, that n); (0, 0) when
        nothing matches. n_min (default the index's) raises the shortest suffix accepted."""
        toks, lo = self.tokens, max(self.n_min, n_min or self.n_min)
        for n in range(min(self.n_max, len(toks)), lo - 1, -1):
            pos = self._next.get(tuple(toks[len(toks) - n :]))
            if pos is not None:
                return pos, n
        return 0, 0

    def lookup(self, k: int, n_min: int | None = None) -> tuple[list[int], int]:
        """Up to k tokens that followed the longest matching suffix, and that n (0: no match).

        The continuation stops at the end of the indexed tokens, so it may be shorter than k.
        n_min (default the index's) raises the shortest suffix accepted as a match.
        """
        pos, n = self.find(n_min)
        return (self.tokens[pos : pos + k], n) if n else ([], 0)


class NgramDrafter(Drafter):
    """Drafter proposing by prompt lookup over prompt + generated text.

    A fresh drafter per generation (the Engine builds one per request). Proposes fewer than k
    tokens when the matched continuation is short, and none when nothing matches: that round is a
    plain target step. Each proposal carries the suffix match length n (Proposal.match).

    Long matches propose long: a suffix match of at least `long_n` tokens (0: never) proposes up
    to max(k, long_k) tokens. A long match is a copy in progress (a quoted passage, a repeated
    list item), whose continuation is usually right for several tokens, while a one-token match is
    right ~40% of the time, so proposing one token on short matches and many on long ones beats
    any single length (docs/drafting.md).
    """

    method = "ngram"

    def __init__(self, n_min: int = 1, n_max: int = 8, long_n: int = 0, long_k: int = 1):
        self.index = NgramIndex(n_min, n_max)
        self.long_n, self.long_k = long_n, long_k

    def propose(self, context: list[int], k: int, key: mx.array | None = None) -> Proposal:
        return self.propose_min(context, k, None)

    def propose_min(
        self, context: list[int], k: int, n_min: int | None, long_k: int | None = None
    ) -> Proposal:
        """propose(), accepting only suffix matches of length >= n_min."""
        return self.lookup(context, k, n_min, long_k=long_k)

    def lookup(
        self,
        context: list[int],
        k: int,
        n_min: int | None,
        skip: int = 0,
        long_k: int | None = None,
    ) -> Proposal:
        """Index `context`, find its longest suffix match n and propose up to k tokens of the
        continuation (max(k, long_k) on a long match; `long_k` None: the drafter's own), past
        its first `skip` tokens."""
        self.index.extend(context)
        pos, n = self.index.find(n_min)
        if not n:
            return point_mass([], self.method)
        if self.long_n and n >= self.long_n:
            k = max(k, self.long_k if long_k is None else long_k)
        return point_mass(self.index.tokens[pos + skip : pos + skip + k], self.method, n)

    def capabilities(self) -> Capabilities:
        return Capabilities(behind=self)  # its lookup one token behind

    def propose_behind(
        self, context: list[int], k: int, n_min: int | None = None, long_k: int | None = None
    ) -> Proposal:
        """Up to k tokens for the positions after len(context), proposed while the token at
        len(context) is still being computed (pipelined plain steps, edgespec/loop.py): the
        continuation of the longest earlier match of context's suffix, past its first token,
        which is the match's guess for the token being computed. Empty when nothing matches (or
        k <= 0: a plain step).
        Example: indexed [5, 6, 7, 8, 5, 6] (n 2): the suffix (5, 6) was followed by 7, 8, 5, so
        propose_behind(k=2) = [8, 5], the guess for the two tokens after the coming 7."""
        if k <= 0:
            return point_mass([], self.method)
        return self.lookup(context, k, n_min, skip=1, long_k=long_k)


# A one-token suffix match is a weak guess next to a trained draft: hybrid wants >= 2 tokens.
HYBRID_MIN_MATCH = 2


class HybridDrafter(Drafter):
    """Drafter: n-gram lookup when the last >= min_match tokens occurred before, else the model.

    Each proposal names who made it (Proposal.method "ngram" or "draft"). A lookup proposes up to
    max(K, free_k) tokens (SpecConfig.ngram_k), or `lookup_k("ngram", free_k)` when an adaptive
    policy sizes lookups (AdaptiveK.lookup_k), and on a long match `long_k(ngram.long_k)`
    (AdaptiveK.long_k). `propose_free` is the lookup alone: the loop uses
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
        self.long_k: Callable[[int], int] | None = None  # a long match's length, when sized
        self._features = model.capabilities().features  # a feature draft's, handed on
        # Its model's reviews (acceptance.py, reviews), handed on.
        self._reviews = Capabilities.of(model).reviews

    def capabilities(self) -> Capabilities:
        """Free lookups, lookups one token behind and lookups an adaptive policy sizes;
        features and reviews when its model offers them."""
        features = self if self._features is not None else None
        return Capabilities(
            free=self, behind=self, features=features, lookups=self, reviews=self._reviews
        )

    def take_features(self, context: list[int], start: int, features: mx.array) -> None:
        """Hand the verify's features to the model (a feature or block draft)."""
        assert self._features is not None, "the hybrid's model reads no features"
        self._features.take_features(context, start, features)

    def guess(self, context: list[int]) -> tuple[int, int] | None:
        """The lookup's first token after `context` and its match length (None: no match)."""
        self.ngram.index.extend(context)
        tokens, n = self.ngram.index.lookup(1, self.min_match)
        return (tokens[0], n) if n else None

    def _lookup_len(self, k: int) -> int:
        return self.lookup_k("ngram", self.free_k) if self.lookup_k else max(k, self.free_k)

    def _long_len(self) -> int | None:
        return self.long_k(self.ngram.long_k) if self.long_k else None

    def propose_free(self, context: list[int], key: mx.array) -> Proposal:
        return self.ngram.propose_min(
            context, self._lookup_len(0), self.min_match, self._long_len()
        )

    def propose_behind(self, context: list[int], k: int) -> Proposal | None:
        """While drafting is off (K <= 0), the lookup one token behind
        (NgramDrafter.propose_behind); None when the policy wants the model (K > 0): the
        pipelined run ends so the model can draft from the full context."""
        if k > 0:
            return None
        return self.ngram.propose_behind(
            context, self._lookup_len(0), self.min_match, self._long_len()
        )

    def propose(self, context: list[int], k: int, key: mx.array) -> Proposal:
        # A lookup may propose more than the model's k: it costs no draft steps (the loop cuts
        # any proposal to the room left in the context window).
        prop = self.ngram.propose_min(
            context, self._lookup_len(k), self.min_match, self._long_len()
        )
        return prop if prop.size > 0 else self.model.propose(context, k, key)

    def commit(self, context: list[int]) -> None:
        self.ngram.commit(context)
        self.model.commit(context)  # keeps its cache a prefix of context (it may lag behind)
