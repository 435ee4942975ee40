"""Adaptive K (edgespec.drafting.adaptive): the closed-form choice of K (best_k, against
hand-worked rates), the verify-cost curve, AdaptiveK's estimates (acceptance per method, draft and
verify costs, stalls, repeats, probes while drafting is off), and its K in the Round events."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from edgespec.config import SpecConfig
from edgespec.drafting.adaptive import (
    PRICE_STEPS,
    TIE_TOLERANCE,
    AdaptiveK,
    DrafterEstimate,
    seed_and_rows,
)
from edgespec.drafting.costs import PROBE_MAX, Probes, best_k, fit_verify_line, verify_curve
from edgespec.events import Round, expected_tokens_per_round
from tests.helpers import PROMPT, ask, gen, rounds_of

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
    assert ask(policy, None) == 3  # nothing measured yet
    # One round: 4 drafted, 2 accepted (one rejection); draft 0.04 s -> c = 0.01 s per token;
    # verify of 5 tokens 0.14 s.
    k = ask(policy, _round(0, 4, 2, 3, 0.04, 0.14))
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
        kh = ask(
            high, _round(i, 4, 4, 4, 0.004, 0.1 + 0.004 * 4)
        )  # everything accepted, cheap draft
        kl = ask(low, _round(i, 4, 0, 4, 0.04, 0.1 + 0.01 * 4))  # nothing accepted, costly draft
    assert kh == 8 and kl == 1


def test_adaptive_k_switches_a_useless_draft_off_and_probes_with_doubling_gaps():
    policy = AdaptiveK(4, 8)
    chosen = [ask(policy, None)]
    for i in range(200):  # a draft that is never accepted and costs 40% of a target step
        k = chosen[-1]
        chosen.append(ask(policy, _round(i, k, 0, k, 0.04 * k, 0.1 + 0.005 * k)))
    drafted = [i for i, k in enumerate(chosen) if k > 0]
    # A few measured rounds turn it off: it goes off only once plain wins even at alpha's upper
    # bound (AdaptiveK.choose), which takes two rejections after the first round.
    assert chosen[:4] == [4, 1, 1, 0]
    gaps = np.diff(drafted[2:]).tolist()  # between drafting rounds: 8, 16, 32, 64, 64 plain rounds
    assert gaps[:5] == [9, 17, 33, 65, 65], gaps
    assert all(chosen[i] == 1 for i in drafted[1:])  # probes draft the best K >= 1


def test_a_probe_that_costs_more_than_a_small_share_of_its_gap_waits_for_a_longer_one():
    """A useless draft at 2 steps a token: a probe loses 2.05 plain steps (0.2 + 0.105 s against
    0.1 s a step, one token; a little less while alpha's estimate is not yet 0), over 5%
    (REVIEW_SHARE) of the 8-32 plain rounds of the schedule, so each waits for ~40 rounds (then
    the schedule's 64). Without the price they came after 8, 16, 32 (the test above): ~7% of the
    answer lost to probes instead of ~5%."""
    policy = AdaptiveK(4, 8)
    chosen = [ask(policy, None)]
    for i in range(300):
        k = chosen[-1]
        chosen.append(ask(policy, _round(i, k, 0, k, 0.2 * k, 0.1 + 0.005 * k)))
    drafted = [i for i, k in enumerate(chosen) if k > 0]
    gaps = np.diff(drafted[2:]).tolist()
    assert all(37 <= g <= 42 for g in gaps[:3]) and gaps[3:5] == [65, 65], gaps


def test_a_priced_probe_never_waits_past_the_longest_gap():
    """The price is an estimate (a stall's, below, keeps a draft off): a probe priced dear
    forever still comes after PROBE_MAX rounds."""
    probes = Probes()
    runs = [probes.probe(lambda rounds: False) for _ in range(3 * PROBE_MAX)]
    when = [i + 1 for i, p in enumerate(runs) if p]
    assert when == [PROBE_MAX + 1, 2 * PROBE_MAX + 2], when


def _switched_off(chosen: list[int]) -> int:
    """Rounds of K = 0 besides one price check's PRICE_STEPS plain steps in a row."""
    zeros = chosen.count(0)
    check = [0] * PRICE_STEPS
    has_check = any(chosen[i : i + PRICE_STEPS] == check for i in range(len(chosen)))
    return zeros - PRICE_STEPS if has_check else zeros


def test_an_unlucky_streak_does_not_switch_a_paying_draft_off(monkeypatch):
    # A draft accepted 40% of the time at 12% of a step's cost pays ~14% over plain here; eight
    # rejections in a row drop alpha's estimate (~10 rounds of memory) to where plain looks
    # better. It is switched off only if plain wins at alpha's upper bound too.
    def run():
        policy = AdaptiveK(1, 1)
        k = ask(policy, None)
        for i, acc in enumerate([1, 0, 1, 0, 0] * 6 + [0] * 8):
            k = ask(policy, _round(i, k, min(acc, k), k, 0.012 * k, 0.1 if k else 0.092))
        return policy.chosen

    assert _switched_off(run()) == 0
    monkeypatch.setattr(DrafterEstimate, "alpha_upper", DrafterEstimate.alpha)
    assert 0 in run()  # on the estimate alone, the streak switches it off


def test_adaptive_k_turns_drafting_back_on_when_probes_succeed():
    policy = AdaptiveK(4, 8)
    k = ask(policy, None)
    for i in range(20):  # useless draft first ...
        k = ask(policy, _round(i, k, 0, k, 0.04 * k, 0.1 + 0.005 * k))
    assert k == 0 or policy.chosen[-2] == 0
    for i in range(20, 120):  # ... then every drafted token is accepted and drafting is cheap
        k = ask(policy, _round(i, k, k, k, 0.002 * k, 0.1 + 0.005 * k))
    assert policy.chosen[-10:] == [8] * 10


def test_adaptive_k_leaves_the_catch_up_after_plain_rounds_out_of_the_draft_cost():
    # A probe after K = 0 rounds feeds the draft every token committed meanwhile: a slow round that
    # says nothing about the cost of drafting. Counting it kept a good draft switched off.
    policy = AdaptiveK(1, 4)
    k = ask(policy, None)
    for i in range(12):  # rejected drafts: drafting is switched off
        k = ask(policy, _round(i, k, 0, k, 0.01 * k, 0.1 + 0.005 * k))
        if i > 2 and k == 0:
            break
    cost = policy.estimates["draft"].draft_cost
    assert policy.chosen[-1] == 0 and cost == pytest.approx(0.01)
    i += 1
    while k == 0:  # plain rounds until the probe
        k, i = ask(policy, _round(i, 0, 0, 0, 0.0, 0.1)), i + 1
    samples = list(policy.estimates["draft"].step_costs.samples)
    k = ask(policy, _round(i, k, k, k, 0.5, 0.1 + 0.005 * k))  # probe: all accepted, 0.5 s catch-up
    assert list(policy.estimates["draft"].step_costs.samples) == samples  # left out
    assert k > 0  # the accepted probe turns drafting back on
    ask(policy, _round(i + 1, k, k, k, 0.02 * k, 0.1 + 0.005 * k))  # a steady round is timed
    assert policy.estimates["draft"].step_costs.samples[-1] == pytest.approx(0.02)


def test_a_hybrids_draft_catching_up_after_a_lookup_is_not_the_cost_of_drafting():
    # A lookup commits several tokens; the draft model's next round first feeds them all. At 8K
    # tokens on a CPU such rounds put the median draft cost at 1.5-2.5x a step's.
    policy = AdaptiveK(1, 4, model="draft")
    ask(policy, None)
    for i in range(0, 12, 2):
        ask(policy, _round(i, 4, 3, 4, 1e-5, 0.12, method="ngram"))
        ask(policy, _round(i + 1, 1, 0, 1, 0.05, 0.12))  # catching up: dear
    assert policy.estimates["draft"].draft_cost is None  # no steady round timed yet
    for i in range(12, 18):
        ask(policy, _round(i, 1, 1, 1, 0.01, 0.12))
    assert policy.estimates["draft"].draft_cost == pytest.approx(0.01)
    ask(policy, _round(18, 4, 3, 4, 1e-5, 0.12, method="ngram"))
    ask(policy, _round(19, 1, 0, 1, 0.004, 0.12))  # cheaper than the estimate: a bound, kept
    assert policy.estimates["draft"].step_costs.samples[-1] == pytest.approx(0.004)


def test_adaptive_k_leaves_overlapped_rounds_out_of_the_costs_but_counts_their_acceptance():
    # A pipelined plain step read late (0.3 s) and the lookup queued behind it, read early
    # (0.01 s): counted, the lookup's 4 tokens looked cheaper than a plain step.
    policy = AdaptiveK(1, 8)
    ask(policy, None)
    for i in range(6):
        ask(policy, _round(i, 1, 1, 1, 0.001, 0.11, "ngram"))
        ask(policy, _round(i, 0, 0, 0, 0.0, 0.1, "ngram"))
    before = {L: list(m.samples) for L, m in policy.verify_costs.items()}
    alpha = policy.estimates["ngram"].alpha
    ask(policy, Round(6, 0, 0, 0, 0.0, 0.3, "ngram", timed=False))
    ask(policy, Round(7, 4, 1, 4, 0.0, 0.01, "ngram", timed=False))
    assert {L: list(m.samples) for L, m in policy.verify_costs.items()} == before
    assert 5 not in policy.verify_costs
    assert policy.estimates["ngram"].draft_cost == pytest.approx(0.001)
    assert policy.estimates["ngram"].alpha < alpha  # its rejection still counts
    ask(policy, Round(8, 4, 1, 4, 0.0, 0.15, "ngram"))  # the same lookup in a round of its own
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
    k = ask(policy, None)
    for i in range(40):  # 45% of drafts accepted, a draft step costs 12% of a target step
        accepted = [0, 1, 0, 1, 2, 0, 1, 0, 1, 3][i % 10] if k else 0
        accepted = min(accepted, k)
        k = ask(policy, _round(i, k, accepted, k, 0.012 * k, cost[k + 1]))
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
    k = ask(policy, None)
    for i in range(10):  # a good draft: everything accepted, cheap
        k = ask(policy, _round(i, k, k, k, 0.01 * k, 0.1 + 0.005 * k))
    steady = k
    k = ask(policy, _round(10, k, k, k, 48.0, 0.1 + 0.005 * k))  # a stalled draft
    k = ask(policy, _round(11, k, k, k, 0.01 * k, 48.0))  # a stalled verify
    assert k == steady > 0
    for i in range(12, 20):
        k = ask(policy, _round(i, k, k, k, 0.01 * k, 0.1 + 0.005 * k))
    assert 0 not in policy.chosen and policy.chosen[-1] == steady


def test_adaptive_k_keeps_estimates_per_method():
    policy = AdaptiveK(4, 8, allow_plain=False)
    for i in range(20):
        ask(policy, _round(i, 4, 0, 4, 0.04, 0.14, method="draft"))
    k_ngram = ask(policy, _round(20, 3, 3, 4, 1e-5, 0.13, method="ngram"))
    k_draft = ask(policy, _round(21, 4, 0, 4, 0.04, 0.14, method="draft"))
    assert policy.estimates["ngram"].alpha > 0.7 > 0.2 > policy.estimates["draft"].alpha
    assert k_ngram > k_draft == 1


def test_adaptive_k_counts_long_match_lookups_apart():
    # Long-match lookups (Round.match >= long_match) are accepted whole; short ones rarely. The
    # lookup length for short matches must come from the short ones alone.
    policy = AdaptiveK(1, 8, long_match=6)
    for i in range(0, 30, 2):
        ask(policy, Round(i, 8, 8, 8, 1e-5, 0.2, "ngram", match=7))
        ask(policy, Round(i + 1, 1, 0, 1, 1e-5, 0.1, "ngram", match=2))
    assert policy.estimates["ngram-long"].alpha > 0.9 > 0.2 > policy.estimates["ngram"].alpha
    assert policy.lookup_k("ngram", 4) == 1
    mixed = AdaptiveK(1, 8)  # long_match 0: one estimate, which the long rounds inflate
    for i in range(0, 30, 2):
        ask(mixed, Round(i, 8, 8, 8, 1e-5, 0.2, "ngram", match=7))
        ask(mixed, Round(i + 1, 1, 0, 1, 1e-5, 0.1, "ngram", match=2))
    assert mixed.estimates["ngram"].alpha > 0.5 and mixed.lookup_k("ngram", 4) > 1


@pytest.mark.parametrize("row", [0.01, 1.0], ids=["short-context", "32k-xeon"])
def test_a_long_match_lookup_is_as_long_as_its_verify_rows_pay(row):
    """Long-match lookups accepted 90% of the time, verified at 1 + `row` plain steps a row.
    Where rows are cheap (a short context) they keep the configured length (5); where a row
    costs a plain step (the xeon profile at 32K: research/replay/), a 5-token lookup, even all
    accepted, costs as much as the six plain steps it saves, and long lookups go off."""
    policy = AdaptiveK(4, 8, model="draft", long_match=8)
    for i in range(0, 40, 2):
        ask(policy, Round(i, 5, 4 + (i % 10 > 0), 5, 1e-5, 1 + 5 * row, "ngram", match=9))
        ask(policy, Round(i + 1, 0, 0, 0, 0.0, 1.0, "draft"))
        ask(policy, Round(i + 1, 1, 1, 1, 0.05, 1 + row, "draft"))
    assert policy.estimates["ngram-long"].alpha > 0.85
    assert policy.long_k(5) == (5 if row < 0.5 else 0)
    assert AdaptiveK(4, 8, model="draft", long_match=8).long_k(5) == 5  # unmeasured: as set


def test_adaptive_k_for_a_hybrid_gives_the_model_its_own_k_and_the_lookup_its_own():
    # Choosing from whoever drafted last handed a lookup's K (alpha ~0.9, no draft cost) to the
    # draft model as soon as the next lookup missed.
    policy = AdaptiveK(4, 8, allow_plain=False, model="draft")
    for i in range(20):
        ask(policy, _round(i, 4, 0, 4, 0.04, 0.14, method="draft"))
    k = ask(policy, _round(20, 4, 4, 4, 1e-5, 0.13, method="ngram"))
    assert k == 1  # the draft model's K, though the last round was an accepted lookup
    assert policy.lookup_k("ngram", 4) > 1  # the lookup proposes more
    assert AdaptiveK(4, 8).lookup_k("ngram", 3) == 3  # nothing measured: the default
    free = AdaptiveK(4, 8)  # without model=, the last round's method decides (pure drafters)
    for i in range(20):
        ask(free, _round(i, 4, 0, 4, 0.04, 0.14, method="draft"))
    assert ask(free, _round(20, 4, 4, 4, 1e-5, 0.13, method="ngram")) > 1


def _lookup_rounds(policy: AdaptiveK, two_rows: float, rounds: int = 40) -> list[int]:
    """Show a hybrid's policy plain steps of 0.10 s and one-token lookups accepted one time in
    four (a sampled answer) whose 2-row verify takes `two_rows` s; the lookup lengths it sets."""
    lengths = []
    for i in range(rounds):
        if i % 2:
            ask(policy, _round(i, 0, 0, 0, 0.0, 0.10))
        else:
            ask(policy, _round(i, 1, int(i % 8 == 0), 1, 1e-5, two_rows, method="ngram"))
        lengths.append(policy.lookup_k("ngram", 4))
    return lengths


def test_a_hybrids_lookups_stop_where_their_verify_rows_cost_more_than_they_bring():
    # At 8K tokens on a CPU a 2-row verify costs ~1.8 plain steps: a lookup accepted 1 time in 4
    # brings 1.25 tokens for 1.8 steps, and proposing it anyway ran a sampled chat at 0.84x plain.
    long = _lookup_rounds(AdaptiveK(1, 8, model="draft"), two_rows=0.18)
    assert long[-1] == 0 and 0 < sum(n > 0 for n in long[10:]) <= 8  # off, save for probes
    # A short context: the second row is nearly free (1.05 steps), so the same lookups pay.
    short = _lookup_rounds(AdaptiveK(1, 8, model="draft"), two_rows=0.105)
    assert all(n > 0 for n in short)
    # Without K = 0 allowed, lookups are never switched off either.
    assert all(_lookup_rounds(AdaptiveK(1, 8, allow_plain=False, model="draft"), 0.18))


# ---------------------------------------------------------------------------- in the loop


def test_adaptive_round_events_record_the_chosen_k(engine):
    policy = AdaptiveK(k_init=2, k_max=7)
    events = gen(
        engine,
        engine.encode_raw(PROMPT),
        SpecConfig(k=2, method="draft", adaptive=False),
        40,
        k_policy=policy,
    )
    rounds = rounds_of(events)
    assert [r.k for r in rounds] == policy.chosen[: len(rounds)]
    assert rounds[0].k == 2 and all(0 <= r.k <= 7 for r in rounds)
    assert all(r.drafted == 0 and r.accepted == 0 for r in rounds if r.k == 0)  # plain steps


# ---------------------------------------------------------------------------- a fresh engine


def _drive(policy: AdaptiveK, rounds: int, first_draft: float) -> list[int]:
    """Feed `policy` the rounds it asks for: a draft that pays (7 of 8 drafts accepted, 0.01 s
    per drafted token, verify 0.1 s), except that the first drafting round's draft took
    `first_draft` seconds (a fresh engine compiling its kernels). Returns the K chosen."""
    last: Round | None = None
    for i in range(rounds):
        k = ask(policy, last)
        if k == 0:
            last = Round(i, 0, 0, 0, 0.0, 0.1)
        else:
            t = first_draft if i == 0 else 0.01 * k
            last = Round(i, k, k - (i % 8 == 0), k, t, 0.1 + 0.005 * k)
    return policy.chosen


def test_a_compile_timing_on_the_first_round_does_not_switch_the_draft_off() -> None:
    # 30 s for the first 4 drafts: the median of one timing said drafting costs 300 verifies.
    chosen = _drive(AdaptiveK(4, 8), 200, first_draft=30.0)
    assert _switched_off(chosen) == 0, chosen[:20]  # a price check at most


def test_probes_bring_back_a_draft_switched_off_on_stalled_timings() -> None:
    policy = AdaptiveK(4, 8)
    policy.seed({"draft": 30.0}, {2: 0.1})  # a stalled calibration
    for _ in range(2):  # two more stalled rounds: the median is dear, the draft goes off
        policy.observe(Round(0, 4, 4, 4, 120.0, 0.12))
    chosen = _drive(policy, 300, first_draft=0.04)
    assert 0 in chosen[:10]
    assert all(k > 0 for k in chosen[-50:]), chosen[-50:]


def test_a_seeded_block_draft_chooses_before_a_round_was_timed() -> None:
    """A calibration seeds a block draft's cost per drafted token; until a block round is timed
    (the first may not be: it can feed a prompt tail, Round.timed) its round cost is that cost
    times K, not a fit over no timings (which raised and ended the generation)."""
    policy = AdaptiveK(4, 8)
    policy.seed({"block": 0.01}, {1: 0.05, 2: 0.06, 5: 0.08})
    policy.decide()
    policy.observe(Round(0, 4, 2, 4, 0.04, 0.08, "block", timed=False))
    assert policy.estimates["block"].round_cost()(3) == pytest.approx(0.03)
    assert 0 <= policy.decide() <= 8


def test_a_calibrations_verify_costs_scale_with_the_runs_own() -> None:
    """A calibration is timed on a short prompt: at a long context the lengths this run never
    verified are priced at the seed times this run's own over seed ratio (median over shared
    lengths), not at the short prompt's cost, and a measured length is the run's own."""
    policy = AdaptiveK(4, 8)
    policy.seed({"draft": 0.01}, {1: 0.05, 2: 0.05, 3: 0.06, 9: 0.10})
    assert policy.verify_means == {1: 0.05, 2: 0.05, 3: 0.06, 9: 0.10}
    for _ in range(3):
        policy.observe(Round(0, 1, 1, 1, 0.01, 0.20, "draft"))  # L = 2 at 4x the seed
    assert policy.verify_means == pytest.approx({1: 0.2, 2: 0.2, 3: 0.24, 9: 0.4})


def _hopeless(policy: AdaptiveK, rounds: int, v1: float) -> list[int]:
    """Rounds of a draft whose first token passes 1 round in 4, on a machine where a 2-token
    verify costs 1.725 steps and a plain step v1 (an Apple M2's cliff: plain decoding wins)."""
    for i in range(rounds):
        k = policy.decide()
        if k == 0:
            policy.observe(Round(i, 0, 0, 0, 0.0, v1, "draft", timed=i > 0))
        else:
            n = 1 if i % 4 == 0 else 0
            policy.observe(Round(i, k, n, k, 0.1 * k, 1.725 + 0.05 * (k - 1), "draft"))
    return policy.chosen


def test_a_price_check_times_plain_steps_once_where_the_choice_hangs_on_them() -> None:
    """While drafting, a plain step is priced from the shortest verify (1.725 / 1.1 = 1.57 here)
    and a draft at 1.25 tokens a round (1.25 / 1.825 = 0.68 a step) seemed to beat it (0.64):
    one price check (PRICE_STEPS plain steps) finds 1.0 and the draft goes off."""
    chosen = _hopeless(AdaptiveK(4, 8), 60, v1=1.0)
    first = chosen.index(0)
    assert chosen[first : first + PRICE_STEPS] == [0] * PRICE_STEPS
    assert chosen[-20:].count(0) >= 17  # off, but for probes
    # Where plain steps really cost what the guess says, one check and the draft stays on.
    chosen = _hopeless(AdaptiveK(4, 8), 60, v1=1.57)
    assert chosen.count(0) <= PRICE_STEPS and chosen[-10:].count(0) == 0


def test_a_calibrated_plain_step_needs_no_price_check() -> None:
    """A calibration that timed a plain step (Engine.warm_up: the chat, the server, the bench)
    prices it already: no check's plain steps, which cost a CPU more than they look (the
    pipeline restarts, the draft catches up after them); the policy decides from the seed (here
    the true 1.0: the hopeless draft goes off without a check). A seed without a plain step, or
    one whose verifies this run finds 2x dearer (a longer context), still gets its check."""
    seeded = AdaptiveK(4, 8)
    seeded.seed({"draft": 0.1}, {1: 1.0, 2: 1.725})
    chosen = _hopeless(seeded, 60, v1=1.0)
    assert chosen[-20:].count(0) >= 17  # off, but for probes
    on_costs = AdaptiveK(4, 8)
    on_costs.seed({"draft": 0.1}, {1: 1.57, 2: 1.725})  # a plain step as dear as the guess
    chosen = _hopeless(on_costs, 60, v1=1.57)
    assert 0 not in chosen  # no check ran: the draft stayed on throughout
    for seed in ({2: 1.725}, {1: 0.8, 2: 0.8}):  # no plain step; one from a shorter context
        checked = AdaptiveK(4, 8)
        checked.seed({"draft": 0.1}, seed)
        chosen = _hopeless(checked, 60, v1=1.57)
        first = chosen.index(0)
        assert chosen[first : first + PRICE_STEPS] == [0] * PRICE_STEPS, seed


def test_lookups_behind_plain_steps_are_priced_though_never_timed() -> None:
    """With the draft model off, a hybrid's lookups run one token behind plain steps and are
    never timed; priced as free (a lookup is a dict read) with the verify curve the plain steps
    and draft rounds measured, lookups that are never accepted, at a context where a row costs
    most of a step, are switched off rather than run at full length forever."""
    policy = AdaptiveK(4, 8, model="draft")
    for i in range(6):  # the draft model: rejected, 2-token verifies at 1.9 steps
        policy.decide()
        policy.observe(Round(i, 1, 0, 1, 0.1, 1.9, "draft"))
    for i in range(6, 30):
        k = policy.decide()
        if i % 3 == 0:  # a 4-token lookup queued behind a plain step, rejected, untimed
            policy.observe(Round(i, 4, 0, 4, 0.0, 4.6, "ngram", timed=False, match=2))
        else:
            policy.observe(Round(i, 0, 0, 0, 0.0, 1.0, "draft", timed=i % 3 == 2))
    assert k == 0 and policy.lookup_k("ngram", 4) == 0


def test_seeded_costs_are_used_from_the_first_round() -> None:
    policy = AdaptiveK(4, 8)
    policy.seed({"draft": 1.0}, {1: 0.1, 2: 0.1})  # a draft step dearer than a verify
    # The shortest round; not K = 0 on one timing (a saved one is a timing like the others).
    assert policy.choose("draft") == 1
    assert AdaptiveK(4, 8).choose("draft") == 4  # unseeded: k_init until both were timed


M2 = {1: 1.0, 2: 1.725, 3: 1.725, 4: 1.725, 5: 1.725, 6: 1.825, 7: 1.925, 8: 2.025, 9: 2.125}


def test_a_calibration_where_drafting_cannot_pay_starts_with_the_draft_off() -> None:
    """An Apple M1 / M2's verify cliff with a draft at 0.6 of a step: even at the optimistic
    acceptance a round loses to a plain step, so a seeded policy's first round is a plain step
    (it was k_init's 4-token round, every answer: research/replay/, m1m2 c = 0.6), and a probe
    still comes within the longest gap. Where drafting may pay, or the drafter's method is not
    known, the first round is k_init's as before."""
    dear = AdaptiveK(4, 8, drafter="draft")
    dear.seed({"draft": 0.6}, M2)
    chosen = [dear.decide()]
    for i in range(80):
        dear.observe(Round(i, 0, 0, 0, 0.0, 1.0, "draft", timed=i > 0))
        chosen.append(dear.decide())
    assert chosen[:8] == [0] * 8 and any(chosen), chosen
    hybrid = AdaptiveK(4, 8, model="draft")
    hybrid.seed({"draft": 0.6}, M2)
    assert hybrid.decide() == 0
    for policy in (AdaptiveK(4, 8, drafter="draft"), AdaptiveK(4, 8)):
        policy.seed({"draft": 0.6 if policy.drafter is None else 0.05}, M2)
        assert policy.decide() == 4


def test_a_calibration_left_behind_by_a_long_context_adds_a_cost_a_row() -> None:
    """At a long context the costs grow with the rows far more than a short prompt's
    calibration says: once two lengths are shared and this run's costs are past SEED_TRUST
    times the seed's, a length it did not time is the seed scaled plus a cost a row
    (seed_and_rows), not the seed scaled by the cost ratio alone (which priced a plain step at
    32K about 3x its cost: research/replay/, xeon). Within SEED_TRUST, the seed's shape stays."""
    policy = AdaptiveK(4, 8)
    policy.seed({"draft": 0.05}, {1: 1.0, 3: 1.2, 5: 1.4})
    policy.observe(Round(0, 4, 1, 4, 0.2, 23.8, "draft"))
    assert policy.verify_means[1] == pytest.approx(23.8 / 1.4)  # one length: the scaled seed
    policy.observe(Round(1, 2, 1, 2, 0.1, 14.6, "draft"))
    assert policy.verify_means[1] == pytest.approx(5.4)
    assert (policy.verify_means[3], policy.verify_means[5]) == (14.6, 23.8)  # its own, kept
    near = AdaptiveK(4, 8)
    near.seed({"draft": 0.05}, {1: 1.0, 3: 1.2, 5: 1.4})
    near.observe(Round(0, 4, 1, 4, 0.2, 1.5, "draft"))
    near.observe(Round(1, 2, 1, 2, 0.1, 1.25, "draft"))
    assert near.verify_means[1] == pytest.approx(statistics.median([1.25 / 1.2, 1.5 / 1.4]))


@pytest.mark.parametrize(
    "own, want",
    [
        ({3: 2.4, 5: 2.8}, (2.0, 0.0)),  # twice the seed: a slower machine, no cost a row
        ({3: 1.2 + 3.0, 5: 1.4 + 5.0}, (1.0, 1.0)),  # the seed plus 1.0 a row
        ({3: 3.0, 5: 5.0}, (0.0, 1.0)),  # rows are all of it
    ],
)
def test_seed_and_rows_separates_a_scaled_seed_from_a_cost_a_row(own, want) -> None:
    assert seed_and_rows({1: 1.0, 3: 1.2, 5: 1.4}, own) == pytest.approx(want, abs=1e-9)
    assert seed_and_rows({1: 1.0, 3: 1.2}, {3: 2.0}) is None  # one shared length
