"""Reviews at plain steps, for a policy that reads them (AdaptiveK) over a drafter that offers them
(acceptance.py, reviews: how well an idle draft, or a hybrid's switched-off lookups, would have
drafted the tokens committed meanwhile). Built per generation (Reviewer.of) and handed to the chain
rounds (loop.Chains), which show it each plain step; the loop itself knows nothing of reviews.

Per plain step (`plain_step`): the target's probability of the token it sampled is kept by
position (T > 0), and while the policy has the lookups off their guess is reviewed at once (host
only). Between two steps whose forwards are queued (`queue`), when the policy says a review is due,
the draft model's review forward goes behind the queued step; its values are read with that step
(`read`), so a review never holds up a run of plain steps.
"""

from __future__ import annotations

from typing import Protocol, cast

from edgespec.acceptance import PendingReview, Review
from edgespec.drafting.adaptive import LOOKUP
from edgespec.drafting.base import Capabilities, Drafter, Reviews, SizedLookups


class Watch(Protocol):
    """What sees a generation's plain steps (loop.Chains.read): a Reviewer, or NO_REVIEWS."""

    probs: bool  # plain steps keep the target's probability of their token

    def plain_step(self, context: list[int], token: int, px: float | None) -> None:
        """A plain step sampled `token` after `context` (not yet committed), with probability px."""
        ...

    def queue(self, context: list[int]) -> None:
        """A step's forward is queued after `context`: work may be queued behind it."""
        ...

    def read(self) -> bool:
        """The queued step was read back: read what was queued behind it; whether anything was
        (that step's interval then holds it too, so its time is not a step's)."""
        ...


class NoReviews:
    """A Watch that does nothing: no policy reads reviews, or no drafter offers them."""

    probs = False

    def plain_step(self, context: list[int], token: int, px: float | None) -> None:
        pass

    def queue(self, context: list[int]) -> None:
        pass

    def read(self) -> bool:
        return False


NO_REVIEWS = NoReviews()


class Reviewing(Protocol):
    """A policy that reads reviews in place of probe rounds: AdaptiveK."""

    def review_on(self) -> None: ...

    def review(self, r: Review) -> None: ...

    def review_due(self) -> bool: ...

    def lookup_review_due(self) -> bool: ...


class Reviewer:
    """Reviews of `reviews` (the draft model) and of `lookups` (a hybrid's, or None) for `policy`,
    which reads each review as soon as it is read back (before its next decision, as it reads
    rounds)."""

    probs = True

    def __init__(self, policy: Reviewing, reviews: Reviews, lookups: SizedLookups | None):
        self.policy, self.reviews, self.lookups = policy, reviews, lookups
        policy.review_on()
        self._px: dict[int, float] = {}  # plain steps' target probabilities, by position
        self._pending: PendingReview | None = None

    @staticmethod
    def of(policy: object, drafter: Drafter) -> Reviewer | NoReviews:
        """The reviews `policy` reads of `drafter`: a Reviewer where the policy reads reviews and
        the drafter offers them, else NO_REVIEWS."""
        caps = Capabilities.of(drafter)
        if caps.reviews is None or not callable(getattr(policy, "review", None)):
            return NO_REVIEWS
        return Reviewer(cast(Reviewing, policy), caps.reviews, caps.lookups)

    def plain_step(self, context: list[int], token: int, px: float | None) -> None:
        if px is not None:
            self._px[len(context)] = px
        if self.lookups is not None and self.policy.lookup_review_due():
            # a lookup is a point mass at its guess: the value is whether it was the token
            guess = self.lookups.guess(context)
            if guess is not None:
                self.policy.review(Review(LOOKUP, (float(guess[0] == token),), guess[1]))

    def queue(self, context: list[int]) -> None:
        if self.policy.review_due():
            self._pending = self.reviews.review(context, self._px)
            self._px.clear()

    def read(self) -> bool:
        pending, self._pending = self._pending, None
        if pending is None:
            return False
        self.policy.review(pending.done())
        return True
