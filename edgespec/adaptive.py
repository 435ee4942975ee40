"""Adaptive K: before each round, pick the K that maximises expected tokens per second.

Closed form (Leviathan et al.): with per-token acceptance alpha, a round drafting K tokens commits
E[tokens](K) = (1 - alpha^(K+1)) / (1 - alpha) on average, and takes T(K) = K * c + v(K + 1)
seconds, where c is one draft step and v(L) a target forward verifying L tokens (the pending token
plus K drafts). K* = argmax_K E[tokens](K) / T(K) over 1..k_max.

AdaptiveK keeps the three inputs as running estimates from the Round events it is fed:
alpha as an exponentially decayed truncated-geometric MLE (accepted / (accepted + rejections)),
c as an EMA of t_draft / drafted, and v as an EMA per L fitted by a line. The choice uses only
measured costs and past outcomes, never the target's view of the coming tokens, so exactness holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from edgespec.events import Round
from edgespec.metrics import expected_tokens_per_round

PRIOR_ALPHA = 0.5  # before any round: a coin flip, worth PRIOR_WEIGHT observations
PRIOR_WEIGHT = 2.0
ALPHA_DECAY = 0.9  # per-round decay of the acceptance counts (~10 rounds of memory)
COST_WEIGHT = 0.3  # weight of the newest timing in the cost EMAs
# Verify cost growth per extra token, relative to a 1-token forward, used until two different L
# have been measured. FACTS.md: an 8-token forward costs ~1.7x a 1-token one (0.7 / 7 = 0.1).
PRIOR_VERIFY_SLOPE = 0.1


def best_k(alpha: float, draft_cost: float, verify_time: Callable[[int], float], k_max: int) -> int:
    """argmax over K in 1..k_max of E[tokens](alpha, K) / (K * draft_cost + verify_time(K + 1));
    the smallest K wins ties.

    Example: alpha 0.8, c 0.1, v(L) = 1 + 0.05 (L - 1): tokens/time for K = 1..6 is 1.565, 1.877,
    2.036, 2.101, 2.108, 2.080 -> K = 5.
    """
    best, best_rate = 1, -1.0
    for k in range(1, k_max + 1):
        rate = expected_tokens_per_round(alpha, k) / (k * draft_cost + verify_time(k + 1))
        if rate > best_rate * (1 + 1e-12):
            best, best_rate = k, rate
    return best


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


@dataclass
class DrafterEstimate:
    """Running estimates for one drafting method: decayed acceptance counts and step cost."""

    accepted: float = PRIOR_ALPHA * PRIOR_WEIGHT
    trials: float = PRIOR_WEIGHT
    draft_cost: float | None = None  # seconds per drafted token (EMA)

    @property
    def alpha(self) -> float:
        return self.accepted / self.trials

    def observe(self, r: Round) -> None:
        """Fold one round with r.drafted > 0: r.accepted successes, one failure if any rejected."""
        failure = 1.0 if r.accepted < r.drafted else 0.0
        self.accepted = ALPHA_DECAY * self.accepted + r.accepted
        self.trials = ALPHA_DECAY * self.trials + r.accepted + failure
        self.draft_cost = _ema(self.draft_cost, r.t_draft / r.drafted)


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - COST_WEIGHT) * old + COST_WEIGHT * new


class AdaptiveK:
    """K policy for loop.speculate: `policy(last_round) -> K`, learning online from Round events.

    Estimates are kept per drafting method (Round.method), because an n-gram lookup and a draft
    model differ in both cost and acceptance; the verify cost belongs to the target and is shared.
    The choice for the next round uses the estimates of the method that drafted the last one (a
    hybrid drafter tends to stay with one method for a while). Until both costs of that method
    have been measured it returns k_init.
    """

    def __init__(self, k_init: int = 4, k_max: int = 8):
        if not 1 <= k_init <= k_max:
            raise ValueError(f"need 1 <= k_init <= k_max, got {k_init}, {k_max}")
        self.k_init, self.k_max = k_init, k_max
        self.estimates: dict[str, DrafterEstimate] = {}
        self.verify_means: dict[int, float] = {}  # verified tokens L -> EMA seconds
        self.chosen: list[int] = []

    def observe(self, r: Round) -> None:
        est = self.estimates.setdefault(r.method, DrafterEstimate())
        if r.drafted > 0:
            est.observe(r)
        length = r.drafted + 1  # the pending token + the drafts
        self.verify_means[length] = _ema(self.verify_means.get(length), r.t_verify)

    def choose(self, method: str | None) -> int:
        est = self.estimates.get(method) if method is not None else None
        if est is None or est.draft_cost is None or not self.verify_means:
            return self.k_init
        a, b = fit_verify_line(self.verify_means)
        return best_k(est.alpha, est.draft_cost, lambda L: a + b * (L - 1), self.k_max)

    def __call__(self, last: Round | None) -> int:
        if last is not None:
            self.observe(last)
        k = self.choose(last.method if last is not None else None)
        self.chosen.append(k)
        return k


def make_k_policy(k: int, adaptive: bool, k_max: int) -> Callable[[Round | None], int]:
    """The K policy a SpecConfig asks for: AdaptiveK(k, k_max) if adaptive, else always k."""
    if adaptive:
        return AdaptiveK(k, k_max)
    return lambda _last: k
