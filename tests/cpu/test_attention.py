"""Grouped verify attention (edgespec.cpu.attention): same values as MLX's attention, taken only by
a CPU backend's twin (built with it) on EdgeSpec's caches (mlx-lm's modules keep their function), and
row-exact where the BLAS is (tests/cpu/test_blas.py runs a KVState forward
under the reference BLAS, which goes through this path on the CPU)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import llama
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

from edgespec.cache import KVState
from edgespec.cpu import attention, heads
from edgespec.cpu.backend import CpuBackend
from edgespec.cpu.heads import GroupedAttention
from tests.helpers import engine_state
from tests.helpers.tiny import llama_config, random_llama_weights


@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (4, 4), (8, 2)])
@pytest.mark.parametrize("length", [2, 3, 5])
@pytest.mark.parametrize("causal", [True, False])
def test_grouped_attention_matches_mlx(heads, kv_heads, length, causal):
    mx.random.seed(length * 10 + heads)
    keys_len = 37
    q = mx.random.normal((1, heads, length, 16))
    k = mx.random.normal((1, kv_heads, keys_len, 16))
    v = mx.random.normal((1, kv_heads, keys_len, 16))
    want = mx.fast.scaled_dot_product_attention(
        q, k, v, scale=0.25, mask="causal" if causal else None
    )
    got = attention.grouped_attention(q, k, v, 0.25, causal)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)
    if causal:  # the first query row must not see the positions after it
        k2 = mx.concatenate(
            [k[:, :, : keys_len - length + 1], 100 * k[:, :, keys_len - length + 1 :]], 2
        )
        v2 = mx.concatenate(
            [v[:, :, : keys_len - length + 1], 100 * v[:, :, keys_len - length + 1 :]], 2
        )
        first = attention.grouped_attention(q, k2, v2, 0.25, True)[:, :, 0]
        np.testing.assert_allclose(np.array(first), np.array(got[:, :, 0]), rtol=1e-5, atol=1e-5)


def _tiny_llama():
    config = llama_config(vocab_size=512, layers=2, hidden=64)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    model.load_weights([(k, mx.array(v)) for k, v in random_llama_weights(config, seed=1).items()])
    return model


@pytest.mark.parametrize("numpy_softmax", ["0", "1"])
def test_only_a_twin_on_edgespecs_caches_takes_the_grouped_path(monkeypatch, numpy_softmax):
    monkeypatch.setenv("EDGESPEC_CPU_OPT", "1" if numpy_softmax == "1" else "-numpy_softmax")
    monkeypatch.setattr(attention, "FROM_KEYS", 22)  # rows that see 22 keys or more
    calls = []
    real = attention.grouped_attention

    def spy(*args, **kwargs):
        calls.append(args[0].shape[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, "grouped_attention", spy)
    model = _tiny_llama()
    state = engine_state(model)  # the Engine's twin and cache (the tests run on the CPU)
    assert all(attention.groupable(c) for c in state.cache)
    state.prefill(list(range(1, 20)))
    calls.clear()
    state.forward(mx.array([3, 4, 5], dtype=mx.int32))
    assert calls == [3, 3]  # a 3-token forward, both layers
    calls.clear()
    state.forward(mx.array([6], dtype=mx.int32))
    # one-token steps keep MLX's path, unless NumPy computes the softmax of the rows that see
    # FROM_KEYS keys: then they take the grouped path too (this one sees 22)
    assert calls == ([1, 1] if numpy_softmax == "1" else [])
    calls.clear()
    other = [RotatingKVCache(64, keep=4) for _ in model.layers]  # not one of EdgeSpec's
    state.model(mx.array([[1, 2, 3]]), cache=other)
    model(mx.array([[1, 2, 3]]), cache=make_prompt_cache(model))  # the model itself
    model(mx.array([[1, 2, 3]]), cache=state.cache)  # even on an EdgeSpec cache
    assert calls == []
    monkeypatch.setenv("EDGESPEC_CPU_OPT", "-grouped_attention")
    plain = CpuBackend()
    assert plain.attend is scaled_dot_product_attention
    assert not any(isinstance(m, GroupedAttention) for _, m in plain.model(model).named_modules())


def test_a_grouped_forward_equals_mlx_attention():
    model = _tiny_llama()
    prompt, toks = list(range(1, 30)), mx.array([7, 8, 9, 10], dtype=mx.int32)
    a, b = engine_state(model), KVState(model)  # b: mlx-lm's own model
    a.prefill(prompt)
    b.prefill(prompt)
    np.testing.assert_allclose(
        np.array(a.forward(toks)), np.array(b.forward(toks)), rtol=1e-4, atol=1e-4
    )


def test_twin_attention_calls_the_attention_it_is_built_with_and_leaves_mlx_lm_alone():
    calls = []

    def attend(*args, **kwargs):
        calls.append(args[0].shape[2])
        return scaled_dot_product_attention(*args, **kwargs)

    made: dict = {}
    model = _tiny_llama()
    layer = model.model.layers[0].self_attn
    cls = heads.twin_class(layer, made)
    assert cls is not None and issubclass(cls, llama.Attention) and made == {llama.Attention: cls}
    assert heads.twin_class(model.model.layers[0].mlp, made) is None  # it attends nowhere
    assert llama.scaled_dot_product_attention is scaled_dot_product_attention  # as it was
    twin = cls.__new__(cls)
    twin.__dict__.update(layer.__dict__)
    dict.update(twin, layer)
    twin.attend = attend
    x = mx.random.normal((1, 3, 64))
    for cache in (KVCache(), None):  # an EdgeSpec cache layer takes `attend`; no cache, mlx-lm
        want = layer(x, mask="causal", cache=KVCache() if cache is not None else None)
        assert mx.array_equal(twin(x, mask="causal", cache=cache), want).item()
    assert calls == [3]
