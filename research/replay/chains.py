"""Chain rounds replayed: a real K policy (a rounds.Policy: `observe(Round)`, `decide() -> K`)
drives a simulated generation whose acceptance comes from a recorded Trace and whose times come
from a Profile. What is simulated is the loop's bookkeeping as the policy sees it (rounds.Chains,
loop.plain_run): K = 0 is a plain step; a hybrid's lookups go first when they match (sized by
the policy's lookup_k), also while the draft is off; a draft model catches up on the tokens
committed while it did not draft (a forward over the gap); a plain step is timed only inside a
run of them, a lookup queued behind a plain step not at all (Round.timed); while the draft model
is off and the policy reads reviews (AdaptiveK.review_due), a review over the gap, costing that
catch-up forward. Reviews and the K = 0 switch are the real policy's.

Methods: "draft" (the token draft), "ngram" (prompt lookup alone), "hybrid" (the default:
lookups first, the token draft otherwise), "block" (the block draft, one forward a round).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgespec.acceptance import Review
from edgespec.drafting.adaptive import AdaptiveK, FixedK
from edgespec.events import Round
from research.replay.profiles import Profile
from research.replay.traces import Trace

K_INIT, K_MAX, BLOCK_MAX = 4, 8, 7  # SpecConfig's k and k_max; the block's longest block
LONG_MATCH, LONG_K, HYBRID_MIN = 8, 5, 2  # SpecConfig.long_match, ngram_long_k; hybrid's match
FREE_K = 4  # the hybrid's lookup length when not sized: max(SpecConfig.k, ngram_k)
METHODS = ("draft", "ngram", "hybrid", "block")


@dataclass
class Outcome:
    """A replayed generation: tokens committed, seconds (in plain steps at 1K), Ks chosen."""

    tokens: int = 0
    seconds: float = 0.0
    chosen: list[int] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


WARM_CONTEXT = 64  # tokens of context of a warm-up's calibration (calibration.WARM_PROMPT)


def warm_verify(seed: Profile, length: int) -> float:
    """What a warm-up times for a verify of `length` rows under `seed`'s costs: at its short
    context (WARM_CONTEXT), the loop's overhead included."""
    return seed.hw.v(length, WARM_CONTEXT) + seed.hw.overhead


def adaptive(method: str, seed: Profile | None = None) -> AdaptiveK:
    """The policy the product builds for `method` (strategy.RoundFactory.k_policy); with `seed`,
    seeded as after `Engine.warm_up` (the chat app and the server): that profile's costs at a
    warm-up's short context, a plain step and every verify length included."""
    model = "draft" if method == "hybrid" else None
    # A block drafts at most block_size - 1 tokens: K is bounded there (as the block's K bound
    # does in the product), else K = 8 drafts 7 and v(9), never measured, is never corrected.
    k_max = BLOCK_MAX if method == "block" else K_MAX
    # drafter: the product's Drafter.method ("hybrid" for the hybrid, whose `model` decides)
    policy = AdaptiveK(K_INIT, k_max, model=model, long_match=LONG_MATCH, drafter=method)
    if seed is not None:
        draft = {
            "draft": seed.draft(1),
            "ngram": seed.hw.lookup,
            "block": seed.block(K_INIT) / K_INIT,
        }
        verify = {L: warm_verify(seed, L) for L in range(1, K_MAX + 2)}
        policy.seed({m: t for m, t in draft.items() if m != "block" or method == "block"}, verify)
    return policy


def fixed(k: int) -> FixedK:
    return FixedK(k)


class ChainReplay:
    """One generation of `method` over `trace` under `profile`, planned by `policy`."""

    def __init__(self, trace: Trace, profile: Profile, method: str, policy: Any):
        self.trace, self.profile, self.method, self.policy = trace, profile, method, policy
        self.i, self.model_at, self.plain_before = 0, 0, False
        self.out = Outcome()
        self.fresh: list[Round] = []
        self.reviews = method in ("draft", "hybrid") and callable(getattr(policy, "review", None))
        if self.reviews:
            policy.review_on()
        sized = isinstance(policy, AdaptiveK) and method == "hybrid"
        self.lookup_len = (lambda k: policy.lookup_k("ngram", FREE_K)) if sized else None
        self.long_len = (lambda: policy.long_k(LONG_K)) if sized else (lambda: LONG_K)

    def run(self) -> Outcome:
        while self.i < self.trace.size:
            for r in self.fresh:
                self.policy.observe(r)
            self.fresh.clear()
            k = self.policy.decide()
            self.out.chosen.append(k)
            self.round(k)
        return self.out

    # --- one round -------------------------------------------------------------------------
    def round(self, k: int) -> None:
        m = self.method
        if m in ("ngram", "hybrid"):
            lookup = self.lookup(k)
            if lookup is not None:
                self.commit(*lookup)
                return
        if k <= 0 or m == "ngram" and k > 0:
            self.plain()
        elif m == "block":
            d = min(k, BLOCK_MAX)
            n = self.trace.block_accepted(self.i, d)
            self.commit("block", d, n, k, self.profile.block(d), True)
        else:
            gap = max(self.i - self.model_at, 1)
            t = self.profile.draft(gap) + (k - 1) * self.profile.draft(1)
            n = self.trace.chain(self.i, k)
            self.model_at = self.i + min(n, k - 1)
            self.commit("draft", k, n, k, t, True)

    def lookup(self, k: int) -> tuple | None:
        """A lookup round's (method, d, accepted, k, t_draft, timed), or None: no lookup."""
        hybrid = self.method == "hybrid"
        if not hybrid and k <= 0:
            return None
        n, vals = self.trace.lookup_at(self.i, HYBRID_MIN if hybrid else 1)
        if not n:
            return None
        size = (self.lookup_len(k) if self.lookup_len else max(k, FREE_K)) if hybrid else k
        if size <= 0:
            return None
        if n >= LONG_MATCH:
            size = max(size, self.long_len())
        vals = vals[:size]
        if not vals:
            return None
        accepted = self.trace.accepted(self.i, vals)
        # queued one token behind a plain step: its time is not known apart (loop.plain_run)
        timed = not self.plain_before
        return "ngram", len(vals), accepted, max(k, 0), self.profile.hw.lookup, timed, n

    def plain(self) -> None:
        """A plain step (pipelined): timed inside a run of them; a review may follow."""
        p = self.profile
        rnd = Round(self.i, 0, 0, 0, 0.0, p.verify(1), self.method_name(), self.plain_before,
                    context=self.trace.context + self.i)  # fmt: skip
        self.advance(rnd, 1, p.verify(1))
        self.plain_before = True
        if self.i >= self.trace.size:
            return
        if self.reviews and self.policy.review_due():
            self.review()
        if self.reviews and self.method == "hybrid" and self.policy.lookup_review_due():
            n, vals = self.trace.lookup_at(self.i, HYBRID_MIN)
            if n and vals:
                value = float(self.trace.passes(self.i, 0, vals[0]))
                self.policy.review(Review("ngram", (value,), n))

    def review(self) -> None:
        """What the draft model would have accepted over the positions it missed, read from one
        catch-up forward (acceptance.py, reviews): 1 / 0 at T = 0, beta at T > 0."""
        t, start = self.trace, self.model_at
        if self.i - start < 1:
            return
        values = tuple(
            float(t.draft[j] == 0) if t.greedy else t.draft[j] / 255 for j in range(start, self.i)
        )
        self.out.seconds += self.profile.draft(self.i - start)
        self.model_at = self.i
        self.policy.review(Review("draft", values))

    def method_name(self) -> str:
        return {"hybrid": "draft", "ngram": "ngram"}.get(self.method, self.method)

    def commit(self, method, d, n, k, t_draft, timed, match=0) -> None:
        p = self.profile
        t_verify = p.verify(d + 1)
        rnd = Round(self.i, d, n, max(k, d), t_draft, t_verify, method, timed, match,
                    context=self.trace.context + self.i)  # fmt: skip
        self.advance(rnd, n + 1, t_draft + t_verify)
        self.plain_before = False

    def advance(self, rnd: Round, tokens: int, seconds: float) -> None:
        tokens = min(tokens, self.trace.size - self.i)
        self.i += tokens
        self.out.tokens += tokens
        self.out.seconds += seconds
        self.fresh.append(rnd)


def replay(trace: Trace, profile: Profile, method: str, policy: Any) -> Outcome:
    """One generation of `method` over `trace` under `profile`, planned by `policy`."""
    return ChainReplay(trace, profile, method, policy).run()


def plain(trace: Trace, profile: Profile) -> Outcome:
    """Plain decoding: one step a token."""
    return Outcome(trace.size, trace.size * profile.verify(1))
