"""What a drafter is: the Proposal it makes, the small base class the loop talks to, and the
capabilities a drafter may add.

A drafter needs only `method`, `propose(context, k, key)` and `commit(context)`: the loop
(edgespec/loop.py) calls `propose` before each round and `commit` after it. A drafter may also
offer capabilities, each a protocol below, which it names itself in `capabilities()` (asked once
per generation, `Capabilities.of`); nothing else of a drafter is read:
- FreeLookups, `propose_free(context, key)`: tokens that cost next to nothing (an n-gram lookup),
  made in rounds where the K policy chose K = 0.
- LooksBehind, `propose_behind(context, k)`: point-mass proposals for the positions after
  len(context) + 1, made while the token at len(context) is still being computed (pipelined plain
  steps, loop.Chains.behind). None ends the pipelined run.
- FeatureInput, `take_features(context, start, features)`: the target's top hidden states of each
  round's committed positions start .. start + len(features) - 1, for a feature draft
  (edgespec/architectures/eagle.py). A drafter that wraps another offers it when the inner one
  does (HybridDrafter: its `take_features` hands them on).
- SizedLookups: a lookup in front of a draft model (HybridDrafter), whose lookups an adaptive K
  policy sizes (edgespec/strategy.py).
- Reviews, `review(context, probs)`: while an adaptive policy has the draft model off, what it
  would have accepted over the tokens committed meanwhile (edgespec/acceptance.py, reviews), read
  from one catch-up forward, without a verify row; drafting/review.py's Reviewer asks for them
  at plain steps, for a policy that reads them (the loop never does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx

from edgespec.acceptance import PendingReview


@dataclass(frozen=True)
class Proposal:
    """A drafter's guess for the next tokens.

    tokens [d] int32 (may be lazy); q [d, V] the warped draft distributions they were drawn from,
    or None for point masses (a deterministic proposal: an n-gram lookup, or any drafter at
    temperature 0). `method` names who made it ("draft": a draft model, "ngram": a lookup) and
    `match` the n-gram suffix length behind a lookup (0 otherwise); both go into Round events.
    """

    tokens: mx.array
    q: mx.array | None = None
    method: str = "draft"
    match: int = 0

    @property
    def size(self) -> int:
        """Drafted tokens d (a shape, never a device read)."""
        return int(self.tokens.shape[0])

    def cut(self, room: int) -> Proposal:
        """At most `room` tokens (the room left in the context window). [7, 8, 9].cut(2) -> [7, 8]."""
        if self.size <= room:
            return self
        q = None if self.q is None else self.q[:room]
        return Proposal(self.tokens[:room], q, self.method, self.match)


# A chain plan (K) below 0: a plain step that looks nothing up either (a drafter's free lookups,
# and the ones one token behind, are skipped). A caller asks for it where a lookup's rows cost
# more than they could save (the server, for requests stepping plainly together:
# edgespec/server/mode.py).
PLAIN_ONLY = -1


def no_proposal(method: str = "draft") -> Proposal:
    """K = 0: nothing drafted, the round is a plain target step."""
    return Proposal(mx.array([], dtype=mx.int32), None, method, 0)


def point_mass(tokens: list[int], method: str, match: int = 0) -> Proposal:
    """A deterministic proposal of host tokens (q = None: each has draft probability 1)."""
    return Proposal(mx.array(tokens, dtype=mx.int32), None, method, match)


class Drafter:
    """Who proposes tokens. Subclasses implement `propose`, and `commit` when they keep state.

    `method` is reported for rounds that drafted nothing (a proposal names its own method).
    """

    method = "draft"

    def propose(self, context: list[int], k: int, key: mx.array) -> Proposal:
        """Propose up to k tokens to follow `context` (all committed tokens); fewer (even none:
        the round is then a plain target step) when the drafter has no good guess. `key` seeds any
        sampling: draw `uniforms(key, k)` to stay in step with the numpy reference."""
        raise NotImplementedError

    def commit(self, context: list[int]) -> None:
        """Called after every round with the committed context: roll back anything past it."""

    def capabilities(self) -> Capabilities:
        """What this drafter offers beyond propose / commit (none unless a subclass says so)."""
        return Capabilities()


class FreeLookups(Protocol):
    """A drafter with a proposal that costs next to nothing, for a round where K = 0 was chosen."""

    def propose_free(self, context: list[int], key: mx.array) -> Proposal: ...


class LooksBehind(Protocol):
    """A drafter that can keep a pipelined plain run going (see the module docstring)."""

    def propose_behind(self, context: list[int], k: int) -> Proposal | None: ...


class SizedLookups(Protocol):
    """A lookup in front of a draft model whose lookups an adaptive K policy sizes: the policy
    chooses K for `model` and sets `lookup_k` (AdaptiveK.lookup_k) for the lookups and
    `long_k` (AdaptiveK.long_k) for those from a long match."""

    model: Drafter
    lookup_k: Callable[[str, int], int] | None
    long_k: Callable[[int], int] | None

    def guess(self, context: list[int]) -> tuple[int, int] | None:
        """The lookup's guess for the token after `context` and its match length, None without
        a match (host only): what a lookup switched off would have proposed, for a review."""
        ...


class Reviews(Protocol):
    """A draft model that can say how well it would have drafted the tokens committed while it
    was off (acceptance.py, reviews): `probs` maps positions to the target's probability of the
    token sampled there (plain steps at T > 0)."""

    method: str

    def review(self, context: list[int], probs: dict[int, float]) -> PendingReview | None: ...


class FeatureInput(Protocol):
    """A feature draft: the loop hands it the target's features of committed positions start.."""

    def take_features(self, context: list[int], start: int, features: mx.array) -> None: ...


@dataclass(frozen=True)
class Capabilities:
    """What a drafter offers beyond propose / commit (`Drafter.capabilities`), looked up once per
    generation. Each field is the object to call (usually the drafter itself), or None.

    Example: Capabilities.of(NgramDrafter()) has `behind` (its lookup one token behind) and
    neither `free` nor `features`; a drafter with only method, propose and commit has none.
    """

    free: FreeLookups | None = None
    behind: LooksBehind | None = None
    features: FeatureInput | None = None
    lookups: SizedLookups | None = None
    reviews: Reviews | None = None

    @classmethod
    def of(cls, drafter: Drafter) -> Capabilities:
        """The drafter's own `capabilities()`; none for a drafter without that method (one
        written to the minimal protocol: method, propose, commit; docs/library.md)."""
        offers = getattr(drafter, "capabilities", None)
        return offers() if offers is not None else cls()
