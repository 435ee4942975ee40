"""The two-stage rule every sampled-output check uses (tests/helpers/stats.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import chi2_pvalue
from tests.helpers.stats import ALPHA, CONFIRM, assert_follows, fresh_seeds

P = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])


def _sampler(q: np.ndarray, per_seed: int = 40):
    """p_value(seeds): `per_seed` draws from q for each seed, chi-square against P; it records
    the seed ranges it was asked for."""
    asked: list[range] = []

    def p_value(seeds: range) -> float:
        asked.append(seeds)
        draws = [np.random.default_rng(s).choice(q.size, per_seed, p=q) for s in seeds]
        return chi2_pvalue(np.concatenate(draws), P, min_samples=per_seed * len(seeds))

    return p_value, asked


def test_stage_two_draws_twice_as_many_fresh_seeds():
    assert fresh_seeds(range(3)) == range(10_003, 10_009)
    again = fresh_seeds(range(5, 405))
    assert len(again) == 800 and not set(again) & set(range(5, 405))


def test_a_sampler_that_follows_p_passes_in_stage_one():
    p_value, asked = _sampler(P)
    assert assert_follows(p_value, range(10)) > ALPHA
    assert asked == [range(10)]


def test_a_biased_sampler_fails_both_stages():
    """A sampler that moves 0.05 of mass from the likeliest token to the rarest: over 400 draws
    stage one rejects, and stage two's 800 fresh draws reject more surely."""
    q = P + np.array([-0.05, 0, 0, 0, 0, 0.05])
    p_value, asked = _sampler(q)
    with pytest.raises(AssertionError, match="then p ="):
        assert_follows(p_value, range(10), "biased")
    assert asked == [range(10), fresh_seeds(range(10))]


def test_a_chance_rejection_is_forgiven_only_by_fresh_draws_that_pass():
    script = {range(3): 4e-4, fresh_seeds(range(3)): 0.3}
    assert assert_follows(script.__getitem__, range(3)) == 0.3
    script[fresh_seeds(range(3))] = CONFIRM / 2  # fresh draws reject too: the test fails
    with pytest.raises(AssertionError, match=r"p = 0.0004 with seeds 0..2, then p = 0.005"):
        assert_follows(script.__getitem__, range(3))
