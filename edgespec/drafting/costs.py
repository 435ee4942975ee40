"""The cost model of choosing K, a tree shape or whether a server batch drafts, one for the chain,
the tree and the server policies (AdaptiveK, drafting/adaptive.py; AdaptiveTree, trees/policy.py;
BatchMode, server/mode.py): measurements kept as recent medians (Timings: a round's seconds, a
batch's tokens per second), the verify cost v(L) as measured points and a fitted line
(verify_curve), the schedule that measures the losing choice again now and then (Probes), a
batch's rate measured over a window of turns (Window), and the chain's choice itself (best_k):
the K that maximises expected tokens per second.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Hashable
from typing import TypeVar

from edgespec.events import expected_tokens_per_round

COST_WINDOW = 5  # timings per cost estimate (their median): a single stall never moves it
# Verify cost growth per extra token, relative to a 1-token forward, used until two different L
# have been measured. On a CPU an 8-token forward costs ~1.7x a 1-token one (0.7 / 7 = 0.1).
PRIOR_VERIFY_SLOPE = 0.1
PROBE_EVERY = 8  # plain rounds before the first probe round (Probes)
PROBE_MAX = 64  # longest gap between probes
# A server batch's rates (server/mode.py): its tokens/s in one mode, measured over windows of turns.
WINDOW = 16  # turns per measured rate
SETTLE = 2  # turns after a change left out (rounds already under way, a pipelined run starting)
# A window ends early once it has EARLY turns and trails its rival's rate by MARGIN or more:
# measuring the slower mode costs the batch, and the requests may leave before a whole window.
EARLY, MARGIN = 4, 0.2
RETRY_EVERY = 16  # windows in the better mode before the other is measured again (Probes)
Key = TypeVar("Key", bound=Hashable)


def best_k(
    alpha: float,
    draft_cost: float,
    verify_time: Callable[[int], float],
    k_max: int,
    k_min: int = 1,
    tolerance: float = 0.0,
    expected: Callable[[int], float] | None = None,
) -> int:
    """argmax over K in k_min..k_max of E[tokens](alpha, K) / (K * draft_cost + verify_time(K + 1)),
    or rather, with a `tolerance`, the shortest drafting round (K >= 1) whose rate is within that
    share of the best drafting rate; and K = 0 (k_min=0), a plain step at 1 / verify_time(1),
    only where it beats that best by the tolerance. Near-ties go to the shorter round, but not to
    switching the draft off: while it is off its acceptance is only seen in rare probes, so a
    draft that pays a little (alpha ~0.25 here: +10%) was switched off on a few unlucky rounds and
    stayed off. Without a tolerance, ties go to the smaller K, plain included.

    Example: alpha 0.8, c 0.1, v(L) = 1 + 0.05 (L - 1): tokens/time for K = 1..6 is 1.565, 1.877,
    2.036, 2.101, 2.108, 2.080 -> K = 5; with tolerance 0.05, K = 3 (2.036 >= 0.95 * 2.108).
    With alpha 0.1, c 0.3 and k_min 0: K = 0 gives 1.0, K = 1 gives 1.1 / 1.35 = 0.815 -> K = 0.
    `expected(K)`, when given, replaces the closed form's E[tokens] (a block draft's, from its
    acceptance per position: DrafterEstimate.expected).
    """
    ks = range(max(k_min, 1), k_max + 1)
    tokens = expected or (lambda k: expected_tokens_per_round(alpha, k))
    rates = [tokens(k) / (k * draft_cost + verify_time(k + 1)) for k in ks]
    best = max(rates)
    if k_min == 0 and 1 / verify_time(1) >= best * (1 + tolerance) * (1 - 1e-12):
        return 0
    floor = best * (1 - tolerance) * (1 - 1e-12)
    return next(k for k, rate in zip(ks, rates, strict=True) if rate >= floor)


def fit_verify_line(means: dict[int, float], prior_slope: float = PRIOR_VERIFY_SLOPE):
    """Fit v(L) = a + b (L - 1) to mean verify seconds per verified-token count L; returns (a, b).

    Two or more distinct L: least squares, b clamped at >= 0 (a forward never gets cheaper with more
    tokens), a at > 0. One L: the prior relative slope, v(L) = a (1 + prior_slope (L - 1)).
    Example: {1: 0.10, 5: 0.14} -> (0.10, 0.01); {3: 0.12} with slope 0.1 -> (0.1, 0.01).
    """
    if not means:
        raise ValueError("no verify timings to fit")
    if len(means) == 1:
        ((length, t),) = means.items()
        a = t / (1 + prior_slope * (length - 1))
        return a, a * prior_slope
    xs = [float(L - 1) for L in means]
    ys = list(means.values())
    mx_, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx_) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx_) ** 2 for x in xs
    )
    b = max(b, 0.0)
    a = max(my - b * mx_, 1e-9)
    return a, b


def cost_key(nodes: int, depth: int) -> tuple[str, int]:
    """Which costs a round of `nodes` nodes `depth` deep is priced by: ("chain", 1) for a chain
    (and a plain step), else ("tree", its nodes per depth rounded up). Chains and trees run
    different code (the chain drafter and the causal forward against masked forwards) and cost
    differently. Example: 7 nodes 4 deep -> ("tree", 2)."""
    if nodes <= depth:
        return "chain", 1
    return "tree", -(-nodes // max(depth, 1))


def verify_curve(means: dict[int, float]) -> Callable[[int], float]:
    """v(L) from the measured verify seconds per L: the measurement where there is one; elsewhere
    the fitted line (fit_verify_line), raised to the dearest measured shorter forward of 2+
    tokens (such a forward never gets cheaper with more tokens). A cost cliff between two
    measured L stays a cliff. A 1-token step is no floor: it is timed pipelined (edgespec/loop.py)
    where the others are not, and under MKL a 2-token forward costs less than a 1-token one.
    An unmeasured 1-token step costs the shortest measured forward scaled down by the prior slope,
    v(Ls) / (1 + PRIOR_VERIFY_SLOPE (Ls - 1)): the line's intercept made plain steps look cheap
    on this CPU (a 2-token forward costs about one 1-token step under MKL, a 5-token one two) and
    switched the draft off before a single plain step was timed, while v(1) = v(Ls) kept a
    useless draft on for good (v(1) is measured only once the draft is off).
    Example: {2: 1.1, 3: 1.1, 5: 1.7} -> v(1) = 1.0, v(3) = 1.1, v(5) = 1.7,
    v(6) = max(line(6), 1.7).
    """
    a, b = fit_verify_line(means)
    ls = min(means)
    shortest = means[ls] / (1 + PRIOR_VERIFY_SLOPE * (ls - 1))

    def v(length: int) -> float:
        if length in means:
            return means[length]
        if length == 1:
            return shortest
        shorter = [t for L, t in means.items() if 2 <= L < length]
        return max([a + b * (length - 1), *shorter])

    return v


class RecentMedian:
    """The median of the last COST_WINDOW measurements (None before the first): one stall never
    moves it."""

    def __init__(self) -> None:
        self.samples: deque[float] = deque(maxlen=COST_WINDOW)

    def add(self, value: float) -> None:
        self.samples.append(value)

    @property
    def value(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None


class Timings(dict[Key, RecentMedian]):
    """Recent measurements by what was measured, a RecentMedian each: seconds per verified-token
    count L (the chain), per a tree's (kind, width), a server batch's tokens per second per
    (running requests, plain)."""

    def add(self, key: Key, value: float) -> None:
        self.setdefault(key, RecentMedian()).add(value)

    def medians(self) -> dict[Key, float]:
        """Each key's median, for the keys measured so far."""
        return {k: m.value for k, m in self.items() if m.value is not None}

    def median(self, key: Key) -> float | None:
        """The key's median (None: not measured)."""
        m = self.get(key)
        return None if m is None else m.value


class Probes:
    """While one choice wins, a probe of the other now and then, so the estimates can see it
    become the better one again: after `every` rounds of the winner, the gap doubling up to
    `most` while the probed choice keeps losing, back to `every` once it wins (`won`). The chain
    and tree policies probe drafting while plain steps win, rounds apart (PROBE_EVERY, PROBE_MAX:
    8 plain rounds, a probe, 16 plain rounds, a probe, ...); a server batch the mode that lost,
    windows apart (RETRY_EVERY each time: a window is already WINDOW turns)."""

    def __init__(self, every: int = PROBE_EVERY, most: int = PROBE_MAX) -> None:
        self.every, self.most = every, most
        self.run, self.gap = 0, every

    def won(self) -> None:
        """The probed choice won (drafting, for the chain): the gap back to `every`."""
        self.run, self.gap = 0, self.every

    def probe(self, pays: Callable[[int], bool] | None = None) -> bool:
        """The winner won this round: whether it should be a probe instead. `pays(rounds)`, when
        given, is asked once the gap has passed, with the rounds since the last probe: a probe
        priced too dear for them waits (the count goes on), but never past `most` rounds, since
        the price is an estimate and probes are what corrects one (a stall's)."""
        self.run += 1
        if self.run <= self.gap:
            return False
        if pays is not None and self.run <= self.most and not pays(self.run):
            return False
        self.run, self.gap = 0, min(2 * self.gap, self.most)
        return True


class Window:
    """A server batch's tokens per second in one mode, measured over turns: SETTLE turns left
    out, then WINDOW turns, or only EARLY once the rate trails its rival's by MARGIN or more.
    A new Window settles; one that ended goes on measuring at once (the mode is kept).

        w = Window()
        rate = w.add(tokens=11, seconds=0.09, rival=100.0)   # None until the window ends
    """

    def __init__(self) -> None:
        self.tokens, self.seconds, self.turns = 0, 0.0, -SETTLE

    def add(self, tokens: int, seconds: float, rival: float | None = None) -> float | None:
        """One turn; the window's rate when it ends with it (then it starts over, unsettled)."""
        if self.turns < 0:  # settling
            self.turns += 1
            return None
        self.tokens, self.seconds, self.turns = (
            self.tokens + tokens,
            self.seconds + seconds,
            self.turns + 1,
        )
        rate = self.tokens / max(self.seconds, 1e-9)
        behind = rival is not None and self.turns >= EARLY and rate < (1 - MARGIN) * rival
        if self.turns < WINDOW and not behind:
            return None
        self.tokens, self.seconds, self.turns = 0, 0.0, 0
        return rate
