"""Exactness of every drafting method on tiny seeded models: greedy output identical to plain
decoding (n-gram, hybrid, adaptive, early stop), and chi-square tests at T > 0 that point-mass
proposals (a lookup, made in a round or one token behind) leave the emitted tokens distributed as
the target's p."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.drafting.ngram import NgramDrafter
from edgespec.runtime import Engine
from tests.helpers import (
    PROMPT,
    BehindOnce,
    binomial_close,
    chi2_pvalue,
    gen,
    plain_ids,
    rounds_of,
    target_probs,
    token_ids,
    toks,
)
from tests.helpers.stats import assert_follows

# ---------------------------------------------------------------------------- greedy


@pytest.mark.parametrize(
    "spec",
    [
        SpecConfig(k=4, method="ngram", adaptive=False),
        SpecConfig(k=2, method="ngram", ngram_min=2, ngram_max=3, adaptive=False),
        # unigram matches
        SpecConfig(k=4, method="hybrid", ngram_min=1, ngram_max=1, adaptive=False),
        SpecConfig(k=4, method="hybrid", adaptive=False),
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
def test_greedy_output_equals_plain_decoding(engine, spec):
    ids = engine.encode_raw(PROMPT) * 2  # a prompt that repeats: the lookups find matches
    plain = plain_ids(engine, ids, 48)
    events = gen(engine, ids, spec, 48)
    assert token_ids(events) == plain and len(plain) == 48
    rounds = rounds_of(events)
    long = [r for r in rounds if spec.long_match and r.match >= spec.long_match]
    assert all(r.drafted <= r.k <= spec.k_max for r in rounds if r not in long)
    assert all(r.method == "ngram" and r.drafted <= spec.ngram_long_k for r in long)
    if spec.method != "draft":
        assert any(r.method == "ngram" and r.drafted > 0 for r in rounds)  # lookup really drafted
    # A tiny random target never continues a copy, so lookups here are rejected: accepted
    # lookups are tested with chosen drafts (test_drafts_one_token_behind_*, the point-mass test)
    # and with the real model (tests/real/test_embedded_pair.py).


# ---------------------------------------------------------------------------- T > 0

N_SEEDS = 600  # ~15 ms per 2-token generation on a tiny model
T1 = SamplingConfig(temperature=1.0)


def _context_the_target_likes(engine: Engine, base: list[int]) -> list[int]:
    """base + [y] + base with y = argmax_y p(y | base + [y] + base): the n-gram then proposes y,
    a token the target gives real probability, so both accept and reject paths get exercised."""
    vocab = engine._vocab
    batch = mx.array([base + [y] + base for y in range(vocab)])
    probs = mx.softmax(engine.target.model(batch)[:, -1].astype(mx.float32), axis=-1)
    y = int(mx.argmax(probs[mx.arange(vocab), mx.arange(vocab)]).item())
    return base + [y] + base


def test_ngram_point_mass_rounds_emit_the_target_distribution(target_engine):
    """Round 0 is always an n-gram proposal (x_1, x_2) (the suffix occurred before). Token 1 must
    follow p(. | context) and, when x_1 was accepted, token 2 must follow p(. | context, x_1)."""
    engine = target_engine
    model = engine.target.model
    ids = _context_the_target_likes(engine, engine.encode_raw(PROMPT))
    # exactly 2 tokens
    spec = SpecConfig(k=2, method="ngram", ngram_min=2, ngram_long=0, adaptive=False)
    x = toks(NgramDrafter(2, 8).propose(ids, 2))
    assert len(x) == 2
    p1 = target_probs(model, ids, T1)
    p2 = target_probs(model, ids + [x[0]], T1)
    accepted = []

    def p_value(seeds: range) -> float:
        first, second = [], []
        for seed in seeds:
            cfg = GenerationConfig(SamplingConfig(temperature=1.0, seed=seed), spec, max_tokens=2)
            events = list(engine.generate(ids, cfg))
            tokens, r = token_ids(events), rounds_of(events)[0]
            assert r.method == "ngram" and r.drafted == 2
            first.append(tokens[0])
            if tokens[0] == x[0]:
                second.append(tokens[1])
        accepted.append(len(second))
        return min(chi2_pvalue(first, p1, N_SEEDS), chi2_pvalue(second, p2, min_samples=51))

    assert_follows(p_value, range(N_SEEDS), "n-gram")
    # x_1 is accepted with probability p(x_1): a binomial check, 4 sigma.
    assert binomial_close(accepted[0], N_SEEDS, p1[x[0]])


def test_drafts_one_token_behind_emit_the_target_distribution(target_engine):
    """Plain step x_m ~ p(. | C), queued behind it [x_m, d] with d proposed before x_m was known.
    x_m must follow p(. | C), x_m+1 must follow p(. | C, x_m) (checked given the likeliest x_m = y,
    with d = argmax p(. | C, y) so both the accept and the reject path run), d is accepted with
    probability p(d | C, y), and after an accepted d the next token follows p(. | C, y, d)."""
    engine = target_engine
    model = engine.target.model
    ids = _context_the_target_likes(engine, engine.encode_raw(PROMPT))
    p0 = target_probs(model, ids, T1)
    y = int(np.argmax(p0))
    p1 = target_probs(model, ids + [y], T1)
    d = int(np.argmax(p1))
    p2 = target_probs(model, ids + [y, d], T1)
    seconds = []

    def p_value(seeds: range) -> float:
        first, second, third = [], [], []
        for seed in seeds:
            drafter = BehindOnce(len(ids), [d])
            cfg = GenerationConfig(
                SamplingConfig(temperature=1.0, seed=seed),
                SpecConfig(k=1, method="draft", adaptive=False),
                3,
            )
            events = list(engine.generate(ids, cfg, drafter=drafter))
            tokens, rounds = token_ids(events), rounds_of(events)
            assert [(r.drafted, r.method) for r in rounds[:2]] == [(0, "ngram"), (1, "ngram")]
            assert len(tokens) == 3
            first.append(tokens[0])
            if tokens[0] == y:
                second.append(tokens[1])
                if tokens[1] == d:
                    assert rounds[1].accepted == 1  # d itself, accepted: then the bonus
                    third.append(tokens[2])
        seconds.append(second)
        p_first = chi2_pvalue(first, p0, min_samples=N_SEEDS)
        p_second = chi2_pvalue(second, p1, min_samples=101)
        return min(p_first, p_second, chi2_pvalue(third, p2, min_samples=31))

    assert_follows(p_value, range(N_SEEDS), "one token behind")
    assert binomial_close(sum(t == d for t in seconds[0]), len(seconds[0]), p1[d])
