"""Drafting beyond a fixed K: n-gram prompt lookup, hybrid, early stop, adaptive K.

Unit tests of the pure parts (index, closed-form K choice), then exactness on tiny seeded models:
identical greedy output to plain decoding, consistent caches after hybrid rounds, and a chi-square
test that the n-gram's point-mass proposals leave the emitted tokens distributed as p.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chisquare

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.drafting.adaptive import (
    TIE_TOLERANCE,
    AdaptiveK,
    DrafterEstimate,
    best_k,
    fit_verify_line,
    verify_curve,
)
from edgespec.drafting.build import ConfidentDrafter, HybridDrafter, build_drafter
from edgespec.drafting.ngram import NgramDrafter, NgramIndex
from edgespec.errors import ConfigError
from edgespec.events import Finished, Round, Token
from edgespec.loop import ModelDrafter, no_proposal
from edgespec.metrics import expected_tokens_per_round
from edgespec.runtime import Engine
from edgespec.sampling import warp

PROMPT = "the cat and the dog in the house"
GREEDY = SamplingConfig(temperature=0)


def _ids(events) -> list[int]:
    return [e.id for e in events if isinstance(e, Token)]


def _rounds(events) -> list[Round]:
    return [e for e in events if isinstance(e, Round)]


def _gen(engine, ids, spec: SpecConfig, n: int, sampling=GREEDY, **kw):
    return list(engine.generate(ids, GenerationConfig(sampling, spec, max_tokens=n), **kw))


# ---------------------------------------------------------------------------- n-gram index


def test_index_golden_case():
    index = NgramIndex(2, 2)
    index.extend([5, 6, 7, 5, 6])
    assert index.lookup(3) == ([7, 5, 6], 2)
    assert index.lookup(10) == ([7, 5, 6], 2)  # stops at the end of the known tokens


def test_longest_suffix_wins_and_most_recent_occurrence_is_used():
    index = NgramIndex(1, 3)
    # "1 2 3" occurs once (-> 4); "3" alone occurred last before 9 (-> 9); n = 3 beats n = 1.
    index.extend([1, 2, 3, 4, 0, 3, 9, 1, 2, 3])
    assert index.lookup(2) == ([4, 0], 3)
    index.extend([1, 2, 3, 4, 0, 3, 9, 1, 2, 3, 8, 3])  # incremental: suffix "3" -> after it: 8
    assert index.lookup(2) == ([8, 3], 1)
    assert index.lookup(2, n_min=2) == ([], 0)  # "8 3" never occurred before


def test_no_match_and_self_match_excluded():
    index = NgramIndex(1, 4)
    index.extend([1, 2, 3])
    assert index.lookup(4) == ([], 0)  # the suffix itself is not an earlier occurrence


def test_incremental_index_equals_one_shot_index():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 6, size=300).tolist()
    step, one = NgramIndex(1, 4), NgramIndex(1, 4)
    for end in range(1, 301, 7):
        step.extend(tokens[:end])
    step.extend(tokens)
    one.extend(tokens)
    assert step._next == one._next
    for k in (1, 5):
        assert step.lookup(k) == one.lookup(k)


def test_shorter_context_rebuilds_the_index():
    index = NgramIndex(1, 2)
    index.extend([1, 2, 1])
    assert index.lookup(1) == ([2], 1)
    index.extend([3, 4])
    assert index.tokens == [3, 4] and index.lookup(1) == ([], 0)


def test_ngram_drafter_proposes_a_point_mass():
    d = NgramDrafter(1, 3)
    prop = d.propose([7, 8, 9, 7, 8], 4, mx.random.key(0))
    assert prop.q is None and prop.tokens.dtype == mx.int32
    assert prop.tokens.tolist() == [9, 7, 8] and d.match == 2


def test_long_matches_propose_long_and_short_ones_k():
    # [1 2 3 4 5 6 7 8 9] then its first six tokens again: the suffix "1..6" (n = 6) matches.
    copy = [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6]
    d = NgramDrafter(1, 8, long_n=6, long_k=3)
    assert d.propose(copy, 1).tokens.tolist() == [7, 8, 9] and d.match == 6
    assert d.propose(copy, 4).tokens.tolist() == [7, 8, 9, 0]  # max(K, long_k)
    assert d.propose_behind(copy, 1) == [8, 9, 0]  # one behind: past the match's first token
    short = [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 4, 5, 6]  # "4 5 6": n = 3 < 6
    assert d.propose(short, 1).tokens.tolist() == [7] and d.match == 3
    off = NgramDrafter(1, 8)  # long_n 0: no long proposals
    assert off.propose(copy, 1).tokens.tolist() == [7]
    assert SpecConfig(ngram_max=4).long_match == 4  # capped at the longest match looked up
    assert SpecConfig(ngram_long=0).long_match == 0


# ---------------------------------------------------------------------------- adaptive K maths


def _line(a: float, b: float):
    return lambda L: a + b * (L - 1)


@pytest.mark.parametrize(
    "alpha,c,a,b,k_max,want",
    [
        # tokens/time for K = 1..6: 1.565, 1.877, 2.036, 2.101, 2.108, 2.080 (hand-worked).
        (0.8, 0.1, 1.0, 0.05, 8, 5),
        (0.8, 0.1, 1.0, 0.05, 4, 4),  # capped by k_max
        # K=1: 1.5 / 1.5 = 1.0; K=2: 1.75 / 2.0 = 0.875 -> 1.
        (0.5, 0.5, 1.0, 0.0, 8, 1),
        (1.0, 0.1, 1.0, 0.05, 8, 8),  # every draft accepted: E = K + 1 grows faster than time
        (0.0, 0.1, 1.0, 0.05, 8, 1),  # nothing accepted: the cheapest round
        # Free drafting and free verifying of extra tokens: more K is never worse.
        (0.3, 0.0, 1.0, 0.0, 6, 6),
    ],
)
def test_best_k_closed_form(alpha, c, a, b, k_max, want):
    assert best_k(alpha, c, _line(a, b), k_max) == want


@pytest.mark.parametrize(
    "alpha,c,a,b,want",
    [
        (0.1, 0.3, 1.0, 0.05, 0),  # K=0: 1.0; K=1: 1.1 / 1.35 = 0.815 -> plain
        (0.0, 0.0, 1.0, 0.0, 0),  # free but useless drafts tie with plain: the smaller K wins
        (0.8, 0.1, 1.0, 0.05, 5),  # a good draft: as without K = 0
        # K=1: 1.5 / (0.2 + 1.05) = 1.2 beats plain's 1.0
        (0.5, 0.2, 1.0, 0.05, 1),
    ],
)
def test_best_k_may_choose_a_plain_step(alpha, c, a, b, want):
    assert best_k(alpha, c, _line(a, b), 8, k_min=0) == want


def test_best_k_is_the_argmax_of_the_closed_form():
    for alpha in np.linspace(0.05, 0.95, 10):
        for c in (0.02, 0.1, 0.3):
            rates = [
                expected_tokens_per_round(alpha, k) / (k * c + 1 + 0.1 * k) for k in range(1, 9)
            ]
            assert best_k(alpha, c, _line(1.0, 0.1), 8) == 1 + int(np.argmax(rates))


def test_best_k_with_a_tolerance_takes_the_shortest_round_near_the_best():
    line = _line(1.0, 0.05)  # alpha 0.8, c 0.1: rates 1.565, 1.877, 2.036, 2.101, 2.108 (K = 5)
    assert best_k(0.8, 0.1, line, 8) == 5
    assert best_k(0.8, 0.1, line, 8, tolerance=0.05) == 3  # 2.036 >= 0.95 * 2.108 > 1.877
    assert best_k(0.8, 0.1, line, 8, tolerance=0.2) == 2
    # The draft is switched off only where plain beats it by the tolerance: K = 1 at
    # 1.5 / (0.4 + 1.05) = 1.034 stays on; at 1.5 / (0.5 + 1.05) = 0.968 (plain 3% better) too.
    assert best_k(0.5, 0.4, line, 1, k_min=0, tolerance=0.05) == 1
    assert best_k(0.5, 0.5, line, 1, k_min=0, tolerance=0.05) == 1
    assert best_k(0.5, 0.5, line, 1, k_min=0) == 0
    assert best_k(0.5, 0.6, line, 1, k_min=0, tolerance=0.05) == 0  # 1.5 / 1.65: 10% worse


def test_fit_verify_line():
    assert fit_verify_line({1: 0.10, 5: 0.14}) == pytest.approx((0.10, 0.01))
    assert fit_verify_line({3: 0.12}, prior_slope=0.1) == pytest.approx((0.1, 0.01))
    a, b = fit_verify_line({1: 0.2, 3: 0.1})  # a cheaper longer forward is noise: slope 0
    assert b == 0.0 and a == pytest.approx(0.15)


def _round(i, drafted, accepted, k, t_draft, t_verify, method="draft") -> Round:
    return Round(i, drafted, accepted, k, t_draft, t_verify, method)


def test_adaptive_k_learns_alpha_and_costs_and_picks_the_closed_form_optimum():
    policy = AdaptiveK(k_init=3, k_max=8)
    assert policy(None) == 3  # nothing measured yet
    # One round: 4 drafted, 2 accepted (one rejection); draft 0.04 s -> c = 0.01 s per token;
    # verify of 5 tokens 0.14 s.
    k = policy(_round(0, 4, 2, 3, 0.04, 0.14))
    # alpha = (0.9 * 1 + 2) / (0.9 * 2 + 3) = 2.9 / 4.8; one L measured: v(L) = a (1 + 0.1 (L-1))
    # with a = 0.14 / 1.4 = 0.1.
    alpha = 2.9 / 4.8
    assert policy.estimates["draft"].alpha == pytest.approx(alpha)
    assert k == best_k(alpha, 0.01, _line(0.1, 0.01), 8, tolerance=TIE_TOLERANCE)
    rates = [expected_tokens_per_round(alpha, j) / (0.01 * j + 0.1 + 0.01 * j) for j in range(1, 9)]
    # the shortest K within TIE_TOLERANCE of the closed form's best
    assert k == 1 + min(j for j, r in enumerate(rates) if r >= max(rates) * (1 - TIE_TOLERANCE))
    assert k < 1 + int(np.argmax(rates))  # here the best is a longer K, by less than 5%


def test_adaptive_k_moves_with_acceptance():
    high, low = AdaptiveK(4, 8), AdaptiveK(4, 8, allow_plain=False)
    for i in range(30):
        kh = high(_round(i, 4, 4, 4, 0.004, 0.1 + 0.004 * 4))  # everything accepted, cheap draft
        kl = low(_round(i, 4, 0, 4, 0.04, 0.1 + 0.01 * 4))  # nothing accepted, costly draft
    assert kh == 8 and kl == 1


def test_adaptive_k_switches_a_useless_draft_off_and_probes_with_doubling_gaps():
    policy = AdaptiveK(4, 8)
    chosen = [policy(None)]
    for i in range(200):  # a draft that is never accepted and costs 40% of a target step
        k = chosen[-1]
        chosen.append(policy(_round(i, k, 0, k, 0.04 * k, 0.1 + 0.005 * k)))
    drafted = [i for i, k in enumerate(chosen) if k > 0]
    # A few measured rounds turn it off: it goes off only once plain wins even at alpha's upper
    # bound (AdaptiveK.choose), which takes two rejections after the first round.
    assert chosen[:4] == [4, 1, 1, 0]
    gaps = np.diff(drafted[2:]).tolist()  # between drafting rounds: 8, 16, 32, 64, 64 plain rounds
    assert gaps[:5] == [9, 17, 33, 65, 65], gaps
    assert all(chosen[i] == 1 for i in drafted[1:])  # probes draft the best K >= 1


def test_an_unlucky_streak_does_not_switch_a_paying_draft_off(monkeypatch):
    # A draft accepted 40% of the time at 12% of a step's cost pays ~14% over plain here; eight
    # rejections in a row drop alpha's estimate (~10 rounds of memory) to where plain looks
    # better. It is switched off only if plain wins at alpha's upper bound too.
    def run():
        policy = AdaptiveK(1, 1)
        k = policy(None)
        for i, acc in enumerate([1, 0, 1, 0, 0] * 6 + [0] * 8):
            k = policy(_round(i, k, min(acc, k), k, 0.012 * k, 0.1 if k else 0.092))
        return policy.chosen

    assert 0 not in run()
    monkeypatch.setattr(DrafterEstimate, "alpha_upper", DrafterEstimate.alpha)
    assert 0 in run()  # on the estimate alone, the streak switches it off


def test_adaptive_k_turns_drafting_back_on_when_probes_succeed():
    policy = AdaptiveK(4, 8)
    k = policy(None)
    for i in range(20):  # useless draft first ...
        k = policy(_round(i, k, 0, k, 0.04 * k, 0.1 + 0.005 * k))
    assert k == 0 or policy.chosen[-2] == 0
    for i in range(20, 120):  # ... then every drafted token is accepted and drafting is cheap
        k = policy(_round(i, k, k, k, 0.002 * k, 0.1 + 0.005 * k))
    assert policy.chosen[-10:] == [8] * 10


def test_adaptive_k_leaves_the_catch_up_after_plain_rounds_out_of_the_draft_cost():
    # A probe after K = 0 rounds feeds the draft every token committed meanwhile: a slow round that
    # says nothing about the cost of drafting. Counting it kept a good draft switched off.
    policy = AdaptiveK(1, 4)
    k = policy(None)
    for i in range(12):  # rejected drafts: drafting is switched off
        k = policy(_round(i, k, 0, k, 0.01 * k, 0.1 + 0.005 * k))
        if i > 2 and k == 0:
            break
    cost = policy.estimates["draft"].draft_cost
    assert policy.chosen[-1] == 0 and cost == pytest.approx(0.01)
    i += 1
    while k == 0:  # plain rounds until the probe
        k, i = policy(_round(i, 0, 0, 0, 0.0, 0.1)), i + 1
    samples = list(policy.estimates["draft"].step_costs.samples)
    k = policy(_round(i, k, k, k, 0.5, 0.1 + 0.005 * k))  # probe: all accepted, 0.5 s catch-up
    assert list(policy.estimates["draft"].step_costs.samples) == samples  # left out
    assert k > 0  # the accepted probe turns drafting back on
    policy(_round(i + 1, k, k, k, 0.02 * k, 0.1 + 0.005 * k))  # a steady round is timed
    assert policy.estimates["draft"].step_costs.samples[-1] == pytest.approx(0.02)


def test_adaptive_k_leaves_overlapped_rounds_out_of_the_costs_but_counts_their_acceptance():
    # A pipelined plain step read late (0.3 s) and the lookup queued behind it, read early
    # (0.01 s): counted, the lookup's 4 tokens looked cheaper than a plain step.
    policy = AdaptiveK(1, 8)
    policy(None)
    for i in range(6):
        policy(_round(i, 1, 1, 1, 0.001, 0.11, "ngram"))
        policy(_round(i, 0, 0, 0, 0.0, 0.1, "ngram"))
    before = {L: list(m.samples) for L, m in policy.verify_costs.items()}
    alpha = policy.estimates["ngram"].alpha
    policy(Round(6, 0, 0, 0, 0.0, 0.3, "ngram", timed=False))
    policy(Round(7, 4, 1, 4, 0.0, 0.01, "ngram", timed=False))
    assert {L: list(m.samples) for L, m in policy.verify_costs.items()} == before
    assert 5 not in policy.verify_costs
    assert policy.estimates["ngram"].draft_cost == pytest.approx(0.001)
    assert policy.estimates["ngram"].alpha < alpha  # its rejection still counts
    policy(Round(8, 4, 1, 4, 0.0, 0.15, "ngram"))  # the same lookup in a round of its own
    assert policy.verify_means[5] == pytest.approx(0.15)


def test_verify_curve_keeps_measured_points_and_a_cliff_between_them():
    v = verify_curve({2: 1.0, 3: 1.0, 5: 1.7})
    assert (v(2), v(3), v(5)) == (1.0, 1.0, 1.7)
    a, b = fit_verify_line({2: 1.0, 3: 1.0, 5: 1.7})
    # unmeasured: the shortest measured forward's cost scaled by the prior slope, not the line's
    assert v(1) == pytest.approx(1.0 / 1.1) and verify_curve({5: 1.4})(1) == pytest.approx(1.0)
    assert v(4) == pytest.approx(max(a + 3 * b, 1.0))
    assert v(8) == pytest.approx(max(a + 7 * b, 1.7))
    assert v(6) >= v(5)
    # A 1-token step (timed pipelined) is no floor for longer forwards: under MKL a 2-token
    # forward costs less, and one dear plain step made K = 1 look as dear as it (RAG, this CPU).
    means = {1: 2.0, 3: 1.3, 5: 1.9}
    a, b = fit_verify_line(means)
    w = verify_curve(means)
    assert (
        w(2) < 2.0 and w(2) == pytest.approx(a + b) and w(4) == pytest.approx(max(a + 3 * b, 1.3))
    )


def test_adaptive_k_follows_a_verify_cost_cliff():
    # MLX's CUDA backend (H100): verifying 1-3 tokens costs about one decode step, 4-5 tokens ~1.7.
    # A line through those points makes K = 2 look dear and K = 4 cheap; the measured points don't.
    policy = AdaptiveK(4, 4, allow_plain=False)
    cost = {1: 0.10, 2: 0.10, 3: 0.102, 4: 0.17, 5: 0.172}
    k = policy(None)
    for i in range(40):  # 45% of drafts accepted, a draft step costs 12% of a target step
        accepted = [0, 1, 0, 1, 2, 0, 1, 0, 1, 3][i % 10] if k else 0
        accepted = min(accepted, k)
        k = policy(_round(i, k, accepted, k, 0.012 * k, cost[k + 1]))
        if i < 4:  # make sure every L has been measured: draft 4, 3, 2, 1 first
            policy.chosen[-1] = k = 3 - i if i < 3 else 4
    alpha = policy.estimates["draft"].alpha
    a, b = fit_verify_line(policy.verify_means)
    assert best_k(alpha, 0.012, _line(a, b), 4) != 2  # the line's answer is wrong here
    assert best_k(alpha, 0.012, cost.__getitem__, 4) == 2
    # The measured points' answer, K = 2 (K = 1 may come within TIE_TOLERANCE of it as alpha
    # moves); never a K past the cliff.
    assert set(policy.chosen[-5:]) <= {1, 2} and policy.chosen[-5:].count(2) >= 3


def test_a_single_stall_does_not_switch_a_good_draft_off():
    # A kernel compiled on first use (tens of seconds on a GPU) inside one round's draft or verify.
    policy = AdaptiveK(2, 4)
    k = policy(None)
    for i in range(10):  # a good draft: everything accepted, cheap
        k = policy(_round(i, k, k, k, 0.01 * k, 0.1 + 0.005 * k))
    steady = k
    k = policy(_round(10, k, k, k, 48.0, 0.1 + 0.005 * k))  # a stalled draft
    k = policy(_round(11, k, k, k, 0.01 * k, 48.0))  # a stalled verify
    assert k == steady > 0
    for i in range(12, 20):
        k = policy(_round(i, k, k, k, 0.01 * k, 0.1 + 0.005 * k))
    assert 0 not in policy.chosen and policy.chosen[-1] == steady


def test_adaptive_k_counts_a_repeated_round_once():
    once, twice = AdaptiveK(2, 4), AdaptiveK(2, 4)
    rounds = [Round(i, 2, i % 3, 2, 0.01, 0.1, "draft") for i in range(6)]
    for r in rounds:
        once(r)
        twice(r)
        twice(r)  # a pipelined plain run shows the round before it again
    a, b = once.estimates["draft"], twice.estimates["draft"]
    assert (a.accepted, a.trials, list(a.step_costs.samples)) == (
        b.accepted, b.trials, list(b.step_costs.samples))  # fmt: skip
    assert {L: list(m.samples) for L, m in once.verify_costs.items()} == {
        L: list(m.samples) for L, m in twice.verify_costs.items()}  # fmt: skip


def test_adaptive_k_keeps_estimates_per_method():
    policy = AdaptiveK(4, 8, allow_plain=False)
    for i in range(20):
        policy(_round(i, 4, 0, 4, 0.04, 0.14, method="draft"))
    k_ngram = policy(_round(20, 3, 3, 4, 1e-5, 0.13, method="ngram"))
    k_draft = policy(_round(21, 4, 0, 4, 0.04, 0.14, method="draft"))
    assert policy.estimates["ngram"].alpha > 0.7 > 0.2 > policy.estimates["draft"].alpha
    assert k_ngram > k_draft == 1


def test_adaptive_k_counts_long_match_lookups_apart():
    # Long-match lookups (Round.match >= long_match) are accepted whole; short ones rarely. The
    # lookup length for short matches must come from the short ones alone.
    policy = AdaptiveK(1, 8, long_match=6)
    for i in range(0, 30, 2):
        policy(Round(i, 8, 8, 8, 1e-5, 0.2, "ngram", match=7))
        policy(Round(i + 1, 1, 0, 1, 1e-5, 0.1, "ngram", match=2))
    assert policy.estimates["ngram-long"].alpha > 0.9 > 0.2 > policy.estimates["ngram"].alpha
    assert policy.lookup_k("ngram", 4) == 1
    mixed = AdaptiveK(1, 8)  # long_match 0: one estimate, which the long rounds inflate
    for i in range(0, 30, 2):
        mixed(Round(i, 8, 8, 8, 1e-5, 0.2, "ngram", match=7))
        mixed(Round(i + 1, 1, 0, 1, 1e-5, 0.1, "ngram", match=2))
    assert mixed.estimates["ngram"].alpha > 0.5 and mixed.lookup_k("ngram", 4) > 1


def test_adaptive_k_for_a_hybrid_gives_the_model_its_own_k_and_the_lookup_its_own():
    # Choosing from whoever drafted last handed a lookup's K (alpha ~0.9, no draft cost) to the
    # draft model as soon as the next lookup missed.
    policy = AdaptiveK(4, 8, allow_plain=False, model="draft")
    for i in range(20):
        policy(_round(i, 4, 0, 4, 0.04, 0.14, method="draft"))
    k = policy(_round(20, 4, 4, 4, 1e-5, 0.13, method="ngram"))
    assert k == 1  # the draft model's K, though the last round was an accepted lookup
    assert policy.lookup_k("ngram", 4) > 1  # the lookup proposes more
    assert AdaptiveK(4, 8).lookup_k("ngram", 3) == 3  # nothing measured: the default
    free = AdaptiveK(4, 8)  # without model=, the last round's method decides (pure drafters)
    for i in range(20):
        free(_round(i, 4, 0, 4, 0.04, 0.14, method="draft"))
    assert free(_round(20, 4, 4, 4, 1e-5, 0.13, method="ngram")) > 1


class _NeverDrafter:
    """A model drafter that must not be asked (the lookup matches in these tests)."""

    method = "draft"

    def propose(self, context, k, key):
        raise AssertionError("the model drafted although the lookup matched")

    def commit(self, context):
        pass


def test_hybrid_lookup_length_comes_from_lookup_k():
    context = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]  # "1 2" matched: 3 4 5 6 7 8 9 1 2 follow
    asked = []

    def lookup_k(method, default):
        asked.append((method, default))
        return 6

    hybrid = HybridDrafter(NgramDrafter(2, 4), _NeverDrafter(), free_k=4, lookup_k=lookup_k)
    key = mx.random.key(0)
    assert hybrid.propose(context, 1, key).tokens.tolist() == [3, 4, 5, 6, 7, 8]
    assert hybrid.propose_free(context, key).tokens.tolist() == [3, 4, 5, 6, 7, 8]
    assert asked == [("ngram", 4), ("ngram", 4)] and hybrid.method == "ngram"
    plain = HybridDrafter(NgramDrafter(2, 4), _NeverDrafter(), free_k=4)
    assert plain.propose(context, 1, key).tokens.tolist() == [3, 4, 5, 6]  # max(k, free_k)
    assert plain.propose(context, 5, key).tokens.tolist() == [3, 4, 5, 6, 7]


def test_lookups_one_token_behind_skip_the_guess_for_the_token_being_computed():
    ngram = NgramDrafter(2, 4)
    context = [5, 6, 7, 8, 5, 6]  # (5, 6) was followed by 7 8 5 6: 7 is the coming token's guess
    assert ngram.propose_behind(context, 2) == [8, 5] and ngram.match == 2
    assert ngram.propose_behind(context, 9) == [8, 5, 6]  # stops at the end of the context
    assert ngram.propose_behind(context, 0) == []  # K = 0: a plain step
    assert ngram.propose_behind([1, 2, 3, 1], 3) == [] and ngram.match == 0  # no 2-gram
    assert ngram.propose_behind([1, 2, 3, 1, 2], 3) == [1, 2]  # guess 3, then 1 2
    assert NgramDrafter(2, 4).propose_behind([7, 7, 7], 3) == []  # guess: the last token, no more
    hybrid = HybridDrafter(NgramDrafter(1, 4), _NeverDrafter(), min_match=2, free_k=3)
    assert hybrid.propose_behind([4, 9, 4], 0) == []  # a 1-gram is below the hybrid's min match
    hybrid = HybridDrafter(NgramDrafter(1, 4), _NeverDrafter(), min_match=2, free_k=3)
    assert hybrid.propose_behind(context, 0) == [8, 5, 6] and hybrid.method == "ngram"
    assert hybrid.propose_behind(context, 1) is None  # K > 0: the model drafts, the run ends


# ---------------------------------------------------------------------------- engine: greedy


@pytest.mark.parametrize(
    "spec",
    [
        SpecConfig(k=4, method="ngram"),
        SpecConfig(k=2, method="ngram", ngram_min=2, ngram_max=3),
        SpecConfig(k=4, method="hybrid", ngram_min=1, ngram_max=1),  # unigram matches
        SpecConfig(k=4, method="hybrid"),
        SpecConfig(k=3, method="draft", adaptive=True),
        SpecConfig(k=4, method="ngram", adaptive=True),
        SpecConfig(k=4, method="hybrid", adaptive=True, k_max=6),
    ],
    ids=[
        "ngram",
        "ngram-2-3",
        "hybrid-1",
        "hybrid",
        "adaptive",
        "adaptive-ngram",
        "adaptive-hybrid",
    ],
)
def test_greedy_output_equals_plain_decoding(tiny_models, spec):
    engine = Engine(*tiny_models)
    ids = engine.encode_raw(PROMPT) * 2  # a prompt that repeats: the lookups find matches
    plain = _ids(_gen(engine, ids, SpecConfig(method="none"), 48))
    events = _gen(engine, ids, spec, 48)
    assert _ids(events) == plain and len(plain) == 48
    rounds = _rounds(events)
    long = [r for r in rounds if spec.long_match and r.match >= spec.long_match]
    assert all(r.drafted <= r.k <= spec.k_max for r in rounds if r not in long)
    assert all(r.method == "ngram" and r.drafted <= spec.ngram_long_k for r in long)
    if spec.method != "draft":
        assert any(r.method == "ngram" and r.drafted > 0 for r in rounds)  # lookup really drafted
    # A tiny random target never continues a copy, so lookups here are rejected: accepted
    # lookups are tested with chosen drafts (test_drafts_one_token_behind_*, the point-mass test)
    # and with the real model (tests/test_real_model.py).


def test_confident_drafter_greedy_equals_plain_and_stops_early(tiny_models):
    engine = Engine(*tiny_models)
    ids = engine.encode_raw(PROMPT)
    plain = _ids(_gen(engine, ids, SpecConfig(method="none"), 40))
    drafter = ConfidentDrafter(engine._draft, GREEDY, engine._vocab, stop_below=0.5)
    events = _gen(engine, ids, SpecConfig(k=6), 40, drafter=drafter)
    assert _ids(events) == plain
    drafted = [r.drafted for r in _rounds(events)]
    assert min(drafted) < 6  # some rounds stopped early ...
    assert max(drafted) > 0  # ... and some drafted
    assert engine._draft.offset == len(engine._draft.tokens)


def test_round_events_carry_the_policy_k(tiny_models):
    engine = Engine(*tiny_models)
    script = [1, 3, 2, 5, 4, 1, 6]
    calls: list[Round | None] = []

    def policy(last: Round | None) -> int:
        calls.append(last)
        return script[(len(calls) - 1) % len(script)]

    events = _gen(engine, engine.encode_raw(PROMPT), SpecConfig(k=2), 30, k_policy=policy)
    rounds = _rounds(events)
    assert [r.k for r in rounds] == [script[i % len(script)] for i in range(len(rounds))]
    assert calls[0] is None and calls[1:] == rounds[: len(calls) - 1]


def test_adaptive_round_events_record_the_chosen_k(tiny_models):
    engine = Engine(*tiny_models)
    policy = AdaptiveK(k_init=2, k_max=7)
    events = _gen(engine, engine.encode_raw(PROMPT), SpecConfig(k=2), 40, k_policy=policy)
    rounds = _rounds(events)
    assert [r.k for r in rounds] == policy.chosen[: len(rounds)]
    assert rounds[0].k == 2 and all(0 <= r.k <= 7 for r in rounds)
    assert all(r.drafted == 0 and r.accepted == 0 for r in rounds if r.k == 0)  # plain steps


@pytest.mark.parametrize("method", ["draft", "hybrid"])
def test_k0_rounds_are_plain_steps_and_output_stays_exact(tiny_models, method):
    """A policy alternating K = 0 and K = 3: greedy output still equals plain decoding, K = 0 rounds
    of the draft method commit one "target" token without drafting, and the draft cache (which
    lags behind during K = 0 rounds) catches up."""
    engine = Engine(*tiny_models)
    ids = engine.encode_raw(PROMPT)
    plain = _ids(_gen(engine, ids, SpecConfig(method="none"), 48))
    calls = iter(range(1000))
    events = _gen(engine, ids, SpecConfig(k=3, method=method), 48,
                  k_policy=lambda last: 0 if next(calls) % 2 else 3)  # fmt: skip
    assert _ids(events) == plain
    rounds = _rounds(events)
    assert {r.k for r in rounds} >= ({0, 3} if method == "draft" else {3})
    tokens = [e for e in events if isinstance(e, Token)]
    kinds_of_k0 = {t.kind for t, r in _token_rounds(events) if r.k == 0}
    if method == "draft":
        assert kinds_of_k0 == {"target"} and all(r.drafted == 0 for r in rounds if r.k == 0)
    else:  # hybrid: K = 0 rounds still look up n-grams (k reports the lookup's length)
        assert any(r.method == "ngram" and r.drafted > 0 for r in rounds)
    assert len(tokens) == 48
    assert engine._draft.offset == len(engine._draft.tokens)


class RoundByRound:
    """A draft-model drafter whose K = 0 rounds go through speculate's round path (a drafter with
    a `propose_free` is not pipelined): the reference for the pipelined plain runs."""

    method = "draft"

    def __init__(self, inner):
        self.inner = inner

    def propose(self, context, k, key):
        return self.inner.propose(context, k, key)

    def commit(self, context):
        self.inner.commit(context)

    def propose_free(self, context, key):
        return no_proposal()


SCRIPT = [3, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0]  # runs of K = 0 of lengths 6, 3 and 2


def _scripted(calls: list):
    def policy(last):
        calls.append(last)
        return SCRIPT[(len(calls) - 1) % len(SCRIPT)]

    return policy


@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(0.8, seed=5)], ids=["greedy", "t0.8"])
def test_pipelined_plain_runs_equal_the_round_path_token_for_token(tiny_models, sampling):
    """Runs of K = 0 rounds are pipelined (the next forward is queued before the current token is
    read back): same keys and maths as one d = 0 round at a time, so the same tokens, kinds and
    round records at T > 0 too, and greedy output equals plain decoding."""
    engine = Engine(*tiny_models)
    ids = engine.encode_raw(PROMPT)
    runs = {}
    for name, wrap in (("pipelined", lambda d: d), ("round by round", RoundByRound)):
        drafter = wrap(ModelDrafter(engine._draft, sampling, engine._vocab))
        engine.reset()
        calls: list = []
        events = _gen(engine, ids, SpecConfig(k=3), 60, sampling, drafter=drafter,
                      k_policy=_scripted(calls))  # fmt: skip
        rounds = _rounds(events)
        runs[name] = (
            [(e.id, e.kind) for e in events if isinstance(e, Token)],
            [(r.index, r.drafted, r.accepted, r.k) for r in rounds],
        )
        assert [r.k for r in rounds] == [SCRIPT[i % len(SCRIPT)] for i in range(len(rounds))]
        seen = [c.index for c in calls if c is not None]
        once = [i for n, i in enumerate(seen) if n == 0 or seen[n - 1] != i]
        assert once == sorted(set(seen))  # rounds reach the policy in order (a repeat: in a row)
        assert all(c is None or c.index >= i - 2 for i, c in enumerate(calls))  # at most 1 late
        assert engine._target.offset == len(engine._target.tokens)
    assert runs["pipelined"] == runs["round by round"]
    assert len(runs["pipelined"][0]) == 60
    if sampling.greedy:
        plain = _ids(_gen(engine, ids, SpecConfig(method="none"), 60))
        assert [t for t, _ in runs["pipelined"][0]] == plain


@pytest.mark.parametrize("stop_at", [3, 6])  # inside a plain run; its last round
def test_cancel_inside_a_pipelined_plain_run_leaves_consistent_caches(tiny_models, stop_at):
    engine = Engine(*tiny_models)
    ids = engine.encode_raw(PROMPT)
    cancel = threading.Event()
    committed, events = list(ids), []
    gen = engine.generate(ids, GenerationConfig(GREEDY, SpecConfig(k=3), max_tokens=60), cancel,
                          k_policy=_scripted([]))  # fmt: skip
    for event in gen:
        events.append(event)
        if isinstance(event, Token):
            committed.append(event.id)
        if isinstance(event, Round) and event.index == stop_at:
            cancel.set()
    assert isinstance(events[-1], Finished) and events[-1].reason == "cancelled"
    assert _rounds(events)[-1].index == stop_at
    t_tokens, d_tokens = engine.cached_tokens()
    assert engine._target.offset == len(t_tokens) == len(committed) - 1
    assert t_tokens == committed[:-1] and d_tokens == committed[: len(d_tokens)]
    assert engine._draft.offset == len(d_tokens)
    plain = _ids(_gen(Engine(*tiny_models), ids, SpecConfig(method="none"), 60))
    assert _ids(_gen(engine, ids, SpecConfig(k=3), 60)) == plain  # and the next request is exact


def _token_rounds(events):
    """(token, the round that committed it) pairs: a Round follows its round's tokens."""
    out, pending = [], []
    for e in events:
        if isinstance(e, Token):
            pending.append(e)
        elif isinstance(e, Round):
            out += [(t, e) for t in pending]
            pending = []
    return out


# ---------------------------------------------------------------------------- hybrid caches


def test_hybrid_caches_stay_consistent_and_the_draft_catches_up(tiny_self_models):
    """Self-draft (draft == target): every draft-model round must accept all K at greedy, which
    holds only if the draft's cache caught up exactly with the tokens the n-gram rounds committed."""
    engine = Engine(*tiny_self_models)
    ids = engine.encode_raw(PROMPT) * 2  # the suffix occurred before: round 0 is an n-gram round
    cfg = GenerationConfig(
        GREEDY, SpecConfig(k=3, method="hybrid", ngram_min=1, ngram_max=1), max_tokens=60
    )
    committed, methods = list(ids), []
    for event in engine.generate(ids, cfg):
        if isinstance(event, Token):
            committed.append(event.id)
        elif isinstance(event, Round):
            methods.append(event.method)
            target, draft = engine.cached_tokens()
            assert target == committed[:-1] and len(target) == engine._target.offset
            assert draft == committed[: len(draft)] and len(draft) == engine._draft.offset
            if event.method == "draft":
                assert event.accepted == event.drafted == 3
    assert "ngram" in methods and "draft" in methods
    i = methods.index("ngram")
    assert "draft" in methods[i:]  # a model round after an n-gram round (the catch-up case)


def test_hybrid_switches_method_per_round():
    class Fixed:
        method = "draft"

        def __init__(self):
            self.commits: list[list[int]] = []

        def propose(self, context, k, key):
            return NgramDrafter().propose([1, 1], k)  # [1] from a trivial lookup

        def commit(self, context):
            self.commits.append(list(context))

    model = Fixed()
    hybrid = HybridDrafter(NgramDrafter(1, 3), model, min_match=2)
    hybrid.propose([4, 5, 6, 4, 5], 2, mx.random.key(0))
    assert hybrid.method == "ngram"
    hybrid.propose([4, 5, 6, 7], 2, mx.random.key(0))
    assert hybrid.method == "draft"
    hybrid.commit([4, 5, 6, 7, 1])
    assert model.commits == [[4, 5, 6, 7, 1]]


def test_build_drafter_errors_and_choices(tiny_models):
    engine = Engine(tiny_models[0], None)
    assert isinstance(
        build_drafter(SpecConfig(method="ngram"), GREEDY, None, 10, "x"), NgramDrafter
    )
    for method in ("draft", "hybrid"):
        with pytest.raises(ConfigError, match="no draft model"):
            list(engine.generate([1, 2, 3], GenerationConfig(GREEDY, SpecConfig(method=method))))
    events = _gen(engine, engine.encode_raw(PROMPT), SpecConfig(k=3, method="ngram"), 8)
    assert len(_ids(events)) == 8  # n-gram needs no draft model


# ---------------------------------------------------------------------------- T > 0: exactness

N_SEEDS = 600  # ~15 ms per 2-token generation on a tiny model


def _target_probs(engine: Engine, ids: list[int], sampling: SamplingConfig) -> np.ndarray:
    logits = engine.target.model(mx.array(ids)[None])[0, -1]
    return np.array(warp(logits, sampling))


def _chi2(samples: list[int], p: np.ndarray) -> float:
    """p-value of a chi-square test of samples against p, small-expectation bins pooled."""
    p = p.astype(np.float64)
    counts = np.bincount(samples, minlength=p.size).astype(np.float64)
    expected = p * len(samples)
    big = expected >= 5
    assert counts[p == 0].sum() == 0  # never a token the target excludes
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    return chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue


def _context_the_target_likes(engine: Engine, base: list[int]) -> list[int]:
    """base + [y] + base with y = argmax_y p(y | base + [y] + base): the n-gram then proposes y,
    a token the target gives real probability, so both accept and reject paths get exercised."""
    vocab = engine._vocab
    batch = mx.array([base + [y] + base for y in range(vocab)])
    probs = mx.softmax(engine.target.model(batch)[:, -1].astype(mx.float32), axis=-1)
    y = int(mx.argmax(probs[mx.arange(vocab), mx.arange(vocab)]).item())
    return base + [y] + base


def test_ngram_point_mass_rounds_emit_the_target_distribution(tiny_models):
    """Round 0 is always an n-gram proposal (x_1, x_2) (the suffix occurred before). Token 1 must
    follow p(. | context) and, when x_1 was accepted, token 2 must follow p(. | context, x_1)."""
    engine = Engine(tiny_models[0], None)
    ids = _context_the_target_likes(engine, engine.encode_raw(PROMPT))
    sampling = SamplingConfig(temperature=1.0)
    spec = SpecConfig(k=2, method="ngram", ngram_min=2, ngram_long=0)  # exactly 2 tokens
    x = NgramDrafter(2, 8).propose(ids, 2).tokens.tolist()
    assert len(x) == 2
    first, second = [], []
    for seed in range(N_SEEDS):
        cfg = GenerationConfig(SamplingConfig(temperature=1.0, seed=seed), spec, max_tokens=2)
        events = list(engine.generate(ids, cfg))
        toks, r = _ids(events), _rounds(events)[0]
        assert r.method == "ngram" and r.drafted == 2
        first.append(toks[0])
        if toks[0] == x[0]:
            second.append(toks[1])
    p1 = _target_probs(engine, ids, sampling)
    p2 = _target_probs(engine, ids + [x[0]], sampling)
    assert _chi2(first, p1) > 1e-3
    assert len(second) > 50 and _chi2(second, p2) > 1e-3
    # x_1 is accepted with probability p(x_1): a binomial check, 4 sigma.
    rate, px = len(second) / N_SEEDS, p1[x[0]]
    assert abs(rate - px) < 4 * np.sqrt(px * (1 - px) / N_SEEDS)


class BehindOnce:
    """A lookup-like drafter whose fresh lookups always miss, so the loop runs plain steps
    pipelined (loop._plain_run), and which proposes `drafts` one token behind once: while the
    token after `at` committed tokens is being computed. The run's next step then verifies them,
    queued with that token still unknown."""

    method = "ngram"

    def __init__(self, at: int, drafts: list[int]):
        self.at, self.drafts, self.calls = at, drafts, 0

    def propose(self, context, k, key):
        return no_proposal()

    def propose_behind(self, context, k):
        self.calls += 1
        return list(self.drafts) if len(context) == self.at else []

    def commit(self, context):
        pass


def test_drafts_one_token_behind_emit_the_target_distribution(tiny_models):
    """Plain step x_m ~ p(. | C), queued behind it [x_m, d] with d proposed before x_m was known.
    x_m must follow p(. | C), x_m+1 must follow p(. | C, x_m) (checked given the likeliest x_m = y,
    with d = argmax p(. | C, y) so both the accept and the reject path run), d is accepted with
    probability p(d | C, y), and after an accepted d the next token follows p(. | C, y, d)."""
    engine = Engine(tiny_models[0], None)
    ids = _context_the_target_likes(engine, engine.encode_raw(PROMPT))
    sampling = SamplingConfig(temperature=1.0)
    p0 = _target_probs(engine, ids, sampling)
    y = int(np.argmax(p0))
    p1 = _target_probs(engine, ids + [y], sampling)
    d = int(np.argmax(p1))
    p2 = _target_probs(engine, ids + [y, d], sampling)
    first, second, third = [], [], []
    for seed in range(N_SEEDS):
        drafter = BehindOnce(len(ids), [d])
        cfg = GenerationConfig(SamplingConfig(temperature=1.0, seed=seed), SpecConfig(k=1), 3)
        events = list(engine.generate(ids, cfg, drafter=drafter))
        toks, rounds = _ids(events), _rounds(events)
        assert [(r.drafted, r.method) for r in rounds[:2]] == [(0, "ngram"), (1, "ngram")]
        assert len(toks) == 3
        first.append(toks[0])
        if toks[0] == y:
            second.append(toks[1])
            if toks[1] == d:
                assert rounds[1].accepted == 1  # d itself, accepted: then the bonus
                third.append(toks[2])
    assert _chi2(first, p0) > 1e-3
    assert len(second) > 100 and _chi2(second, p1) > 1e-3
    rate = sum(t == d for t in second) / len(second)
    assert abs(rate - p1[d]) < 4 * np.sqrt(p1[d] * (1 - p1[d]) / len(second))
    assert len(third) > 30 and _chi2(third, p2) > 1e-3


def test_drafts_one_token_behind_keep_greedy_output_and_caches(tiny_models):
    """Greedy: the drafted step commits the target's own tokens (drafts accepted or not), and the
    cache holds exactly the committed context after it; a bad guess is only rejected."""
    engine = Engine(tiny_models[0], None)
    ids = engine.encode_raw(PROMPT)
    plain = _ids(_gen(engine, ids, SpecConfig(method="none"), 12))
    accepted = []
    bad = (plain[3] + 1) % engine._vocab
    for drafts in ([plain[2]], plain[2:5], [plain[2], bad], [bad, plain[3]]):
        engine.reset()
        drafter = BehindOnce(len(ids) + 1, drafts)  # after x_m: drafts for x_m+2 ...
        events = _gen(engine, ids, SpecConfig(k=1), 12, drafter=drafter)
        assert _ids(events) == plain
        rounds = _rounds(events)
        r = rounds[2]
        # Timed (Round.timed): only plain steps with a plain step queued behind them, not a
        # run's first. Untimed: the run's first step, the one the drafts were queued behind, the
        # drafted step; then a new run (lookups miss): its first, and its last (nothing queued
        # behind it at max_tokens).
        timed = [x.timed for x in rounds]
        assert timed == [False, False, False, False] + [True] * (len(rounds) - 5) + [False]
        good = 0
        while good < len(drafts) and drafts[good] == plain[2 + good]:
            good += 1
        assert (r.drafted, r.accepted) == (len(drafts), good)
        accepted.append(good)
        assert engine._target.offset == len(engine._target.tokens) == len(ids) + 11
    assert accepted == [1, 3, 1, 0]


@pytest.mark.parametrize("policy_k", [0, 1], ids=["free-lookups-at-k0", "lookups-longer-than-k"])
def test_hybrid_lookups_stay_inside_the_context_window(tiny_models, policy_k):
    """Hybrid n-gram lookups propose up to max(K, ngram_k) tokens, also in K = 0 rounds; like any
    proposal they must fit the context window: a round starting with C committed tokens verifies
    at most window - C."""
    near_the_end = longer_than_k = 0
    for window in range(56, 72):
        records = (SimpleNamespace(**{**vars(m), "context_window": window}) for m in tiny_models)
        engine = Engine(*records)
        ids = engine.encode_raw(PROMPT)
        # unigram lookups: matches abound
        spec = SpecConfig(k=1, method="hybrid", ngram_min=1, ngram_max=1, ngram_k=6)
        events = _gen(engine, ids, spec, 500, k_policy=lambda _last: policy_k)
        committed = before = len(ids)  # tokens committed, and when the current round began
        for e in events:
            if isinstance(e, Token):
                committed += 1
            elif isinstance(e, Round):
                assert e.drafted <= window - before, (window, before, e)
                near_the_end += e.drafted > 0 and window - before < 6
                longer_than_k += e.method == "ngram" and e.drafted > 1
                before = committed
        assert events[-1].reason == "length"
    assert near_the_end > 0  # some lookups really were cut by the window
    assert longer_than_k > 0  # lookups are not held to the model's K


@pytest.mark.parametrize("k, n_min, long", [(1, 1, 6), (1, 2, 4), (2, 1, 0), (3, 2, 6), (1, 1, 0)])
def test_replayed_ngram_rounds_are_the_rounds_the_loop_runs(tiny_models, k, n_min, long):
    """ngram.replay_rounds, which chose the n-gram defaults on real answers without running a
    model, predicts every (drafted, accepted) pair of the loop's greedy n-gram rounds: direct
    lookups, pipelined plain steps and their one-behind proposals, long matches' long proposals
    (long > 0) alike. (On this prompt the tiny target repeats itself enough for accepted,
    rejected and plain rounds to occur at every k.)"""
    from edgespec.drafting.ngram import replay_rounds

    engine = Engine(tiny_models[0], None)
    ids = engine.encode_raw("1 2 3 4 1 2 3 4 1 2 3 4")
    n = 120
    spec = SpecConfig(k=k, method="ngram", ngram_min=n_min, ngram_long=long)
    answer = _ids(_gen(engine, ids, SpecConfig(method="none"), n + spec.ngram_long_k + 1))
    events = _gen(engine, ids, spec, n)
    assert _ids(events) == answer[:n]
    loop = [(r.drafted, r.accepted) for r in _rounds(events)]
    replay = replay_rounds(ids, answer, k, n, n_min, spec.ngram_max, long, spec.ngram_long_k)
    assert loop == replay
    assert any(d > k for d, _ in loop) == (long > 0)  # long matches proposed long, if on
    assert any(a for _, a in loop) and any(a < d for d, a in loop) and (0, 0) in loop
