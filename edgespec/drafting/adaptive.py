"""Adaptive K: before each round, pick the K that maximises expected tokens per second.

Closed form (Leviathan et al.): with per-token acceptance alpha, a round drafting K tokens commits
E[tokens](K) = (1 - alpha^(K+1)) / (1 - alpha) on average, and takes T(K) = K * c + v(K + 1)
seconds, where c is one draft step and v(L) a target forward verifying L tokens (the pending token
plus K drafts). K* = argmax_K E[tokens](K) / T(K) over 0..k_max, where K = 0 is a plain target step
(1 token in v(1) seconds): a draft that does not pay for itself is switched off rather than allowed
to slow decoding down. While K = 0 wins, a probe round drafts every few rounds (8, doubling to 64
while drafting keeps losing) so the estimates can notice the draft becoming useful again. The loop
runs such K = 0 rounds pipelined (edgespec/loop.py), as fast as plain decoding; the policy then
decides a round before the previous one is read back. The loop hands it every round once, in order
(`observe`, rounds.Plans), and asks for each K (`decide`).

AdaptiveK keeps the three inputs as running estimates from the Round events it is fed:
alpha as an exponentially decayed truncated-geometric MLE (accepted / (accepted + rejections)),
c as the median of the last few t_draft / drafted (leaving out the catch-up after K = 0 rounds),
and v(L) as the median of the last few verifies of each L where L was measured, a fitted line
elsewhere (leaving out rounds whose time overlapped a neighbour's, Round.timed). Medians,
because one stall (a kernel compiled on first use on a GPU, a page fault, a busy core) is not the
cost of drafting: folded into an average it kept a good draft switched off for dozens of rounds.
Measured points rather than the line alone, because a GPU's verify cost is not a line (on MLX's
CUDA backend a 3-token forward costs about one step and a 4-token one far more; docs/gpu.md). The choice uses only measured costs and past outcomes, never the target's view of the
coming tokens, so exactness holds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from edgespec.acceptance import Review
from edgespec.drafting.costs import (
    COST_WINDOW,
    Probes,
    RecentMedian,
    Timings,
    best_k,
    fit_verify_line,
    verify_curve,
)
from edgespec.events import Round, expected_tokens_per_round

PRIOR_ALPHA = 0.5  # before any round: a coin flip, worth PRIOR_WEIGHT observations
PRIOR_WEIGHT = 2.0
ALPHA_DECAY = 0.9  # per-round decay of the acceptance counts (~10 rounds of memory)
# The policy takes the shortest round predicted within this share of the best: its inputs are
# medians of a few noisy timings, and on a 2-core CPU (verify of 2 tokens ~1 step, of 4 ~1.65)
# K = 1..4 all come within a few % of each other at alpha ~0.8, where a wrong longer K lost up to
# 10% against K = 1 (math_reasoning, one prompt) while the closed form promised a gain.
TIE_TOLERANCE = 0.05
LOOKUP = "ngram"  # the method of a hybrid drafter's lookups (drafting/ngram.py HybridDrafter)
LONG = f"{LOOKUP}-long"  # its lookups from a long match (AdaptiveK.long_match), counted apart
# Methods whose drafting is one forward a round whatever K (a block draft,
# architectures/block_model.py): their cost is that forward's, d(K), measured per K (a line
# fitted between, as v(L); nearly flat on a GPU, but on a CPU the output head over the
# vocabulary grows with K): T(K) = d(K) + v(K + 1).
ROUND_COST = ("block",)
# Draft timings a method needs before the policy may switch it off: a median of fewer is one
# timing, and a fresh engine's first rounds hold compiles (each new shape, on first use).
OFF_AFTER = COST_WINDOW // 2 + 1
# With reviews (acceptance.py, reviews) the off state reads the draft's acceptance from plain steps
# instead of probe rounds: a review after REVIEW_EVERY plain steps, the gap doubling to
# REVIEW_MOST while the draft stays off (a review is a draft forward over the gap's tokens).
REVIEW_EVERY, REVIEW_MOST = 8, 32
# A review is a draft forward over the gap's tokens; where that costs more than this share of
# the plain steps it covers (a dear draft, or a machine whose forward grows fast with its rows:
# research/replay/, an Apple M4 Pro with a draft at 0.6 of a step, where reviews alone cost
# ~12% of an answer the draft never drafted), it waits until the gap makes it cheap enough, or
# never runs: the draft then stays off for the answer. A probe round (no reviews: a block draft,
# lookups alone) is priced the same way (AdaptiveK._probe_pays).
REVIEW_SHARE = 0.05
# A price check: while drafting, a plain step is never timed, and its price is a guess from the
# shortest verify (verify_curve), which is off by up to ~1.9x either way: on an Apple M1 / M2 a
# 2-token verify costs ~1.7 steps (a plain step then looks 1.57x dearer than it is, and a draft
# that loses to plain decoding stays on), on a CPU at 32K tokens a row's attention does the
# same. So once per generation, where the decision could hang on it (drafting predicted to win
# by less than PRICE_EDGE), PRICE_STEPS plain steps are run and timed (a pipelined run times the
# middle ones), at most PRICE_TRIES times while lookups take those rounds instead; never where
# a calibration (Engine.warm_up: the chat, the server, the bench) priced a plain step at a
# context whose costs this run's still match (SEED_TRUST).
# (research/replay/: the cost-profile replay.)
PRICE_STEPS, PRICE_EDGE, PRICE_TRIES = 4, 2.0, 2
# A calibration's plain step is trusted (no price check) while this run's verifies cost at most
# this many times the calibration's.
SEED_TRUST = 1.25


@dataclass
class DrafterEstimate:
    """Running estimates for one drafting method: decayed acceptance counts and step cost."""

    accepted: float = PRIOR_ALPHA * PRIOR_WEIGHT
    trials: float = PRIOR_WEIGHT
    step_costs: RecentMedian = field(default_factory=RecentMedian)
    per_round: bool = False  # the cost is per round (ROUND_COST), not per drafted token
    # Per drafted position, for per_round methods: decayed rounds that drafted it with the
    # positions before it accepted (tries), and those that accepted it too (passes).
    tries: list[float] = field(default_factory=list)
    passes: list[float] = field(default_factory=list)
    round_costs: dict[int, RecentMedian] = field(default_factory=dict)  # per_round: K -> seconds

    @property
    def alpha(self) -> float:
        return self.accepted / self.trials

    @property
    def alpha_upper(self) -> float:
        """alpha plus one standard error (the decayed trials as the sample size), at most 1: how
        good the draft may still be, given the little the last rounds showed."""
        a = self.alpha
        return min(1.0, a + math.sqrt(a * (1 - a) / self.trials))

    @property
    def draft_cost(self) -> float | None:
        """Seconds per drafted token, or per round where `per_round` (median of the recent
        rounds), None before one was timed."""
        return self.step_costs.value

    @property
    def timings(self) -> int:
        """How many draft timings the cost's median rests on (at most COST_WINDOW)."""
        return len(self.step_costs.samples)

    def observe(self, r: Round, timed: bool = True, bound: bool = False) -> None:
        """Fold one round with r.drafted > 0: r.accepted successes, one failure if any rejected.
        timed=False keeps its time out of the cost, except with bound=True (a draft that had to
        catch up first, which only adds time) where it is below the current estimate: such a
        round bounds the true cost from above, and folding it in lets probes bring down an
        estimate inflated by compiles or stalls (left out, they never could: the draft of a
        fresh engine stayed off for a whole answer)."""
        failure = 1.0 if r.accepted < r.drafted else 0.0
        self.accepted = ALPHA_DECAY * self.accepted + r.accepted
        self.trials = ALPHA_DECAY * self.trials + r.accepted + failure
        cost = r.t_draft if self.per_round else r.t_draft / r.drafted
        known = self.draft_cost
        if timed or (bound and known is not None and cost < known):
            self.step_costs.add(cost)
        if self.per_round:
            self._count_positions(r)
            if timed:
                self.round_costs.setdefault(r.drafted, RecentMedian()).add(r.t_draft)

    def fold(self, values: tuple[float, ...]) -> None:
        """A review's values (acceptance.py, reviews), one trial each: a value is the chance
        that a draft there would have passed, in place of a round's accepted-or-not."""
        for value in values:
            self.accepted = ALPHA_DECAY * self.accepted + value
            self.trials = ALPHA_DECAY * self.trials + 1.0

    def round_cost(self) -> Callable[[int], float]:
        """d(K), a per_round method's draft forward for K tokens: the recent median where K was
        measured, else the line fitted to those (fit_verify_line's, with its prior slope while
        one K is known). Example: {4: 0.10} -> d(8) = 0.1 / 1.3 * 1.7 = 0.131."""
        means = {k: m.value for k, m in self.round_costs.items() if m.value is not None}
        if not means:  # a seed's cost only (a calibration's, per drafted token), no round timed
            per_token = self.draft_cost or 0.0
            return lambda k: per_token * k
        a, b = fit_verify_line(means)
        return lambda k: means[k] if k in means else a + b * (k - 1)

    def _count_positions(self, r: Round) -> None:
        grow = max(0, r.drafted - len(self.tries))
        self.tries = [ALPHA_DECAY * t for t in self.tries] + [0.0] * grow
        self.passes = [ALPHA_DECAY * p for p in self.passes] + [0.0] * grow
        for i in range(min(r.drafted, r.accepted + 1)):
            self.tries[i] += 1.0
            self.passes[i] += float(i < r.accepted)

    def expected(self, k: int) -> float:
        """E[tokens] of a round drafting k, from the acceptance per position (a block's later
        positions are accepted less often than its first): 1 + the sum over i <= k of the
        product of the rates of positions 1..i, each shrunk towards alpha (PRIOR_WEIGHT); a
        position never tried takes the last rate. Rates .9, .5 -> k = 2: 1 + .9 + .45 = 2.35."""
        total, reach, rate = 1.0, 1.0, self.alpha
        for i in range(k):
            if i < len(self.tries):
                weight = self.tries[i] + PRIOR_WEIGHT
                rate = (self.passes[i] + self.alpha * PRIOR_WEIGHT) / weight
            reach *= rate
            total += reach
        return total


class AdaptiveK:
    """K policy for loop.speculate (a rounds.Policy: `observe(round)`, `decide() -> K`),
    learning online from Round events.

    Estimates are kept per drafting method (Round.method), because an n-gram lookup and a draft
    model differ in both cost and acceptance; the verify cost belongs to the target and is shared.
    The choice for the next round uses the estimates of `model` when given (a hybrid drafter's
    draft model: K is its K, and the lookup sizes its own proposals with `lookup_k`), else of the
    method that drafted the last round. Until both costs of that method have been measured it
    returns k_init. allow_plain: K = 0 (no drafting) may be chosen, with probe rounds (the best
    K >= 1) after PROBE_EVERY.. PROBE_MAX plain rounds (costs.Probes, the tree policy's too).

    Why a hybrid needs `model`: choosing from whoever drafted last, a round after an accepted
    lookup (alpha ~0.9, no draft cost: K = k_max) gave that K to the draft model whenever the next
    lookup missed, and adaptive hybrid trailed fixed K=1 hybrid.
    """

    def __init__(
        self,
        k_init: int = 4,
        k_max: int = 8,
        allow_plain: bool = True,
        model: str | None = None,
        long_match: int = 0,
        drafter: str | None = None,
        per_round: tuple[str, ...] = ROUND_COST,
    ):
        if not 1 <= k_init <= k_max:
            raise ValueError(f"need 1 <= k_init <= k_max, got {k_init}, {k_max}")
        self.k_init, self.k_max, self.allow_plain = k_init, k_max, allow_plain
        self.model = model
        # The method of the drafter's rounds (Drafter.method), for its estimates before a round
        # drafted: a seeded first round (`_first`) and the reviews' price while it is off.
        self.drafter = drafter
        self.per_round = per_round  # methods that draft in one forward a round (ROUND_COST)
        # Rounds proposed by n-gram matches at least this long (Round.match; 0: none) propose a
        # fixed long continuation (NgramDrafter.long_k) and are accepted far more often than
        # the rest: they are counted apart ("<method>-long"), so that they do not talk the
        # policy into long proposals for short matches.
        self.long_match = long_match
        self.estimates: dict[str, DrafterEstimate] = {}
        self.verify_costs: Timings[int] = Timings()  # verified tokens L -> recent seconds
        self._seeded: dict[int, float] = {}  # verified tokens L -> a calibration's seconds
        self.chosen: list[int] = []
        self._method: str | None = None  # who drafted the latest round that drafted
        self._previous: str | None = ""  # who drafted the last round ("": none yet, None: nobody)
        self._on = True  # drafting is on by the policy's own choice (not a probe)
        self._probes = Probes()
        self._observed = False  # a round was observed: the first round's K is k_init
        self._lookups_on = True  # a hybrid's lookups pay (or probe) this round: lookups_pay
        self._long_on = True  # and its long matches' (long_k)
        self._lookup_probes = Probes()
        self._reviews, self._idle, self._review_gap = False, 0, REVIEW_EVERY  # review_due
        self._price_tries, self._pricing = PRICE_TRIES, 0  # price checks left, steps left

    def seed(self, draft_costs: dict[str, float], verify_costs: dict[int, float]) -> None:
        """Start from saved costs (a calibration: seconds per drafted token per method, seconds
        per verify of L tokens), one timing each, soon outvoted by this run's own.

        Example: seed({"draft": 0.01}, {1: 0.05, 5: 0.08}) makes choose("draft") use c = 0.01
        and v(5) = 0.08 from the first round, instead of k_init until both were timed.
        The verify costs are kept apart from the run's own (verify_means): a calibration is
        made on a short prompt, and at a long context its lengths the run never tried priced
        long verifies as if the context were short."""
        for method, cost in draft_costs.items():
            self.estimates.setdefault(
                method, DrafterEstimate(per_round=method in self.per_round)
            ).step_costs.add(cost)
        self._seeded.update(verify_costs)

    def observe(self, r: Round) -> None:
        """Learn from one committed round (each once: rounds.Plans sees to it)."""
        self._observed = True
        if r.drafted > 0:
            self._method = r.method
        est = self._estimate(r.method, r.match)
        if r.drafted > 0:
            # After K = 0 rounds (or a lookup's) a draft model first catches up on every token
            # committed meanwhile: a longer forward, not the cost of drafting. Counted, it kept
            # K = 0 chosen, and at 8K tokens (a hybrid's lookups) put c at 1.5-2.5x a step's.
            catch_up = r.timed and self._previous in (None, LOOKUP) and r.method != LOOKUP
            est.observe(r, timed=r.timed and not catch_up, bound=catch_up)
        self._previous = r.method if r.drafted > 0 else None
        if not r.timed:
            # A pipelined plain step and the lookup queued behind it: the host, starved by the
            # lookup's forward, read the step late, so the step looked dear and the lookup cheap
            # (on a 2-core CPU a 4-token lookup looked cheaper than a plain step) and adaptive
            # lookups grew too long. Only their sum is known; leave both out.
            return
        length = r.drafted + 1  # the pending token + the drafts
        self.verify_costs.add(length, r.t_verify)

    def review_on(self) -> None:
        """The drafter reviews: while the draft model is off, reviews instead of probe rounds."""
        self._reviews = True

    def review_due(self) -> bool:
        """Whether a review should run now (asked once per plain step; True resets the count):
        the draft model is off and the gap's plain steps (REVIEW_EVERY, doubling to REVIEW_MOST
        while it stays off) were chosen since the last one."""
        if not self._reviews or self._on or self._idle < self._review_gap:
            return False
        if not self._review_pays(self._idle):
            return False
        self._idle, self._review_gap = 0, min(2 * self._review_gap, REVIEW_MOST)
        return True

    def _review_pays(self, gap: int) -> bool:
        """Whether a review over `gap` tokens costs at most REVIEW_SHARE of the gap's plain
        steps: the draft's cost a token (c) times the target's growth with the rows,
        v(gap) / v(1) (a draft forward of many rows grows as the target's does), against
        gap * v(1). True while either cost is unknown. Example: c = 0.6, v(1) = 1, v(32) = 8.6
        -> 5.2 against 1.6: no review."""
        args = self._inputs(self._deciding)
        if args is None:
            return True
        _, c, verify, _ = args
        one = verify(1)
        return c * verify(gap) / one <= REVIEW_SHARE * gap * one

    def lookup_review_due(self) -> bool:
        """Whether a hybrid's lookups are off (lookups_pay) and to be reviewed at plain steps."""
        off = not (self._lookups_on and self._long_on)
        return self._reviews and self.model is not None and off

    def review(self, r: Review) -> None:
        """Fold a review's values into its method's acceptance estimate (a long match's lookup:
        the long matches'), one trial each."""
        self._estimate(r.method, r.match).fold(r.values)

    def _estimate(self, method: str, match: int) -> DrafterEstimate:
        """The estimates of `method`'s rounds (a lookup from a long match: the long matches')."""
        long = self.long_match > 0 and match >= self.long_match
        name = f"{method}-long" if long else method
        return self.estimates.setdefault(name, DrafterEstimate(per_round=method in self.per_round))

    @property
    def verify_means(self) -> dict[int, float]:
        """Verified tokens L -> the median of its recent verify seconds; a length only the seed
        has (a calibration's, `seed`) at its seeded cost scaled by the median ratio of this
        run's costs to the seed's over the lengths both have (a longer context costs more per
        forward), 1 before any. Example: seeded {2: 1.0, 8: 2.0}, measured {2: 3.0} ->
        {2: 3.0, 8: 6.0}.

        Where this run's costs have left the seed's (the ratio above SEED_TRUST: a longer
        context) and two lengths or more are shared, a length only the seed has is priced by
        seed_and_rows instead: the seed scaled plus a cost a row. At a long context on a CPU
        each row's attention costs a good part of a step, so the costs grow with the rows far
        more than the short prompt's shape says, and the scaled seed priced a plain step at 32K
        about three times its cost (research/replay/, the xeon profile: a draft that can hardly
        pay drafted for half an answer). A line through this run's own costs alone priced the
        long verifies too dear on this project's CPU at 4K (K came out short, the default lost
        ~13% at T = 0.7; docs/measurements/2026-12-07-policy-and-checks.md)."""
        return seeded_means(self._seeded, self.verify_costs.medians())

    def _inputs(
        self, method: str | None
    ) -> tuple[float, float, Callable[[int], float], int] | None:
        """best_k's (alpha, draft cost, verify curve, k_max) for `method`; None until its draft
        cost and a verify have been measured."""
        est = self.estimates.get(method) if method is not None else None
        if est is None or not (self.verify_costs or self._seeded):
            return None
        # A lookup costs next to nothing (a dict read): unpriced, it is free. Its rounds behind
        # plain steps are never timed (loop.plain_run), and with the draft model off from the
        # start no other lookup ran: unpriced, lookups_pay let them all run at full length,
        # 4-token verifies at long contexts where one costs several plain steps.
        cost = 0.0 if est.draft_cost is None and method in (LOOKUP, LONG) else est.draft_cost
        if cost is None:
            return None
        verify = verify_curve(self.verify_means)
        if est.per_round:  # one draft forward a round: T(K) = d(K) + v(K + 1), a plain step v(1)
            d = est.round_cost()
            return est.alpha, 0.0, lambda n: verify(n) + (d(n - 1) if n > 1 else 0.0), self.k_max
        return est.alpha, cost, verify, self.k_max

    def choose(self, method: str | None) -> int:
        args = self._inputs(method)
        if args is None:
            return self.k_init
        est = self.estimates[method]  # type: ignore[index]
        # Off only on a median of several draft timings: never on the first round's compile.
        may_stop = self.allow_plain and (est.timings >= OFF_AFTER or not self._on)
        tokens = est.expected if est.per_round else None
        k = best_k(*args, k_min=0 if may_stop else 1, tolerance=TIE_TOLERANCE, expected=tokens)
        if k == 0 and self._on:
            # Switching the draft off: only if plain still wins at the optimistic alpha. Off, its
            # acceptance is seen only in rare probes, so one unlucky streak (alpha's estimate
            # remembers ~10 rounds) kept a draft that pays ~10% off for a whole answer. (A probe
            # does not switch it back on: only the estimate itself does.)
            k = best_k(est.alpha_upper, *args[1:], k_min=0, tolerance=TIE_TOLERANCE)
        was_on, self._on = self._on, k > 0
        if k > 0:
            self._probes.won()
            return k
        if self._reviews:  # reviews, not probe rounds, keep alpha's estimate fresh while off
            self._reviewed_off(was_on)
            return 0
        # the probe's K, worked out only once a probe is due (not at every plain round)
        probe = partial(best_k, *args, k_min=1, tolerance=TIE_TOLERANCE, expected=tokens)
        if not self._probes.probe(lambda rounds: self._probe_pays(args, probe(), tokens, rounds)):
            return 0
        return probe()

    @staticmethod
    def _probe_pays(
        args: tuple[float, float, Callable[[int], float], int],
        k: int,
        expected: Callable[[int], float] | None,
        rounds: int,
    ) -> bool:
        """Whether a probe drafting k, after `rounds` plain rounds, is predicted to lose at most
        REVIEW_SHARE of their plain steps, as a review must: its time in plain steps less the
        tokens it is expected to commit. A probe of a dear draft on a machine whose verify grows
        fast with its rows (research/replay/: a block draft at 0.6 of a step on an Apple M1 / M2,
        a probe losing ~1.5 steps every 8-16) waits for a longer gap (Probes.probe: at most its
        longest). Example: c = 0.2, v(1) = 0.1, v(2) = 0.105, alpha 0: 2.05 steps lost, a probe
        after 41 plain rounds."""
        alpha, c, verify, _ = args
        made = expected(k) if expected else expected_tokens_per_round(alpha, k)
        loss = (k * c + verify(k + 1)) / verify(1) - made
        return loss <= REVIEW_SHARE * rounds

    @property
    def _deciding(self) -> str | None:
        """Whose estimates choose K: the hybrid's draft model, else the latest drafting round's
        method, else the drafter's (`drafter`) before one drafted."""
        return self.model or self._method or self.drafter

    def decide(self) -> int:
        """The next round's K (recorded in `chosen`)."""
        method = self._deciding
        if not self._observed:
            k = self._first(method) if self._seeded and method is not None else self.k_init
        else:
            k = 0 if self._price_check(method) else self.choose(method)
        self.chosen.append(k)
        if self.model is not None:
            self._lookups_on = self.lookups_pay(LOOKUP)
            self._long_on = self.long_k(1) > 0
        return k

    def _first(self, method: str) -> int:
        """A seeded policy's first round: k_init, unless the calibration's costs say plain steps
        win even at the optimistic acceptance (alpha_upper of the prior, ~0.85): then K = 0, the
        draft off from the start, its acceptance read by reviews or priced probes. On an Apple
        M1 / M2 (a 2-token verify ~1.7 steps) a draft at 0.6 of a step lost its first round of
        every answer (research/replay/). Never fewer than k_init otherwise: a first long round
        shows a good draft's acceptance sooner, and a first round from the seed's choice at the
        prior's acceptance lost up to 2% where drafting pays (the h100 profile at 8K)."""
        args = self._inputs(method)
        if args is None or not self.allow_plain:
            return self.k_init
        alpha = self.estimates[method].alpha_upper
        if best_k(alpha, *args[1:], k_min=0, tolerance=TIE_TOLERANCE) > 0:
            return self.k_init
        self._on = False
        if self._reviews:
            self._reviewed_off(was_on=True)
        return 0

    def _reviewed_off(self, was_on: bool) -> None:
        """One plain round of a draft that is off and read by reviews (review_due): the gap
        restarts at REVIEW_EVERY where it just went off."""
        if was_on:
            self._idle, self._review_gap = 0, REVIEW_EVERY
        self._idle += 1

    def _price_check(self, method: str | None) -> bool:
        """Whether this round is a step of a price check (PRICE_STEPS): no plain step timed in
        this generation yet nor seeded by a calibration, the draft's cost measured (OFF_AFTER
        timings) and drafting predicted to beat a plain step, but by less than PRICE_EDGE. The
        draft stays on meanwhile (no reviews, no probes: the check is not the policy switching
        it off)."""
        if self._pricing > 0:
            self._pricing -= 1
            return True
        if not self._price_tries or not self.allow_plain:
            return False
        # A plain step priced by this run, or by a calibration (Engine.warm_up) whose costs
        # this run's verifies still match (the calibration's short context): no check, whose
        # steps cost more than they look on a CPU (the pipeline's restart, the draft's catch-up
        # after them). Where the verifies cost more (a longer context), the seed's plain step
        # scaled with them is a guess again (on a CPU at 32K a row's attention costs more than
        # the step's weights), and the check runs.
        own = self.verify_costs.medians()
        seeded = 1 in self._seeded and seed_scale(self._seeded, own) <= SEED_TRUST
        if 1 in own or seeded:
            return False
        args = self._inputs(method)
        if args is None or self.estimates[method].timings < OFF_AFTER:  # type: ignore[index]
            return False
        alpha, c, verify, k_max = args
        est = self.estimates[method]  # type: ignore[index]
        tokens = est.expected if est.per_round else lambda k: expected_tokens_per_round(alpha, k)
        best = max(tokens(k) / (k * c + verify(k + 1)) for k in range(1, k_max + 1))
        if not 1 / verify(1) <= best < PRICE_EDGE / verify(1):
            return (
                False  # plain is predicted to win (off, plain steps are timed) or drafting by far
            )
        self._price_tries, self._pricing = self._price_tries - 1, PRICE_STEPS - 1
        return True

    def lookups_pay(self, method: str) -> bool:
        """Whether a free drafter's proposals (`method`, the hybrid's lookup) should go on this
        round: a lookup costs no draft steps, but each token it proposes is one more verify row,
        and at a long context on a CPU a row costs a good part of a plain step, so a lookup that
        is seldom accepted (a sampled answer) is slower than plain decoding. Off by the draft
        model's rule (plain must win by the tolerance, and at the optimistic alpha too), with a
        probe now and then (Probes), or reviews of its guesses at plain steps where the policy
        reads reviews (lookup_review_due), so that its estimate can see it pay again. Once a
        round."""
        args = self._inputs(method)
        if args is None or not self.allow_plain:
            return True
        est = self.estimates[method]
        pays = best_k(*args, k_min=0, tolerance=TIE_TOLERANCE) > 0 or (
            best_k(est.alpha_upper, *args[1:], k_min=0, tolerance=TIE_TOLERANCE) > 0
        )
        if pays:
            self._lookup_probes.won()
            return True
        return not self._reviews and self._lookup_probes.probe()  # reviews: no probes

    def lookup_k(self, method: str, default: int) -> int:
        """How many tokens a free drafter (`method`, the n-gram lookup) should propose: the best
        K >= 1 from its own estimates, `default` until its costs are measured, 0 in a round
        where lookups do not pay (lookups_pay, decided in `decide`). No side effects."""
        if not self._lookups_on:
            return 0
        args = self._inputs(method)
        return default if args is None else best_k(*args, k_min=1, tolerance=TIE_TOLERANCE)

    def long_k(self, default: int) -> int:
        """How many tokens a lookup from a long match should propose: `default` (the configured
        long length, SpecConfig.ngram_long_k), or 0 where its own estimates (LONG) say that even
        at the optimistic alpha a round of that length commits fewer tokens a second than plain
        steps. Long matches are accepted far more often than short ones, but at a long context
        each verify row costs a good part of a plain step: on the xeon profile at 32K
        (research/replay/) a 6-row verify costs six plain steps, and a 5-token long lookup lost
        even when all five were accepted. Never shorter than `default` otherwise: cut to the
        best K of the geometric model it lost on this project's CPU at 8K (tau 3.3 -> 3.0; a
        long match is accepted whole more often than that model says). No side effects."""
        args = self._inputs(LONG)
        if args is None or not self.allow_plain:
            return default
        _, c, verify, _ = args
        tokens = expected_tokens_per_round(self.estimates[LONG].alpha_upper, default)
        return default if tokens / (default * c + verify(default + 1)) >= 1 / verify(1) else 0


def seed_scale(seeded: dict[int, float], own: dict[int, float]) -> float:
    """The median ratio of a run's verify costs to a calibration's (`seeded`) over the lengths
    both have, 1.0 before any."""
    ratios = [t / seeded[L] for L, t in own.items() if L in seeded]
    return statistics.median(ratios) if ratios else 1.0


def seeded_means(seeded: dict[int, float], own: dict[int, float]) -> dict[int, float]:
    """Verified tokens L -> seconds: the run's own medians (`own`), and at a length only the
    calibration has, its cost scaled by `seed_scale`, or past SEED_TRUST (a longer context) read
    by `seed_and_rows` where two lengths or more are shared (AdaptiveK.verify_means says why)."""
    if not seeded:
        return own
    scale = seed_scale(seeded, own)
    if scale > SEED_TRUST:
        fit = seed_and_rows(seeded, own)
        if fit is not None:
            s, r = fit
            return {**{L: s * t + r * L for L, t in seeded.items()}, **own}
    return {**{L: t * scale for L, t in seeded.items()}, **own}


def seed_and_rows(seeded: dict[int, float], own: dict[int, float]) -> tuple[float, float] | None:
    """(s, r) with own[L] ~ s * seeded[L] + r * L over the lengths both have (least squares,
    s and r >= 0): this run's costs as the calibration's scaled (a slower or busier machine)
    plus a cost a row (a longer context: each row reads every key); None with fewer than two
    shared lengths. Example: seeded {1: 1.0, 3: 1.2, 5: 1.4}, own {3: 14.6, 5: 23.8} ->
    s 0.89, r 4.51: a plain step 0.89 + 4.51 = 5.4 (a plain step scaled by the ratio of the
    costs, 17.0 here)."""
    shared = [L for L in own if L in seeded]
    if len(shared) < 2:
        return None
    xs, ls, ys = [seeded[L] for L in shared], [float(L) for L in shared], [own[L] for L in shared]
    sxx = sum(x * x for x in xs)
    sll = sum(v * v for v in ls)
    sxl = sum(x * v for x, v in zip(xs, ls, strict=True))
    sxy = sum(x * y for x, y in zip(xs, ys, strict=True))
    sly = sum(v * y for v, y in zip(ls, ys, strict=True))
    det = sxx * sll - sxl * sxl
    s = (sxy * sll - sly * sxl) / det if det > 1e-18 else -1.0
    r = (sly * sxx - sxy * sxl) / det if det > 1e-18 else -1.0
    if s >= 0 and r >= 0:
        return s, r
    # one of them negative: the best fit with it at zero
    only_s, only_r = sxy / sxx, sly / sll
    err_s = sum((y - only_s * x) ** 2 for x, y in zip(xs, ys, strict=True))
    err_r = sum((y - only_r * v) ** 2 for v, y in zip(ls, ys, strict=True))
    return (only_s, 0.0) if err_s <= err_r else (0.0, only_r)


class FixedK:
    """The same K every round (a rounds.Policy). FixedK(0): plain steps, with a drafter's free
    lookups; FixedK(PLAIN_ONLY): plain steps only (plain decoding)."""

    def __init__(self, k: int):
        self.k = k

    def observe(self, r: Round) -> None:
        pass

    def decide(self) -> int:
        return self.k


def make_k_policy(
    k: int,
    adaptive: bool,
    k_max: int,
    model: str | None = None,
    long_match: int = 0,
    drafter: str | None = None,
) -> AdaptiveK | FixedK:
    """The K policy a SpecConfig asks for: AdaptiveK(k, k_max, model=model,
    long_match=long_match, drafter=drafter) if adaptive, else FixedK(k). model="draft" for a
    hybrid drafter (see AdaptiveK); long_match: SpecConfig.long_match; drafter: Drafter.method."""
    if adaptive:
        return AdaptiveK(k, k_max, model=model, long_match=long_match, drafter=drafter)
    return FixedK(k)
