"""The MLX loop must match the slow numpy reference (tests/helpers/reference_loop.py) token for
token.

The reference recomputes every distribution with a cache-free forward and does all maths in numpy
float64; both consume the same uniforms (the documented key schedule), so any difference in the
loop's bookkeeping (cache rewinds, bonus handling, residuals, key use) shows up as a different token.
"""

from __future__ import annotations

import dataclasses

import pytest

from edgespec.config import SamplingConfig, SpecConfig
from edgespec.drafting.adaptive import AdaptiveK, make_k_policy
from edgespec.events import Round
from edgespec.runtime import Engine
from tests.helpers import PROMPT, gen, rounds_of, token_ids
from tests.helpers.reference_loop import reference_plain, reference_rounds, reference_speculative

N_ROUNDS = 48


def _generated(
    engine: Engine, ids: list[int], sampling: SamplingConfig, k: int, n: int, method="draft"
):
    return token_ids(gen(engine, ids, SpecConfig(k=k, method=method, adaptive=False), n, sampling))


@pytest.mark.parametrize(
    "sampling,k",
    [
        (SamplingConfig(temperature=0), 4),
        (SamplingConfig(temperature=1.0, seed=1), 3),
        (SamplingConfig(temperature=0.8, seed=2), 5),
        (SamplingConfig(temperature=1.5, top_p=0.9, seed=3), 2),
        (SamplingConfig(temperature=1.0, top_k=20, min_p=0.05, seed=4), 4),
    ],
)
def test_matches_numpy_reference_token_for_token(tiny_models, sampling, k):
    target, draft = tiny_models
    engine = Engine(target, draft)
    ids = engine.encode_raw(PROMPT)
    eos = engine.tokenizer.eos_token_ids
    want = reference_speculative(target.model, draft.model, ids, sampling, k, 24, eos)
    assert _generated(engine, ids, sampling, k, 24) == want


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0), SamplingConfig(1.0, seed=9)])
def test_plain_decoding_matches_numpy_reference(tiny_models, sampling):
    target, draft = tiny_models
    engine = Engine(target, draft)
    ids = engine.encode_raw(PROMPT)
    want = reference_plain(target.model, ids, sampling, 24, engine.tokenizer.eos_token_ids)
    assert _generated(engine, ids, sampling, 4, 24, method="none") == want


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0), SamplingConfig(1.2, seed=5)])
def test_self_draft_matches_reference(tiny_self_models, sampling):
    """Every round ends in a bonus here: the draft cache must catch up on its unseen K-th token."""
    target, draft = tiny_self_models
    engine = Engine(target, draft)
    ids = engine.encode_raw(PROMPT)
    eos = engine.tokenizer.eos_token_ids
    want = reference_speculative(target.model, draft.model, ids, sampling, 3, 24, eos)
    assert _generated(engine, ids, sampling, 3, 24) == want


def test_reference_greedy_speculative_equals_reference_plain(tiny_models):
    """Sanity of the reference itself: at temperature 0 speculation must not change the output."""
    target, draft = tiny_models
    ids = target.tokenizer.encode(PROMPT)
    greedy = SamplingConfig(temperature=0)
    spec = reference_speculative(target.model, draft.model, ids, greedy, 3, 16)
    assert spec == reference_plain(target.model, ids, greedy, 16)


def _priced(monkeypatch: pytest.MonkeyPatch) -> None:
    """AdaptiveK prices each round it is shown by a fixed cost model rather than the clock (a
    draft model's step 0.02 s a token, a lookup 1e-4 s, a verify 0.05 s + 0.01 s a token), so
    its choices, and the tokens with them, follow from the rounds alone: the loop's and the
    reference's policies then choose alike if and only if their rounds are alike. Reviews are
    left off (the reference's K = 0 runs read none): they only choose K, which the rounds
    compared here record; tests/loop/test_review.py checks them."""
    observe = AdaptiveK.observe
    monkeypatch.setattr(AdaptiveK, "review_on", lambda self: None)

    def priced(self: AdaptiveK, r: Round) -> None:
        step = 1e-4 if r.method == "ngram" else 0.02
        cost = {"t_draft": step * r.drafted, "t_verify": 0.05 + 0.01 * (r.drafted + 1)}
        observe(self, dataclasses.replace(r, timed=True, **cost))

    monkeypatch.setattr(AdaptiveK, "observe", priced)


@pytest.mark.parametrize(
    "sampling", [SamplingConfig(temperature=0), SamplingConfig(1.0, seed=3)], ids=["t0", "t1"]
)
@pytest.mark.parametrize(
    "pair,method,adaptive",
    [
        ("tiny_models", "hybrid", False),
        ("tiny_models", "hybrid", True),
        ("tiny_models", "draft", True),
        ("tiny_self_models", "hybrid", True),
    ],
)
def test_hybrid_and_adaptive_k_match_the_reference(
    request, monkeypatch, sampling, pair, method, adaptive
):
    """Hybrid drafting (lookups first, the draft model where they miss) and adaptive K, against
    the reference's written-out schedule: the same tokens and the same rounds (drafted, accepted,
    who drafted), K = 0 runs with lookups one token behind included. The prompt repeats itself,
    so lookups match from the first round; the self-draft pair (its draft is the target) gets its drafts accepted."""
    _priced(monkeypatch)
    target, draft = request.getfixturevalue(pair)
    engine = Engine(target, draft)
    ids = engine.encode_raw(" ".join([PROMPT] * 3))
    eos = engine.tokenizer.eos_token_ids
    # One-token lookups (ngram_max 1): the tiny models' text seldom repeats two tokens in a row.
    spec = SpecConfig(k=3, method=method, adaptive=adaptive, ngram_max=1)
    events = gen(engine, ids, spec, N_ROUNDS, sampling)
    model = "draft" if method == "hybrid" else None
    policy = make_k_policy(spec.k, spec.adaptive, spec.k_max, model, spec.long_match)
    sized = policy if isinstance(policy, AdaptiveK) and model else None
    lookup_k = sized.lookup_k if sized else None
    long_k = sized.long_k if sized else None
    want, rounds = reference_rounds(
        target.model, draft.model, ids, sampling, spec, policy, N_ROUNDS, eos, lookup_k, long_k
    )
    assert token_ids(events) == want
    assert [(r.drafted, r.accepted, r.method) for r in rounds_of(events)] == rounds
    # The schedule was exercised: lookups, plain-step runs, accepted drafts.
    assert method != "hybrid" or any(m == "ngram" for _, _, m in rounds)
    assert not adaptive or pair == "tiny_self_models" or any(d == 0 for d, _, _ in rounds)
    assert pair != "tiny_self_models" or sum(a for _, a, _ in rounds) > N_ROUNDS // 2
