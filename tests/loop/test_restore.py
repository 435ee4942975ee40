"""Going back in any cache (edgespec/rewind.py): window caches trimmed past the window, recurrent
state restored from restore points, unknown caches started over; what KVState makes of them
(offsets, tokens, prefill reuse), what the loop feeds again, and what is refused.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models import llama
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache, make_prompt_cache

from edgespec.cache import KVState
from edgespec.config import SpecConfig
from edgespec.errors import CacheNotTrimmableError
from edgespec.loading.load import load_model
from edgespec.rewind import HISTORY, WindowKVCache, kind, rewindable
from edgespec.runtime import Engine
from tests.helpers.arch_models import Families, generate
from tests.helpers.tiny_arch import make_family

IDS = [(7 * i + 3) % 300 + 4 for i in range(500)]


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> Families:
    return Families(tmp_path_factory.mktemp("restore"))


def _model(families: Families, family: str):
    return families.pair(family)[0].model


def _feed(state: KVState, ids: list[int]) -> mx.array:
    out = state.forward(mx.array(ids, dtype=mx.int32))
    mx.eval(out)
    return out


def test_window_cache_computes_what_mlx_lms_ring_computes(families):
    """Gemma 3 (window 24) over 60 one-token steps past a 30-token prompt: the same logits as with
    mlx-lm's RotatingKVCache, to rounding (the keys are summed in another order)."""
    model = _model(families, "gemma3_text")
    ours, theirs = KVState(model), make_prompt_cache(model)  # theirs: mlx-lm's own ring buffers
    assert {kind(c) for c in ours.cache} == {"trim", "window"}
    a, b = _feed(ours, IDS[:30]), model(mx.array(IDS[:30])[None], cache=theirs)[0]
    assert mx.allclose(a, b, atol=1e-4).item()
    for t in IDS[30:90]:
        a, b = _feed(ours, [t]), model(mx.array([[t]]), cache=theirs)[0]
        assert mx.allclose(a, b, atol=1e-4).item()


@pytest.mark.parametrize("back", [1, 3, 8, 30])
def test_a_rewind_past_the_window_gives_the_bits_of_never_having_gone_there(families, back):
    """400 positions (the window cache has dropped its oldest keys), a forward of `back` more, a
    rewind over it: the next logits equal those of a cache that never saw it. A rewind deeper than
    what the cache keeps starts over (offset 0: the loop then feeds everything again)."""
    model = _model(families, "gemma3_text")
    a, b = KVState(model), KVState(model)
    for state in (a, b):
        _feed(state, IDS[:380])
        for t in IDS[380:400]:
            _feed(state, [t])
    assert all(w.start > 0 for w in a.layers.windows)  # compacted
    _feed(a, IDS[400 : 400 + back])
    a.rewind(IDS, 400)
    assert a.offset == 400 and a.tokens == IDS[:400]
    got, want = _feed(a, IDS[450:455]), _feed(b, IDS[450:455])
    assert mx.array_equal(got, want).item()
    a.rewind(IDS, 300)
    assert a.offset == 0 and a.tokens == []


def test_window_masks_match_the_held_keys_through_compaction():
    """WindowKVCache alone: after hundreds of positions (several compactions) the mask of each
    forward has one column per held key, and every query sees exactly its window."""
    cache = WindowKVCache(window=5, depth=3)
    cache.step = 4
    for n in [7, 1, 1, 3, 1, 9, 1, 2, 1, 1, 4] * 20:
        mask = cache.make_mask(n, window_size=5, return_array=True)
        keys, _ = cache.update_and_fetch(mx.zeros((1, 1, n, 2)), mx.zeros((1, 1, n, 2)))
        assert mask.shape == (n, keys.shape[2])
        assert mask.sum(axis=-1).tolist() == [min(5, cache.offset - n + i + 1) for i in range(n)]
        assert cache.can_trim(3) and not cache.can_trim(cache.offset - cache.start + 1)


def test_recurrent_state_goes_back_to_restore_points(families):
    """Qwen3-Next: a rewind inside a multi-token forward lands on the point before it (the loop
    feeds the rest again); one-token forwards (a draft's steps) each leave a point, so a rewind
    between them is exact. Either way the next logits are those of a cache that never left."""
    model = _model(families, "qwen3_next")
    a, b = KVState(model), KVState(model)
    assert {kind(c) for c in a.cache} == {"trim", "restore"}
    _feed(a, IDS[:20])
    _feed(b, IDS[:20])
    _feed(a, IDS[20:25])  # a verify of 5
    a.rewind(IDS, 23)
    assert a.offset == 20 and a.tokens == IDS[:20]  # the point before it
    for t in IDS[20:26]:  # draft steps
        _feed(a, [t])
    a.rewind(IDS, 23)
    assert a.offset == 23
    for t in IDS[20:23]:  # the same forwards a's state came from (same bits on any BLAS)
        _feed(b, [t])
    assert mx.array_equal(_feed(a, IDS[23:27]), _feed(b, IDS[23:27])).item()


def test_settle_runs_refed_tokens_apart_once_there_are_enough(families):
    model = _model(families, "qwen3_next")
    state = KVState(model)
    _feed(state, IDS[:10])
    few = mx.array(IDS[10:13], dtype=mx.int32)
    assert state.settle(few) is few and state.offset == 10  # refed together with the drafts
    many = mx.array(IDS[10 : 11 + state.refeed], dtype=mx.int32)
    assert state.settle(many).tolist() == [IDS[10 + state.refeed]]
    assert state.offset == 10 + state.refeed  # the committed ones ran: a restore point there
    trimmed = KVState(_model(families, "qwen3"))
    assert trimmed.settle(many) is many  # attention caches are trimmed, never refed


def test_restore_points_are_bounded_and_keep_the_oldest(families):
    state = KVState(_model(families, "qwen3_5"))
    _feed(state, IDS[:10])
    for t in IDS[10:40]:
        _feed(state, [t])
    points = [p.offset for p in state.layers.points]
    assert len(points) == HISTORY + 1 and points[0] == 0  # before the first forward
    assert points[1:] == list(range(40 - HISTORY, 40))
    state.rewind(IDS, 35)
    assert state.offset == 35 and [p.offset for p in state.layers.points] == [35]


def test_a_chat_turn_that_rewrites_the_answer_restarts_at_the_prompt(families):
    """After a prefill the prompt's end is kept: a next prompt diverging inside the previous
    answer (a chat template that drops the thinking) reuses the previous prompt."""
    state = KVState(_model(families, "qwen3_next"))
    assert state.prefill(IDS[:30]) == 30
    for t in IDS[29:45]:
        _feed(state, [t])
    state.rewind(IDS, 44)
    assert state.prefill(IDS[:35] + [7, 8, 9]) == 38 - 29  # from the anchor at 29


def test_a_pure_recurrent_model_counts_its_own_positions(tmp_path):
    """Mamba 2 has no layer that counts positions: KVState counts them, and speculation on it is
    exact (greedy, K = 3) like on the hybrids."""
    target, draft = make_family(tmp_path, "mamba2")
    engine = Engine(load_model(str(target)), load_model(str(draft)))
    ids = engine.encode_raw("the cat and the dog in the house")
    plain, _ = generate(engine, ids, SpecConfig(method="none"), 40)
    spec, fin = generate(engine, ids, SpecConfig(k=3, method="draft", adaptive=False), 40)
    assert spec == plain and fin.stats.drafted > 0
    held, _ = engine.cached_tokens()
    assert held == (ids + plain)[: len(held)] and engine._target.offset == len(held)


class _Sinks(llama.Model):
    """A llama whose cache keeps 4 sink tokens in a ring (mlx-lm's max_kv_size cache): neither
    trimmable nor restorable."""

    def make_cache(self):
        return [RotatingKVCache(256, keep=4) for _ in self.layers]


def test_an_unknown_cache_decodes_plainly_and_refuses_speculation(families):
    loaded = families.pair("llama")[0]
    sinks = _Sinks(loaded.model.args)
    sinks.update(loaded.model.parameters())
    other = type(loaded)(**{**vars(loaded), "model": sinks, "name": "sinks"})
    assert {kind(c) for c in rewindable(sinks.make_cache())} == {"unknown"}
    ids = Engine(loaded, None).encode_raw("the cat and the dog in the house")
    want, _ = generate(Engine(loaded, None), ids, SpecConfig(method="none"), 30)
    engine = Engine(other, None)
    for _ in range(2):  # the end of a generation starts the cache over; the next one is alike
        assert generate(engine, ids, SpecConfig(method="none"), 30)[0] == want
    with pytest.raises(CacheNotTrimmableError) as err:
        generate(engine, ids, SpecConfig(method="ngram", adaptive=False), 30)
    message = str(err.value)
    assert "RotatingKVCache" in message and "--no-spec" in message and "\n" not in message


def test_kinds_of_mlx_lm_layers():
    assert kind(KVCache()) == "trim" and kind(ArraysCache(2)) == "restore"
    assert kind(rewindable([RotatingKVCache(8)])[0]) == "window"
    assert kind(RotatingKVCache(8, keep=4)) == "unknown"
