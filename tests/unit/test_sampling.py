"""Warps and seeded sampling: hand-worked cases, agreement with numpy, reproducibility."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec.config import SamplingConfig
from edgespec.sampling import make_key, sample, split, uniforms, warp
from tests.helpers.reference_loop import sample_np, warp_np


def test_top_p_worked_example():
    logits = mx.log(mx.array([0.5, 0.3, 0.2]))
    probs = warp(logits, SamplingConfig(temperature=1.0, top_p=0.6))
    assert np.allclose(np.array(probs), [0.625, 0.375, 0.0], atol=1e-6)


def test_greedy_is_one_hot_at_argmax():
    probs = warp(mx.array([[0.1, 3.0, -2.0], [5.0, 1.0, 4.0]]), SamplingConfig(temperature=0))
    assert np.array(probs).tolist() == [[0, 1, 0], [1, 0, 0]]


def test_top_k_and_min_p():
    logits = mx.log(mx.array([0.4, 0.3, 0.2, 0.1]))
    top2 = np.array(warp(logits, SamplingConfig(temperature=1.0, top_k=2)))
    assert np.allclose(top2, [4 / 7, 3 / 7, 0, 0], atol=1e-6)
    minp = np.array(warp(logits, SamplingConfig(temperature=1.0, min_p=0.45)))
    assert np.allclose(minp, [4 / 9, 3 / 9, 2 / 9, 0], atol=1e-6)


def test_temperature_sharpens():
    logits = mx.array([1.0, 0.0])
    hot, cold = (np.array(warp(logits, SamplingConfig(temperature=t))) for t in (2.0, 0.5))
    assert cold[0] > hot[0] > 0.5


@pytest.mark.parametrize(
    "cfg",
    [
        SamplingConfig(temperature=0.7),
        SamplingConfig(temperature=1.3, top_k=5),
        SamplingConfig(temperature=1.0, top_p=0.8),
        SamplingConfig(temperature=0.9, min_p=0.1),
        SamplingConfig(temperature=1.0, top_k=20, top_p=0.9, min_p=0.05),
    ],
)
def test_warp_matches_numpy_reference(cfg):
    logits = np.random.default_rng(0).standard_normal((6, 50)).astype(np.float32) * 2
    ours = np.array(warp(mx.array(logits), cfg))
    ref = np.stack([warp_np(row, cfg) for row in logits])
    assert np.allclose(ours, ref, atol=1e-5)
    assert np.allclose(ours.sum(-1), 1, atol=1e-5)


def test_sample_worked_example_and_zero_weights():
    w = mx.array([0.0, 2.0, 0.0, 2.0])
    assert sample(w, mx.array(0.49)).item() == 1
    assert sample(w, mx.array(0.5)).item() == 3
    assert sample(w, mx.array(0.0)).item() == 1  # a zero-weight token is never chosen


def test_sample_matches_numpy_and_frequencies():
    probs = np.array([0.1, 0.0, 0.6, 0.3], dtype=np.float32)
    u = uniforms(make_key(3), 20000)
    ours = np.array(sample(mx.broadcast_to(mx.array(probs), (20000, 4)), u))
    ref = np.array([sample_np(probs, x) for x in np.array(u)[:200]])
    assert (ours[:200] == ref).all()
    freq = np.bincount(ours, minlength=4) / len(ours)
    assert np.allclose(freq, probs, atol=0.015) and freq[1] == 0


def test_same_key_same_draws_different_key_different_draws():
    a, b = split(make_key(7), 2)
    assert np.array_equal(np.array(uniforms(make_key(7), 8)), np.array(uniforms(make_key(7), 8)))
    assert not np.array_equal(np.array(uniforms(a, 8)), np.array(uniforms(b, 8)))
