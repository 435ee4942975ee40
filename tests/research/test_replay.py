"""The cost-profile replay (research/replay/): the real K and shape policies against synthetic
costs and recorded acceptance. A hand-worked golden case of the replay's own arithmetic, and the
guarantee the replay is for: on the profiles below (from the table in
docs/measurements/2026-12-06-cost-profiles.md) every adaptive policy runs at least as fast as
plain decoding, pooled over the recorded traces of each temperature, and on the worst ones it
stays above a floor. A policy change that breaks either fails here, in seconds, with no model
loaded."""

from __future__ import annotations

import pytest

from research.replay import chains, report, trees
from research.replay.profiles import HARDWARE, Profile
from research.replay.traces import Trace, load


def _trace(draft: list[int], lookup: list | None = None, block: list | None = None) -> Trace:
    n = len(draft)
    return Trace("t", 0.0, 100, draft, lookup or [[0, []]] * n, block or [0] * n)


def test_fixed_k_golden():
    """Ranks [0, 0, 1, 0, 0, 0] (the draft's argmax is the answer's token but at 2), K = 2 on
    the H100 profile at 1K, c = 0.1: the round at 0 accepts 2 (3 tokens, a bonus), the round at 3
    accepts 2 (3 tokens). Each round: two draft steps (0.1 each; after the bonus the first reads
    two tokens, a 2-row forward: 0.1 * 1.09) and a 3-row verify, 1.03 steps
    at short context (h100: v(3) = 1.03), here (1.03 + 1/32 + 0.002 * 2 * 1.024) / (1 + 1/32) =
    1.033 of a step at 1K, + 0.01 of loop overhead."""
    profile = Profile(HARDWARE["h100"], 0.1, 1024)
    assert profile.verify(3) == pytest.approx(1.043, abs=0.001)
    out = chains.replay(_trace([0, 0, 1, 0, 0, 0]), profile, "draft", chains.fixed(2))
    assert out.tokens == 6 and out.chosen == [2, 2]
    assert out.seconds == pytest.approx(0.2 + 0.209 + 2 * 1.043, abs=0.002)
    assert chains.plain(_trace([0] * 6), profile).seconds == pytest.approx(6 * 1.01)


def test_tree_path_follows_the_answers_ranks():
    """widths 2,1 (nodes (0,), (1,), (0, 0)): ranks 1 then 0 accept the second candidate, which
    has no child (only the first has): one accepted; ranks 0, 0: two; rank 3 first: none."""
    shape = trees.shapes()[trees.TREE_WIDTHS.index((2, 1)) + chains.K_MAX]
    tree = shape.tree
    assert len(trees.accepted_path(_trace([1, 0, 0]), 0, tree)) == 1
    assert len(trees.accepted_path(_trace([0, 0, 0]), 0, tree)) == 2
    assert trees.accepted_path(_trace([3, 0, 0]), 0, tree) == []


# Profiles where every policy is at or above plain decoding today (one or two per machine kind
# that has such; docs/measurements/2026-12-06-cost-profiles.md has the whole table).
HOLDS = [
    ("zen4", 0.1, 8192),
    ("zen4", 0.05, 32768),
    ("m3m5", 0.1, 32768),
    ("h100", 0.1, 8192),
    ("h100", 0.3, 32768),
]
# The worst profiles today: drafts that never pay (plain is the best fixed choice), where the
# policies lose 2-10% to what learning that costs within a 128-token answer. A floor, so that
# a change that makes them worse fails: 0.88-0.90 before reviews and long-match lookups were
# priced (drafting/adaptive.py: REVIEW_SHARE, AdaptiveK.long_k), 0.907-0.919 since.
WORST = [("m1m2", 0.6, 1024), ("m4pro", 0.6, 1024), ("xeon", 0.6, 32768)]
FLOOR = 0.9


@pytest.fixture(scope="module")
def traces() -> list[Trace]:
    return load()


def _ratios(traces: list[Trace], profile: Profile) -> dict[str, float]:
    """Each adaptive policy's pooled rate over plain decoding's, per method and temperature."""
    out = {}
    for temp in sorted({t.temp for t in traces}):
        group = [t for t in traces if t.temp == temp]
        plain = report.pooled(chains.plain(t, profile) for t in group)
        for m in chains.METHODS:
            runs = (chains.replay(t, profile, m, chains.adaptive(m)) for t in group)
            out[f"{m} T={temp:g}"] = report.pooled(runs) / plain
        if temp == 0:
            for name, make in (("tree", trees.adaptive), ("tree-fallback", trees.fallback)):
                runs = (trees.replay(t, profile, make()) for t in group)
                out[name] = report.pooled(runs) / plain
    return out


@pytest.mark.parametrize("hw,c,n", HOLDS)
def test_adaptive_policies_are_not_below_plain(traces, hw, c, n):
    ratios = _ratios(traces, Profile(HARDWARE[hw], c, n))
    assert min(ratios.values()) >= 1.0, {k: round(v, 3) for k, v in ratios.items()}


@pytest.mark.parametrize("hw,c,n", WORST)
def test_the_worst_profiles_stay_above_their_floor(traces, hw, c, n):
    ratios = _ratios(traces, Profile(HARDWARE[hw], c, n))
    assert min(ratios.values()) >= FLOOR, {k: round(v, 3) for k, v in ratios.items()}


def test_seeded_tree_policies_start_from_a_tree_warm_ups_costs():
    """Seeded as after a tree warm-up (trees.seeded): the fallback's tree verify and draft
    forward are priced before its first tree round, and where a draft at 0.6 of a step cannot
    pay on an M1 / M2 (a 2-row verify at 1.7 steps) its first round is a plain step (adaptive
    K's seeded first round); unseeded, a chain of k_init."""
    profile = Profile(HARDWARE["m1m2"], 0.6, 1024)
    policy = trees.fallback(profile)
    size = sum(trees.FALLBACK_WIDTHS)  # 3 + 2 + 1 + 1 nodes
    assert set(policy._seeds.tree_verify) == {size + 1} and policy._seeds.tree_draft
    assert policy.decide().size == 0
    assert trees.fallback().decide().size == chains.K_INIT
    assert trees.adaptive(profile)._seeds.tree_verify  # `--tree auto`'s warm-up trees too


def test_seeded_tree_policies_stay_above_the_floor_at_a_long_context(traces):
    """Seeded from a short warm-up and run at 32K on the xeon profile (each verify row reads
    every key, so a request's costs leave the calibration's): `--tree auto` ran at 0.73x plain
    while it priced a plain step as the calibration's scaled by one ratio (trees/policy.py
    `_chain_means`, now adaptive K's seeded_means)."""
    profile = Profile(HARDWARE["xeon"], 0.05, 32768)
    group = [t for t in traces if t.temp == 0]
    plain = report.pooled(chains.plain(t, profile) for t in group)
    for make in (trees.adaptive, trees.fallback):
        rate = report.pooled(trees.replay(t, profile, make(profile)) for t in group)
        assert rate / plain >= FLOOR, (make.__name__, round(rate / plain, 3))
