"""A faster, more accurate exponential and softmax for MLX's CPU backend, for sampling.

MLX's CPU `exp` is slow per element, and its results are off by up to ~1.6e-6 relative (against
float64). At temperature > 0 every sampled row is a softmax over the whole vocabulary: a K=1
round warps the verify's 2 rows of logits, a plain step one.

`exp_nonpositive` is Cephes' single-precision expf (range reduction by ln 2 in two parts, a
degree-6 polynomial, the power of two put together in the exponent bits), written in MLX
operations; compiled, MLX fuses them into one loop that the C++ compiler vectorises (largest
relative error 7.9e-8; speed: docs/cpu-backend.md). Softmax only needs e^x for x <= 0 (after subtracting the row's
maximum), so inputs below -87 (where e^x leaves float32's normal range, -inf included) give
exactly 0: a token masked by top-k keeps probability 0.

`sampling.warp` uses it on the CPU backend only (GPUs have fast kernels; the Engine hands over
its CPU backend's `softmax`, edgespec/cpu/backend.py), only where MLX can compile a fused kernel (`compiler_works`),
and not with `EDGESPEC_CPU_OPT=-fast_exp`. The attention's softmax does not use it: over short rows (a
few hundred keys) the gain was small, and from a thousand keys on NumPy's vectorised exp is
faster still (attention.py, numpy_softmax).
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

_LOG2E = 1.4426950408889634
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4  # ln 2 = hi + lo; n * hi is exact in float32
_POLY = (
    1.9875691500e-4,
    1.3981999507e-3,
    8.3334519073e-3,
    4.1665795894e-2,
    1.6666665459e-1,
    5.0000001201e-1,
)
_FLOOR = -87.0  # e^-87 ~ 1.6e-38, just above float32's smallest normal


def compiler_works() -> bool:
    """Whether MLX can build a fused kernel here: its CPU backend compiles one with the system
    C++ compiler, which a machine may lack (a few ms the first time, then MLX's kernel cache)."""
    try:
        fused = mx.compile(lambda a, b: mx.rsqrt(a * b + 1.0) * a)
        mx.eval(fused(mx.ones((4,)), mx.full((4,), 2.0)))
        return True
    except Exception:  # noqa: BLE001 - any failure means: keep MLX's own operations
        return False


def exp_nonpositive(x: mx.array) -> mx.array:
    """e^x for float32 x <= 0 (0 below -87, -inf included). Example: [0, -1, -inf] ->
    [1, 0.36787945, 0]."""
    clipped = mx.maximum(x, _FLOOR)
    n = mx.floor(clipped * _LOG2E + 0.5)
    r = clipped - n * _LN2_HI - n * _LN2_LO
    p = _POLY[0] * r + _POLY[1]
    for c in _POLY[2:]:
        p = p * r + c
    p = p * r * r + r + 1.0
    two_n = mx.view((n.astype(mx.int32) + 127) << 23, mx.float32)  # 2^n, n in [-126, 0]
    return mx.where(x > _FLOOR, p * two_n, 0.0)


def _softmax(z: mx.array, scale: mx.array) -> mx.array:
    e = exp_nonpositive((z - mx.max(z, axis=-1, keepdims=True)) * scale)
    return e / mx.sum(e, axis=-1, keepdims=True)


def make_softmax() -> Callable[[mx.array, float], mx.array]:
    """A new softmax(z, scale=1.0) (a CPU backend holds one, with its traces): softmax over the
    last axis of float32 `scale * z` (scale > 0; rows with at least one finite entry), with
    exp_nonpositive, as one compiled function. The scale (1 / temperature) multiplies the row
    after its maximum is subtracted, in the same fused loop as the exp."""
    compiled = mx.compile(_softmax)

    def softmax(z: mx.array, scale: float = 1.0) -> mx.array:
        return compiled(z, mx.array(scale, dtype=mx.float32))

    return softmax
