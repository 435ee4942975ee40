"""Long contexts with the draft's attention bound (SpecConfig.draft_window, bound.Bound) on feature
drafts (EAGLE; MTP and next-n heads share its state, drafting/feature.py), block drafts (DFlash,
DFlash2) and Gemma 4 assistants, on tiny seeded models: greedy output equals plain decoding at
32K tokens of context for each of them, the bounded draft holds and reads only its sinks and last
windows, a bounded block draft attends as the bound says, and sampled tokens follow the target's
distribution with the bound on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache

from edgespec.architectures.block_mask import block_mask
from edgespec.bound import Bound
from edgespec.config import DRAFT_SINKS, DRAFT_WINDOW, SamplingConfig, SpecConfig
from edgespec.drafting import assistant
from edgespec.rewind import WindowKVCache
from edgespec.runtime import Engine
from tests.helpers import first_two_p_value, gen, plain_ids, rounds_of, token_ids
from tests.helpers.block_models import write_dflash
from tests.helpers.stats import assert_follows
from tests.helpers.tiny import make_tiny_eagle, make_tiny_pair
from tests.helpers.tiny_dflash2 import write_dflash2
from tests.helpers.tiny_gemma4_assistant import make_assistant

LONG = 32_768
WINDOW = 256  # small, so that the bound is on well inside the prompts below
DRAFTS = ("eagle", "dflash", "dflash2")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A two-layer tiny llama target (32K positions) and its EAGLE, DFlash and DFlash2 drafts."""
    root = tmp_path_factory.mktemp("long_drafts")
    target, _ = make_tiny_pair(root, seed=3, target_layers=2, context=LONG + 512)
    positions = {"max_position_embeddings": LONG + 512}
    return {
        "target": target,
        "eagle": make_tiny_eagle(target, root / "eagle", seed=0),
        "dflash": write_dflash(target, root / "dflash", layer_ids=(0, 1), block=4, **positions),
        "dflash2": write_dflash2(target, root / "dflash2", **positions)[0],
    }


@pytest.fixture(scope="module")
def engines(folders) -> dict[str, Engine]:
    return {
        name: Engine.load(target=str(folders["target"]), draft=str(folders[name]))
        for name in DRAFTS
    }


def _prompt(engine: Engine, n: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(3, engine._vocab, size=n)]


def _spec(window: int = WINDOW, k: int = 3) -> SpecConfig:
    return SpecConfig(k=k, method="draft", draft_window=window, adaptive=False)


def _assert_bounded(engine: Engine, window: int = WINDOW) -> None:
    """The draft's own cache is the bound's: window caches holding its sinks and about a window."""
    layers = engine._draft.kv.cache
    assert layers and all(isinstance(c, WindowKVCache) and c.bounded for c in layers)
    assert max(c.size() for c in layers) <= DRAFT_SINKS + window + 2 * WindowKVCache.step


def _greedy_matches_plain(engine: Engine, prompt: list[int], n: int) -> None:
    """Speculation first (its prefill records the draft's features), then plain decoding, which
    reuses the target's cache."""
    engine.reset()
    events = gen(engine, prompt, _spec(), n)
    _assert_bounded(engine)
    assert any(r.drafted for r in rounds_of(events))
    # (A tiny model may draw its end of turn early: the same from both, though.)
    assert token_ids(events) == plain_ids(engine, prompt, n) and len(token_ids(events)) >= n // 2


@pytest.mark.slow  # a 32K-token prefill recording features: about 90 s on a 2-core CPU
def test_greedy_output_equals_plain_at_32k_tokens_with_a_bounded_eagle_draft(engines):
    engine = engines["eagle"]
    _greedy_matches_plain(engine, _prompt(engine, LONG - 64), 40)


@pytest.mark.slow  # 32K-token prefills: about 25 s each on a 2-core CPU
@pytest.mark.parametrize("name", ["dflash", "dflash2"])
def test_greedy_output_equals_plain_at_32k_tokens_with_a_bounded_block_draft(engines, name):
    engine = engines[name]
    _greedy_matches_plain(engine, _prompt(engine, LONG - 64, seed=1), 40)


class _Counting:
    """A draft model that counts the context positions its calls feed (`at`: which argument)."""

    def __init__(self, model: Any, at: int):
        self.model, self.at, self.fed = model, at, 0

    def __call__(self, *args: Any, **kw: Any) -> Any:
        self.fed += int(args[self.at].shape[1])
        return self.model(*args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


@pytest.mark.parametrize("name", DRAFTS)
def test_a_bounded_draft_reads_only_the_sinks_and_the_end_of_a_long_prompt(engines, name):
    engine = engines[name]
    prompt, n, k = _prompt(engine, 3_000, seed=2), 12, 3
    fed = {}
    attr = "model" if name == "eagle" else "block"  # the model the drafter calls
    for window in (WINDOW, 0):
        engine.reset()
        state = engine._draft
        spy = _Counting(getattr(state, attr), 0 if name == "eagle" else 1)
        setattr(state, attr, spy)  # EAGLE: (features, tokens, ...); a block: (tokens, context, ...)
        try:
            events = gen(engine, prompt, _spec(window, k), n)
        finally:
            setattr(state, attr, spy.model)
        assert token_ids(events) == plain_ids(engine, prompt, n)
        fed[window] = spy.fed
        if window:
            _assert_bounded(engine)
        else:
            assert all(type(c) is KVCache for c in state.kv.cache)
    # Bounded: the sinks, the last two windows of the prompt, then each round's few positions
    # (at most the k + 1 it committed and k - 1 guesses).
    assert DRAFT_SINKS + 2 * WINDOW <= fed[WINDOW] <= DRAFT_SINKS + 2 * WINDOW + n * 2 * k
    assert fed[0] >= len(prompt) - 1  # unbounded: the whole prompt


def test_short_contexts_and_trees_keep_a_feature_drafts_full_cache(engines):
    engine = engines["eagle"]
    short = _prompt(engine, 400, seed=3)  # under two windows: the bound is not on yet
    gen(engine, short, _spec(), 8)
    assert all(type(c) is KVCache for c in engine._draft.kv.cache)
    long = _prompt(engine, 1_500, seed=3)
    gen(engine, long, _spec(), 8)
    _assert_bounded(engine)
    tree = SpecConfig(k=2, method="draft", tree="2,1", draft_window=WINDOW)
    assert token_ids(gen(engine, long, tree, 12)) == plain_ids(engine, long, 12)
    assert all(type(c) is KVCache for c in engine._draft.kv.cache)  # a tree's: full, from scratch


@pytest.mark.parametrize("name", ["dflash", "dflash2"])
def test_block_drafts_keep_the_whole_context_by_default(engines, name):
    """No window asked for: past twice DRAFT_WINDOW tokens, a DFlash or DFlash2 draft still
    attends to the whole context, its family's default (as z-lab's DFlash does: docs/drafting.md,
    Long contexts); a window asked for still bounds it."""
    engine = engines[name]
    prompt = _prompt(engine, 2 * DRAFT_WINDOW + 200, seed=5)
    engine.reset()
    events = gen(engine, prompt, SpecConfig(k=3, method="draft", adaptive=False), 8)
    assert any(r.drafted for r in rounds_of(events))
    assert engine._draft.kv.bound is None
    assert all(type(c) is KVCache for c in engine._draft.kv.cache)
    assert token_ids(events) == plain_ids(engine, prompt, 8)
    gen(engine, prompt, _spec(), 8)
    _assert_bounded(engine)


def test_an_eagle_draft_takes_its_familys_window_by_default(engines):
    """No window asked for: past twice DRAFT_WINDOW tokens, an EAGLE draft is bounded to
    DRAFT_WINDOW, its family's measured default; `--draft-window 0` still attends to it all."""
    engine = engines["eagle"]
    prompt = _prompt(engine, 2 * DRAFT_WINDOW + 200, seed=5)
    engine.reset()
    events = gen(engine, prompt, SpecConfig(k=3, method="draft", adaptive=False), 8)
    assert any(r.drafted for r in rounds_of(events))
    assert engine._draft.kv.bound == Bound(DRAFT_WINDOW, DRAFT_SINKS)
    _assert_bounded(engine, DRAFT_WINDOW)
    assert token_ids(events) == plain_ids(engine, prompt, 8)
    gen(engine, prompt, _spec(0), 8)
    assert engine._draft.kv.bound is None
    assert all(type(c) is KVCache for c in engine._draft.kv.cache)


def test_a_bounded_block_draft_attends_to_its_sinks_and_last_window_only(engines):
    """The block forward over a bounded cache equals the one over a full cache given the mask of
    the bound (sinks and the last `window` context positions for every block query, every block
    key), and differs from the unbounded one."""
    model = engines["dflash"].draft.model
    mx.random.seed(0)
    d, window, first, then = model.args.hidden_size, 200, 900, 37
    ctx = mx.random.normal((1, first + then, d))
    toks = mx.array([[7, 5, 5, 5]], dtype=mx.int32)
    full, bounded = model.make_cache(), model.make_cache()
    for cache in (full, bounded):
        model(toks, ctx[:, :first], cache=cache)
    bounded = Bound(window, DRAFT_SINKS).windowed(bounded)
    assert bounded is not None
    got = model(toks, ctx[:, first:], cache=bounded)
    assert max(c.size() for c in bounded) < first  # it holds less than the context
    pos, length = first + then, toks.shape[1]
    q, k = mx.arange(pos, pos + length)[:, None], mx.arange(pos + length)[None, :]
    mask = (k >= pos) | (k > q - window) | (k < DRAFT_SINKS)
    want = model(toks, ctx[:, first:], cache=full, mask=mask)
    assert mx.abs(got - want).max().item() < 1e-4
    full_again = model.make_cache()
    model(toks, ctx[:, :first], cache=full_again)
    unbounded = model(toks, ctx[:, first:], cache=full_again)
    assert mx.abs(got - unbounded).max().item() > 1e-3
    assert block_mask(None, pos, length, 0, False, full_again[0]) is None  # full: no mask


# ------------------------------------------------------------------------ Gemma 4 assistants


@pytest.fixture(scope="module")
def assistant_engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    root = tmp_path_factory.mktemp("long_assistant")
    target, draft, _ = make_assistant(root, steps=2, length=40, context=LONG + 512)
    return Engine.load(target=str(target), draft=str(draft))


def _full_layer_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The positions of the target's full-attention layer each assistant draft forward reads
    (assistant.shared_kv spied on), appended as they happen."""
    read: list[int] = []
    shared_kv = assistant.shared_kv

    def spy(target: Any, window: int, bound: Bound | None = None) -> Any:
        kv = shared_kv(target, window, bound)
        read.append(int(kv["full_attention"][0].shape[2]))
        return kv

    monkeypatch.setattr(assistant, "shared_kv", spy)
    return read


@pytest.mark.slow  # a 32K-token prefill of a tiny Gemma 4 target
def test_greedy_output_equals_plain_at_32k_tokens_with_a_bounded_assistant(
    assistant_engine, monkeypatch
):
    engine = assistant_engine
    prompt = _prompt(engine, LONG - 64, seed=4)
    read = _full_layer_reads(monkeypatch)
    events = gen(engine, prompt, _spec(), 24)
    assert any(r.drafted for r in rounds_of(events))
    assert token_ids(events) == plain_ids(engine, prompt, 24)
    # Every round read the full layer's sinks and last window only, not ~32K positions.
    assert read and set(read) == {DRAFT_SINKS + WINDOW}
    read.clear()
    gen(engine, prompt, _spec(0), 4)
    assert read and min(read) >= len(prompt) - 1  # unbounded: every position


def test_an_assistant_reads_the_whole_full_layer_by_default(assistant_engine, monkeypatch):
    """No window asked for: past twice the token draft's window, a Gemma 4 assistant's full
    layer reads every position of the target's, as mlx-vlm's does."""
    engine = assistant_engine
    prompt = _prompt(engine, 2 * DRAFT_WINDOW + 200, seed=6)
    read = _full_layer_reads(monkeypatch)
    engine.reset()
    events = gen(engine, prompt, SpecConfig(k=3, method="draft", adaptive=False), 8)
    assert any(r.drafted for r in rounds_of(events))
    assert read and min(read) >= len(prompt) - 1
    assert token_ids(events) == plain_ids(engine, prompt, 8)


# ------------------------------------------------------------------------ sampled output

N_SEEDS = 400
MIN_SECONDS = 60


@pytest.mark.parametrize("name", ["eagle", "dflash"])
def test_sampled_tokens_follow_the_target_distribution_with_the_bound_on(engines, name):
    """T = 2 at 1,200 tokens of context, the draft bounded to 512 of them (and its sinks; it
    reads the last 1,024): the first token follows p(. | prompt), the second, given the
    likeliest first, p(. | prompt, first), whether accepted from the draft or corrected."""
    engine = engines[name]
    ids = _prompt(engine, 1_200, seed=5)
    sampling = SamplingConfig(temperature=2.0)
    spec = _spec(512, k=2)
    kinds: set[str] = set()
    p_value = first_two_p_value(engine, ids, sampling, spec, kinds, N_SEEDS, MIN_SECONDS)
    assert_follows(p_value, range(N_SEEDS), f"bounded {name} draft")
    assert {"accepted", "corrected"} <= kinds
    _assert_bounded(engine, 512)
