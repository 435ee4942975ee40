"""The MLX loop must match the slow numpy reference (tests/helpers/reference_loop.py) token for
token.

The reference recomputes every distribution with a cache-free forward and does all maths in numpy
float64; both consume the same uniforms (the documented key schedule), so any difference in the
loop's bookkeeping (cache rewinds, bonus handling, residuals, key use) shows up as a different token.
"""

from __future__ import annotations

import pytest

from edgespec.config import SamplingConfig, SpecConfig
from edgespec.runtime import Engine
from tests.helpers import PROMPT, gen, token_ids
from tests.helpers.reference_loop import reference_plain, reference_speculative


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
