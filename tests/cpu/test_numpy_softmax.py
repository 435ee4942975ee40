"""The attention's softmax in NumPy (edgespec.cpu.attention.numpy_softmax) and the grouped
attention rows that take it (from FROM_KEYS keys on): MLX's values, every row computed alike
whatever forward it is part of (tests/cpu/test_blas.py checks a whole forward's bits under the
reference BLAS), prompt chunks in pieces, a chain-shaped tree as the chain."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec.cpu import attention


@pytest.mark.parametrize("n", [1, 7, 63, 64, 65, 127, 128, 129, 300, 1000, 4099])
def test_a_row_sums_alike_with_trailing_zeros(n):
    """What lets a verify row (its later keys masked to 0) keep a one-token step's bits; NumPy's
    own pairwise sum does not (checked here too, so the test would notice if it ever did)."""
    rng = np.random.default_rng(n)
    row = rng.random((3, n), dtype=np.float32)
    for zeros in (1, 5, 64, 200, 1000):
        padded = np.concatenate([row, np.zeros((3, zeros), np.float32)], axis=-1)
        assert np.array_equal(attention.lane_total(row), attention.lane_total(padded))
    np.testing.assert_allclose(attention.lane_total(row)[:, 0], row.sum(-1), rtol=1e-5)


def test_pairwise_summation_would_not_do():
    rng = np.random.default_rng(0)
    rows = [rng.random(n, dtype=np.float32) for n in range(200, 400)]
    differ = [r for r in rows if r.sum() != np.concatenate([r, np.zeros(300, np.float32)]).sum()]
    assert differ  # so lane_total is needed


@pytest.mark.parametrize("length,keys", [(1, 50), (1, 3000), (5, 5), (5, 700), (8, 2050)])
def test_softmax_is_mlx_softmax_under_the_causal_mask(length, keys):
    rng = np.random.default_rng(length * keys)
    scores = (rng.standard_normal((1, 3, 3 * length, keys)) * 6).astype(np.float32)
    got = np.array(attention.numpy_softmax(mx.array(scores), length))
    shaped = mx.array(scores.reshape(1, 3, 3, length, keys))
    allowed = mx.arange(keys)[None, :] <= mx.arange(keys - length, keys)[:, None]
    want = mx.softmax(mx.where(allowed, shaped, -mx.inf), axis=-1, precise=True)
    np.testing.assert_allclose(got.reshape(want.shape), np.array(want), rtol=1e-5, atol=1e-6)
    runs = got.reshape(-1, length, keys)
    for i in range(length):  # a row of a run: its own keys' softmax, bit for bit, then zeros
        seen = keys - length + i + 1
        alone = np.array(
            attention.numpy_softmax(
                mx.array(scores.reshape(-1, length, keys)[:, i, :seen].copy()), 1
            )
        )
        assert np.array_equal(runs[:, i, :seen], alone)
        assert not runs[:, i, seen:].any()


def _qkv(length: int, keys: int, seed: int = 0):
    mx.random.seed(seed)
    return (
        mx.random.normal((1, 9, length, 16)),
        mx.random.normal((1, 3, keys, 16)),
        mx.random.normal((1, 3, keys, 16)),
    )


@pytest.mark.parametrize("length", [1, 4, 40])
def test_grouped_rows_across_from_keys_are_mlx_attention(monkeypatch, length):
    """Rows on both sides of FROM_KEYS, the NumPy ones in several pieces (PIECE made small)."""
    monkeypatch.setattr(attention, "FROM_KEYS", 110)
    monkeypatch.setattr(attention, "PIECE", 9 * 120 * 3)  # three query positions a piece
    q, k, v = _qkv(length, 120)
    mask = "causal" if length > 1 else None
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    got = attention.grouped_attention(q, k, v, 0.25, length > 1, None, attention.numpy_softmax)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)


def test_pieces_keep_each_rows_bits(monkeypatch):
    """A 40-row chunk in pieces of 3 positions gives the rows a one-piece call gives (under MKL
    the products' rows could differ in the last bits, so compare the softmax's own inputs: one
    piece against many, same keys)."""
    monkeypatch.setattr(attention, "FROM_KEYS", 0)
    q, k, v = _qkv(40, 200, seed=3)
    whole = attention.grouped_attention(q, k, v, 0.25, True, None, attention.numpy_softmax)
    monkeypatch.setattr(attention, "PIECE", 9 * 200 * 3)
    pieces = attention.grouped_attention(q, k, v, 0.25, True, None, attention.numpy_softmax)
    np.testing.assert_allclose(np.array(pieces), np.array(whole), rtol=1e-6, atol=1e-6)


def test_a_chain_shaped_tree_mask_is_the_causal_forward(monkeypatch):
    """masked_attention (draft trees) splits its rows at FROM_KEYS as a causal forward does."""
    monkeypatch.setattr(attention, "FROM_KEYS", 100)

    from mlx_lm.models.cache import KVCache

    cache = KVCache()  # an EdgeSpec state's full-attention layer
    q, k, v = _qkv(6, 102, seed=5)
    allowed = mx.arange(102)[None, :] <= mx.arange(96, 102)[:, None]
    tree = attention.masked_attention(q, k, v, 0.25, allowed, cache, rows=attention.numpy_softmax)
    chain = attention.grouped_attention(q, k, v, 0.25, True, None, attention.numpy_softmax)
    np.testing.assert_allclose(np.array(tree), np.array(chain), rtol=1e-6, atol=1e-6)


def test_numpy_from_counts_the_keys_each_row_sees(monkeypatch):
    monkeypatch.setattr(attention, "FROM_KEYS", 1024)
    assert attention.numpy_from(1026, 5, True) == 2  # rows see 1022..1026 keys
    assert attention.numpy_from(1000, 5, True) == 5  # none
    assert attention.numpy_from(5000, 512, True) == 0  # all
    assert attention.numpy_from(1024, 1, False) == 0
    assert attention.numpy_from(1023, 3, False) == 3


def test_the_switch_turns_it_off(monkeypatch):
    from edgespec.cpu.backend import Switches

    monkeypatch.setenv("EDGESPEC_CPU_OPT", "-numpy_softmax")
    assert not Switches.from_environment().numpy_softmax
    monkeypatch.delenv("EDGESPEC_CPU_OPT", raising=False)
    assert Switches.from_environment().numpy_softmax  # the tests run on the CPU backend
    monkeypatch.setenv("EDGESPEC_CPU_OPT", "-grouped_attention")  # it rides on the grouped path
    assert not Switches.from_environment().numpy_softmax


def test_only_plain_kv_layers_and_draft_bounds_take_numpy_rows():
    """A model's window layer attends under its own masks (an array for a verify, none for a
    one-token step), so NumPy's softmax would reach its steps and not its verifies: it keeps
    MLX's. A draft's attention bound, made of a full layer, keeps that layer's rows."""
    from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache

    from edgespec.rewind import WindowKVCache

    full = KVCache()
    layers = [full, RotatingKVCache(max_size=2048), WindowKVCache(2048)]
    layers += [WindowKVCache.of(full, 2048), QuantizedKVCache()]
    assert [attention.groupable(c) for c in layers] == [True, False, True, True, False]
    assert [attention.numpy_rows(c) for c in layers] == [True, False, False, True, False]
