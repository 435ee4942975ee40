"""research/recipes/mlx_affine.py (MLX's 4-bit format without MLX, for the lent GPU's PyTorch twin)
against MLX itself, bit for bit; and the twin's torch quantizer against it where torch exists."""

from __future__ import annotations

import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from research.recipes import mlx_affine

RECIPES = Path(__file__).resolve().parents[2] / "research" / "recipes"


def weights(seed: int) -> np.ndarray:
    """Random rows plus the groups that test the edge rule: all positive, all negative, all zero,
    one outlier, and a group whose edge rounds to q0 = 0 (tiny values around a larger one)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((24, 256)) * 0.05).astype(np.float32)
    w[1, :64] = np.abs(w[1, :64]) + 0.01
    w[2, :64] = -np.abs(w[2, :64]) - 0.01
    w[3, :64] = 0.0
    w[4, :64] = 0.001
    w[4, 7] = 0.9
    w[5, :64] = np.linspace(-1.0, 0.02, 64, dtype=np.float32)
    return w


@pytest.mark.parametrize("bits", [4, 8])
def test_quantize_and_pack_match_mlx_bit_for_bit(bits: int) -> None:
    w = weights(bits)
    words, scales, biases = mx.quantize(mx.array(w), group_size=64, bits=bits)
    q, s, b = mlx_affine.quantize(w, bits)
    assert np.array_equal(mlx_affine.pack(q, bits), np.array(words))
    assert np.array_equal(s, np.array(scales))
    assert np.array_equal(b, np.array(biases))


@pytest.mark.parametrize("bits", [4, 8])
def test_dequantize_matches_mlx(bits: int) -> None:
    w = weights(10 + bits)
    words, scales, biases = mx.quantize(mx.array(w), group_size=64, bits=bits)
    ours = mlx_affine.dequantize(np.array(words), np.array(scales), np.array(biases), bits)
    theirs = np.array(mx.dequantize(words, scales, biases, group_size=64, bits=bits))
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-7)
    assert np.abs(ours - w).max() < 0.5 * np.array(scales).max() * 1.01


def test_unpack_inverts_pack() -> None:
    q = np.random.default_rng(0).integers(0, 16, (3, 128)).astype(np.float32)
    assert np.array_equal(mlx_affine.unpack(mlx_affine.pack(q, 4), 4), q)


def test_twins_torch_quantizer_is_mlx_affines() -> None:
    """Where torch is installed (the lent GPU, a developer's machine): the twin trains through
    exactly the rounding it exports."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sys.path.insert(0, str(RECIPES))
    try:
        import gpu_draft
        import gpu_finetune  # noqa: F401 - the script still imports with its parts split out
    finally:
        sys.path.remove(str(RECIPES))
    w = weights(3)
    q, s, b = gpu_draft.quantize_groups(torch.from_numpy(w), 4)
    rq, rs, rb = mlx_affine.quantize(w, 4)
    assert np.array_equal(q.reshape(w.shape[0], -1).numpy(), rq)
    assert np.array_equal(s.reshape(w.shape[0], -1).numpy(), rs)
    assert np.array_equal(b.reshape(w.shape[0], -1).numpy(), rb)
    packed = gpu_draft.mlx_pack(torch.from_numpy(w), 4)
    words, scales, biases = mx.quantize(mx.array(w), group_size=64, bits=4)
    assert np.array_equal(packed["weight"], np.array(words))
