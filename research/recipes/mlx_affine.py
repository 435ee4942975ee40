"""MLX's affine quantization in NumPy, for scripts that run where MLX is not installed (the lent
GPU's PyTorch twin, research/recipes/gpu_finetune.py): read a quantized draft, write one that
`mx.load` reads as if `nn.quantize` had written it. tests/research/test_mlx_affine.py checks every
function bit for bit against mx.quantize / mx.dequantize.

The rule (mlx/ops.cpp, affine_quantize), per group of `group` weights along the last axis:
scale = (max - min) / (2^bits - 1); the end of larger magnitude (the "edge") is made exact: with
q0 = round(edge / scale), scale = edge / q0 and bias = edge (scale signed so q runs from the edge);
q = clip(round((w - bias) / scale), 0, 2^bits - 1). Values are packed into uint32 words, the first
value in the lowest bits.
"""

from __future__ import annotations

import numpy as np

GROUP = 64


def quantize(w: np.ndarray, bits: int, group: int = GROUP) -> tuple[np.ndarray, ...]:
    """(q [rows, cols] float32 in 0..2^bits-1, scales [rows, cols/group], biases, same shape)."""
    rows = w.shape[0]
    x = np.asarray(w, np.float32).reshape(-1, group)
    n = np.float32(2**bits - 1)
    wmin = x.min(-1, keepdims=True)
    wmax = x.max(-1, keepdims=True)
    mask = np.abs(wmin) > np.abs(wmax)
    scales = np.maximum((wmax - wmin) / n, np.float32(1e-7))
    scales = np.where(mask, scales, -scales)
    edge = np.where(mask, wmin, wmax)
    q0 = np.round(edge / scales)
    with np.errstate(divide="ignore", invalid="ignore"):
        scales = np.where(q0 != 0, edge / q0, scales).astype(np.float32)
    biases = np.where(q0 == 0, np.float32(0), edge).astype(np.float32)
    q = np.clip(np.round((x - biases) / scales), 0, n)
    return q.reshape(rows, -1), scales.reshape(rows, -1), biases.reshape(rows, -1)


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """[rows, cols] values in 0..2^bits-1 -> [rows, cols * bits / 32] uint32 words."""
    per = 32 // bits
    v = np.asarray(q).astype(np.uint32).reshape(q.shape[0], -1, per)
    words = v << (np.arange(per, dtype=np.uint32) * np.uint32(bits))
    return np.bitwise_or.reduce(words, axis=-1).astype(np.uint32)


def unpack(words: np.ndarray, bits: int) -> np.ndarray:
    """pack's inverse: [rows, words] uint32 -> [rows, words * 32 / bits] float32 values."""
    per = 32 // bits
    shifts = np.arange(per, dtype=np.uint32) * np.uint32(bits)
    q = (words[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    return q.reshape(words.shape[0], -1).astype(np.float32)


def dequantize(words: np.ndarray, scales: np.ndarray, biases: np.ndarray, bits: int) -> np.ndarray:
    """w = q * scale + bias per group: [rows, cols] float32."""
    q = unpack(words, bits)
    g = q.shape[1] // scales.shape[1]
    w = q.reshape(q.shape[0], -1, g) * scales[..., None] + biases[..., None]
    return w.reshape(q.shape[0], -1).astype(np.float32)
