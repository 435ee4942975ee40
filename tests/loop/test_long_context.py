"""Long contexts on tiny seeded models: a token draft's attention bound (SpecConfig.draft_window,
bound.Bound) keeps output exact at 32K tokens, greedy and sampled, and bounds what the draft holds
and reads; adaptive K prices rounds with costs measured at the current context length."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.cache import KVCache

from edgespec.bound import Bound
from edgespec.cache import KVState
from edgespec.config import DRAFT_SINKS, DRAFT_WINDOW, SamplingConfig, SpecConfig
from edgespec.rewind import WindowKVCache
from edgespec.runtime import Engine
from tests.helpers import first_two_p_value, gen, plain_ids, rounds_of, token_ids
from tests.helpers.stats import assert_follows
from tests.helpers.tiny import make_tiny_pair

LONG = 32_768
WINDOW = 256  # small, so that the bound is on well inside the prompts below


@pytest.fixture(scope="module")
def long_engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    root = tmp_path_factory.mktemp("long")  # two target layers: a 32K prefill's attention halves
    target, draft = make_tiny_pair(root, seed=3, target_layers=2, context=LONG + 512)
    return Engine.load(target=str(target), draft=str(draft))


@pytest.fixture(scope="module")
def long_self_engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    """The draft is a copy of the target: bounded, it agrees with it often, not always."""
    root = tmp_path_factory.mktemp("long_self")
    target, draft = make_tiny_pair(root, seed=3, target_layers=2, draft="self", context=4096)
    return Engine.load(target=str(target), draft=str(draft))


def _prompt(engine: Engine, n: int, seed: int = 0) -> list[int]:
    """n seeded token ids of the tiny vocabulary (no special tokens)."""
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(3, engine._vocab, size=n)]


def _held(state: KVState) -> int:
    """Key positions the draft's cache layers hold, at most (sinks included)."""
    return max(int(layer.size()) for layer in state.cache)


@pytest.mark.slow  # a 32K-token prefill: about a minute on a 2-core CPU
@pytest.mark.parametrize(
    "spec",
    [
        SpecConfig(k=4, method="draft", draft_window=WINDOW, adaptive=False),
        SpecConfig(k=4, method="hybrid", adaptive=True, draft_window=WINDOW),
    ],
    ids=["draft", "adaptive-hybrid"],
)
def test_greedy_output_equals_plain_at_32k_tokens_with_the_draft_bound_on(long_engine, spec):
    engine = long_engine
    prompt = _prompt(engine, LONG - 64)
    plain = plain_ids(engine, prompt, 40)  # the target's prefill is reused by the next request
    engine._draft.reset()
    events = gen(engine, prompt, spec, 40)
    assert token_ids(events) == plain and len(plain) == 40
    rounds = rounds_of(events)
    assert any(r.drafted and r.method == "draft" for r in rounds)
    draft = engine._draft
    assert isinstance(draft, KVState)
    assert all(isinstance(layer, WindowKVCache) for layer in draft.cache)  # the bound was on
    # It holds its sinks and about one window, not 32K positions ...
    assert _held(draft) <= DRAFT_SINKS + WINDOW + 2 * WindowKVCache.step
    assert draft.offset == len(draft.tokens) <= len(prompt) + 40


def test_a_bounded_draft_reads_only_the_end_of_a_long_prompt(long_engine, monkeypatch):
    engine = long_engine
    prompt = _prompt(engine, 3_000, seed=1)
    fed: list[int] = []
    forward = KVState.forward

    def count(self, inputs, head_only=False):
        if self is engine._draft:
            fed.append(int(inputs.shape[0]))
        return forward(self, inputs, head_only)

    monkeypatch.setattr(KVState, "forward", count)
    engine.reset()
    gen(engine, prompt, SpecConfig(k=2, method="draft", draft_window=WINDOW, adaptive=False), 8)
    # The sinks, the last two windows of the prompt, then the rounds' few tokens each.
    assert DRAFT_SINKS + 2 * WINDOW <= sum(fed) <= DRAFT_SINKS + 2 * WINDOW + 8 * 4
    engine.reset()
    fed.clear()
    gen(engine, prompt, SpecConfig(k=2, method="draft", draft_window=0, adaptive=False), 8)
    assert sum(fed) >= len(prompt) - 1  # unbounded: the whole prompt


def test_short_contexts_and_trees_keep_the_drafts_full_cache(long_engine):
    engine = long_engine
    prompt = _prompt(engine, 300, seed=2)  # under 2 windows: the bound is not on yet
    gen(engine, prompt, SpecConfig(k=2, method="draft", draft_window=WINDOW, adaptive=False), 8)
    assert not any(isinstance(layer, WindowKVCache) for layer in engine._draft.cache)
    long = _prompt(engine, 2_000, seed=2)
    gen(engine, long, SpecConfig(k=2, method="draft", draft_window=WINDOW, adaptive=False), 8)
    assert all(isinstance(layer, WindowKVCache) for layer in engine._draft.cache)
    want = plain_ids(engine, long, 12)
    tree = SpecConfig(k=2, method="draft", tree="2,1", draft_window=WINDOW)
    assert token_ids(gen(engine, long, tree, 12)) == want  # a tree's draft starts over, full
    assert not any(isinstance(layer, WindowKVCache) for layer in engine._draft.cache)


def test_a_token_draft_takes_its_familys_window_by_default(long_engine):
    """No window asked for: past twice DRAFT_WINDOW tokens, a token draft is bounded to its
    family's default window (docs/drafting.md, Long contexts), and output is plain decoding's."""
    engine = long_engine
    prompt = _prompt(engine, 2 * DRAFT_WINDOW + 200, seed=7)
    engine.reset()
    events = gen(engine, prompt, SpecConfig(k=2, method="draft", adaptive=False), 8)
    assert any(r.drafted for r in rounds_of(events))
    assert engine._draft.bound == Bound(DRAFT_WINDOW, DRAFT_SINKS)
    assert all(isinstance(layer, WindowKVCache) for layer in engine._draft.cache)
    assert _held(engine._draft) <= DRAFT_SINKS + DRAFT_WINDOW + 2 * WindowKVCache.step
    assert token_ids(events) == plain_ids(engine, prompt, 8)


N_SEEDS = 400
MIN_SECONDS = 60


def test_sampled_tokens_follow_the_target_distribution_with_the_bound_on(long_self_engine):
    """T = 2 at 1,200 tokens of context, the draft bounded to 512 of them (and its sinks; it
    reads the last 1,024): the first token follows p(. | prompt), the second, given the
    likeliest first, p(. | prompt, first), whether accepted from the draft or corrected. (A
    random tiny model's attention is spread over the whole context, so its bounded copy agrees
    with it only at a flattening temperature: ~0.26 at T = 2, ~0.07 at T = 1.)"""
    engine = long_self_engine
    ids = _prompt(engine, 1_200, seed=4)
    sampling = SamplingConfig(temperature=2.0)
    spec = SpecConfig(k=2, method="draft", draft_window=512, adaptive=False)
    kinds: set[str] = set()
    p_value = first_two_p_value(engine, ids, sampling, spec, kinds, N_SEEDS, MIN_SECONDS)
    assert_follows(p_value, range(N_SEEDS), "bounded draft")
    assert {"accepted", "corrected"} <= kinds
    assert all(isinstance(layer, WindowKVCache) for layer in engine._draft.cache)


# --------------------------------------------------------------------- the window cache itself

H, D, W, S = 2, 8, 64, 4


def _reference(q, k, v, first: int, n: int) -> mx.array:
    """Queries first..first + n - 1 over keys j <= i with j > i - W or j < S, from scratch."""
    rows = []
    for i in range(first, first + n):
        allowed = mx.array([j > i - W or j < S for j in range(i + 1)])
        scores = (q[..., i : i + 1, :] @ k[..., : i + 1, :].transpose(0, 1, 3, 2)) * D**-0.5
        scores = mx.where(allowed[None, None, None, :], scores, -mx.inf)
        rows.append(mx.softmax(scores, axis=-1) @ v[..., : i + 1, :])
    return mx.concatenate(rows, axis=2)


def _feed(cache: WindowKVCache, q, k, v, first: int, lengths: list[int]) -> int:
    """Feed chunks from position `first`, checking each chunk's attention against the reference."""
    for n in lengths:
        mask = cache.make_mask(n)
        keys, values = cache.update_and_fetch(
            k[..., first : first + n, :], v[..., first : first + n, :]
        )
        out = scaled_dot_product_attention(
            q[..., first : first + n, :], keys, values, cache=None, scale=D**-0.5, mask=mask
        )
        assert mx.abs(out - _reference(q, k, v, first, n)).max().item() < 1e-4, (first, n)
        first += n
    return first


def test_a_window_cache_with_sinks_attends_like_the_reference_through_compactions_and_trims():
    mx.random.seed(0)
    q, k, v = (mx.random.normal((1, H, 500, D)) for _ in range(3))
    cache = WindowKVCache(W, depth=10, sinks=S)
    pos = _feed(cache, q, k, v, 0, [30, 50, 1, 1, 100, 3, 120, 1, 5, 100])
    assert cache.start > S and cache.size() < pos  # it dropped positions, not the sinks
    cache.trim(5)
    _feed(cache, q, k, v, pos - 5, [3, 1, 1, 60])
    # A full KVCache turned into a window keeps attending the same way.
    full = KVCache()
    full.update_and_fetch(k[..., :400, :], v[..., :400, :])
    window = WindowKVCache.of(full, W, depth=10, sinks=S)
    assert window.bounded and window.offset == 400 and window.size() < 400
    _feed(window, q, k, v, 400, [1, 7, 50])


def test_a_skipped_window_cache_sees_what_it_would_have_seen_once_its_window_is_read():
    mx.random.seed(1)
    q, k, v = (mx.random.normal((1, H, 500, D)) for _ in range(3))
    cache = WindowKVCache(W, depth=10, sinks=S)
    _feed(cache, q, k, v, 0, [S])
    cache.skip(300)  # positions S..299 never computed
    cache.update_and_fetch(k[..., 300 : 300 + W, :], v[..., 300 : 300 + W, :])
    _feed(cache, q, k, v, 300 + W, [1, 5, 1])  # whose windows lie past the skipped positions
