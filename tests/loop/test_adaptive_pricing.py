"""Adaptive K's price checks (a few plain steps timed while drafting is predicted to beat them by
little) and its switch-off on the slow acceptance estimate (edgespec.drafting.adaptive), on
simulated rounds: a target whose plain step, 2-row verify and draft cost are given, and a draft
accepted per token with probability alpha."""

from __future__ import annotations

import random

import pytest

from edgespec.drafting import adaptive
from edgespec.drafting.adaptive import PRICE_STEPS, RECHECK, AdaptiveK, DrafterEstimate
from edgespec.events import Round
from tests.helpers import ask


def simulate(
    policy: AdaptiveK,
    rounds: int,
    alpha: float,
    two_rows: float,
    draft: float = 0.01,
    plain: float = 0.1,
    seed: int = 0,
) -> list[int]:
    """Feed `policy` the rounds it asks for: a plain step of `plain` s, a verify of L tokens of
    two_rows + (two_rows - plain) (L - 2) s, `draft` s per drafted token, each draft accepted
    with probability `alpha` (seeded). Returns the K chosen."""
    rng, last = random.Random(seed), None
    for i in range(rounds):
        k = ask(policy, last)
        if k == 0:
            last = Round(i, 0, 0, 0, 0.0, plain)
            continue
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        verify = two_rows + (two_rows - plain) * (k - 1)
        last = Round(i, k, accepted, k, draft * k, verify)
    return policy.chosen


def test_a_price_check_switches_off_a_draft_that_loses_to_plain_steps_at_a_long_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # At 8K tokens on a CPU a 2-row verify costs ~1.3 plain steps: a draft accepted 3 times in 10
    # brings 1.3 tokens for 1.4 steps (0.93x plain). Priced from the 2-row verify (v(2) / 1.1),
    # a plain step looks 18% dearer than it is and drafting looks 1.1x plain: the draft stayed on.
    for seed in range(3):
        chosen = simulate(AdaptiveK(4, 8), 400, alpha=0.3, two_rows=0.13, seed=seed)
        assert 0 in chosen[:10], chosen[:10]  # a price check as soon as the costs are known
        assert sum(k > 0 for k in chosen[-200:]) <= 8, chosen[-200:]  # off, save for probes
    monkeypatch.setattr(adaptive, "PRICE_EDGE", 0.0)  # no price checks: the policy before
    chosen = simulate(AdaptiveK(4, 8), 400, alpha=0.3, two_rows=0.13)
    assert 0 not in chosen


def test_no_price_check_where_drafting_clearly_pays() -> None:
    # Accepted 8 times in 10 with a 2-row verify at the cost of a plain step: ~2x plain.
    for seed in range(3):
        chosen = simulate(AdaptiveK(4, 8), 400, alpha=0.8, two_rows=0.1, seed=seed)
        assert chosen.count(0) <= PRICE_STEPS, chosen[:20]  # one early one at most (noisy alpha)
        assert 0 not in chosen[50:]


def test_a_price_check_keeps_a_draft_that_pays_on_and_is_repeated_only_after_recheck() -> None:
    # Accepted 45% of the time, a 2-row verify at a plain step's cost (a short context under
    # MKL): drafting is ~1.3x plain, which the prior (v(1) = v(2) / 1.1) calls ~1.2x, under
    # PRICE_EDGE. One check times the plain step; then drafting goes on.
    chosen = simulate(AdaptiveK(1, 4), 2 * RECHECK, alpha=0.45, two_rows=0.1)
    plain = [i for i, k in enumerate(chosen) if k == 0]
    assert plain[:PRICE_STEPS] == list(range(plain[0], plain[0] + PRICE_STEPS)), chosen[:20]
    assert len(plain) <= 2 * PRICE_STEPS  # at most one more, RECHECK rounds later
    assert all(k > 0 for k in chosen[plain[0] + PRICE_STEPS : plain[0] + RECHECK])


def test_a_hybrids_lookups_stay_on_during_a_price_check() -> None:
    # A copied passage: its lookups pay far more than the draft model; a price check of the
    # draft model's rounds must not cost their rounds too.
    policy = AdaptiveK(1, 4, model="draft")
    last = None
    for i in range(10):  # the draft's costs become known, then a price check begins
        if ask(policy, last) == 0:
            break
        last = Round(i, 1, i % 3 == 0, 1, 0.01, 0.13)
        if i % 2:
            last = Round(i, 4, 4, 4, 1e-5, 0.16, method="ngram")
    assert policy.chosen[-1] == 0 and policy._pricing > 0, policy.chosen
    assert policy.lookup_k("ngram", 4) == 4


def test_a_price_check_that_times_nothing_is_not_repeated_at_once() -> None:
    # A run that never times a plain step (too short to pipeline one) must not check again and
    # again: the next check waits RECHECK rounds.
    policy = AdaptiveK(1, 1)
    last = None
    for i in range(3 * RECHECK):
        k = ask(policy, last)
        if k == 0:
            last = Round(i, 0, 0, 0, 0.0, 0.1, timed=False)
        else:
            last = Round(i, 1, i % 10 < 3, 1, 0.01, 0.13)
    assert policy.chosen.count(0) <= 3 * PRICE_STEPS


def test_the_switch_off_bound_rests_on_about_fifty_rounds() -> None:
    est = DrafterEstimate()
    for i in range(200):
        est.observe(Round(i, 1, int(i % 10 < 3), 1, 0.01, 0.1))
    # Steady acceptance 0.3: ~50 decayed trials put the bound ~0.065 above it; ~13 (the fast
    # estimate's) would put it ~0.13 above, where a draft losing 7% looks like it pays.
    assert est.slow_alpha == pytest.approx(0.3, abs=0.03)
    assert 0.03 < est.alpha_upper - est.slow_alpha < 0.08
    assert est.slow_trials > 40 and est.trials < 15
