"""N-gram prompt lookup (edgespec.drafting.ngram): the incremental index, the drafter's point-mass
proposals (long matches proposing long, lookups one token behind), and replay_rounds, which must
predict the loop's rounds exactly."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec.config import SpecConfig
from edgespec.drafting.ngram import HybridDrafter, NgramDrafter, NgramIndex
from research.measure.ngram_replay import replay_rounds
from tests.helpers import NeverDrafter, gen, plain_ids, rounds_of, token_ids, toks

# ---------------------------------------------------------------------------- the index


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


# ---------------------------------------------------------------------------- the drafter


def test_ngram_drafter_proposes_a_point_mass():
    d = NgramDrafter(1, 3)
    prop = d.propose([7, 8, 9, 7, 8], 4, mx.random.key(0))
    assert prop.q is None and prop.tokens.dtype == mx.int32
    assert toks(prop) == [9, 7, 8] and prop.match == 2 and prop.method == "ngram"


def test_long_matches_propose_long_and_short_ones_k():
    # [1 2 3 4 5 6 7 8 9] then its first six tokens again: the suffix "1..6" (n = 6) matches.
    copy = [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6]
    d = NgramDrafter(1, 8, long_n=6, long_k=3)
    prop = d.propose(copy, 1)
    assert toks(prop) == [7, 8, 9] and prop.match == 6
    assert toks(d.propose(copy, 4)) == [7, 8, 9, 0]  # max(K, long_k)
    assert toks(d.propose_behind(copy, 1)) == [8, 9, 0]  # one behind: past the match's first
    short = [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 4, 5, 6]  # "4 5 6": n = 3 < 6
    prop = d.propose(short, 1)
    assert toks(prop) == [7] and prop.match == 3
    off = NgramDrafter(1, 8)  # long_n 0: no long proposals
    assert toks(off.propose(copy, 1)) == [7]
    assert SpecConfig(ngram_max=4).long_match == 4  # capped at the longest match looked up
    assert SpecConfig(ngram_long=0).long_match == 0


def test_a_hybrid_sizes_its_long_matches_by_its_policy():
    """A hybrid whose adaptive policy sizes lookups (strategy.RoundFactory.k_policy sets
    lookup_k and long_k): a long match proposes long_k(the configured length) tokens, or the
    short size where the policy cut long ones to nothing; short matches are untouched."""
    copy = [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6]
    key = mx.random.key(0)
    hybrid = HybridDrafter(NgramDrafter(1, 8, long_n=6, long_k=4), NeverDrafter(), 2, 1)
    hybrid.lookup_k = lambda method, default: 1
    assert toks(hybrid.propose(copy, 1, key)) == [7, 8, 9, 0]  # no long_k: the configured 4
    hybrid.long_k = lambda default: min(default, 2)
    assert toks(hybrid.propose(copy, 1, key)) == [7, 8]
    assert toks(hybrid.propose_free(copy, key)) == [7, 8]
    behind = hybrid.propose_behind(copy, 0)  # one behind, as a pipelined plain run asks
    assert behind is not None and toks(behind) == [8, 9]
    hybrid.long_k = lambda default: 0
    assert toks(hybrid.propose(copy, 1, key)) == [7]  # the short size
    short = [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 4, 5, 6]
    assert toks(hybrid.propose(short, 1, key)) == [7]


def test_lookups_one_token_behind_skip_the_guess_for_the_token_being_computed():
    ngram = NgramDrafter(2, 4)
    context = [5, 6, 7, 8, 5, 6]  # (5, 6) was followed by 7 8 5 6: 7 is the coming token's guess
    prop = ngram.propose_behind(context, 2)
    assert toks(prop) == [8, 5] and prop.match == 2 and prop.method == "ngram"
    assert toks(ngram.propose_behind(context, 9)) == [8, 5, 6]  # stops at the context's end
    assert toks(ngram.propose_behind(context, 0)) == []  # K = 0: a plain step
    miss = ngram.propose_behind([1, 2, 3, 1], 3)
    assert miss.size == 0 and miss.match == 0  # no 2-gram
    assert toks(ngram.propose_behind([1, 2, 3, 1, 2], 3)) == [1, 2]  # guess 3, then 1 2
    assert toks(NgramDrafter(2, 4).propose_behind([7, 7, 7], 3)) == []  # guess: the last token
    hybrid = HybridDrafter(NgramDrafter(1, 4), NeverDrafter(), min_match=2, free_k=3)
    below = hybrid.propose_behind([4, 9, 4], 0)  # a 1-gram is below the hybrid's min match
    assert below is not None and below.size == 0
    hybrid = HybridDrafter(NgramDrafter(1, 4), NeverDrafter(), min_match=2, free_k=3)
    prop = hybrid.propose_behind(context, 0)
    assert prop is not None and toks(prop) == [8, 5, 6] and prop.method == "ngram"
    assert hybrid.propose_behind(context, 1) is None  # K > 0: the model drafts, the run ends


# ---------------------------------------------------------------------------- replay


@pytest.mark.parametrize("k, n_min, long", [(1, 1, 6), (1, 2, 4), (2, 1, 0), (3, 2, 6), (1, 1, 0)])
def test_replayed_ngram_rounds_are_the_rounds_the_loop_runs(target_engine, k, n_min, long):
    """ngram.replay_rounds, which chose the n-gram defaults on real answers without running a
    model, predicts every (drafted, accepted) pair of the loop's greedy n-gram rounds: direct
    lookups, pipelined plain steps and their one-behind proposals, long matches' long proposals
    (long > 0) alike. (On this prompt the tiny target repeats itself enough for accepted,
    rejected and plain rounds to occur at every k.)"""
    engine = target_engine
    ids = engine.encode_raw("1 2 3 4 1 2 3 4 1 2 3 4")
    n = 120
    spec = SpecConfig(k=k, method="ngram", ngram_min=n_min, ngram_long=long, adaptive=False)
    answer = plain_ids(engine, ids, n + spec.ngram_long_k + 1)
    events = gen(engine, ids, spec, n)
    assert token_ids(events) == answer[:n]
    loop = [(r.drafted, r.accepted) for r in rounds_of(events)]
    replay = replay_rounds(ids, answer, k, n, n_min, spec.ngram_max, long, spec.ngram_long_k)
    assert loop == replay
    assert any(d > k for d, _ in loop) == (long > 0)  # long matches proposed long, if on
    assert any(a for _, a in loop) and any(a < d for d, a in loop) and (0, 0) in loop
