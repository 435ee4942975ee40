"""The CPU's fast exp and softmax (edgespec/fastexp.py): accurate to float32 rounding against
float64, exact zeros where e^x leaves float32's normal range (masked -inf entries included),
handed to warp by the Engine on the CPU (its CpuBackend's softmax) and switched off by
EDGESPEC_CPU_OPT=-fast_exp."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import numpy as np
import pytest

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.cpu import fastexp
from edgespec.cpu.backend import CpuBackend, Switches
from edgespec.sampling import warp

pytestmark = pytest.mark.skipif(not fastexp.compiler_works(), reason="MLX cannot compile here")


def test_exp_is_accurate_to_float32_rounding_over_its_range():
    x = np.concatenate([-np.geomspace(1e-8, 86.9, 200_000), -np.linspace(0, 86.9, 100_001)])
    x32 = x.astype(np.float32)
    got = np.array(mx.compile(fastexp.exp_nonpositive)(mx.array(x32)), dtype=np.float64)
    want = np.exp(x32.astype(np.float64))
    rel = np.abs(got - want) / want
    assert rel.max() < 2.5e-7  # ~2 float32 ulps; MLX's own exp is off by up to ~1.6e-6 here


def test_exp_gives_exact_zeros_below_the_floor_and_one_at_zero():
    x = mx.array([0.0, -0.0, -87.5, -100.0, -1e30, -np.inf], dtype=mx.float32)
    got = np.array(fastexp.exp_nonpositive(x))
    assert got[0] == 1.0 and got[1] == 1.0
    assert (got[2:] == 0.0).all()
    assert fastexp.exp_nonpositive(mx.array([-1.0])).item() == pytest.approx(np.exp(-1.0), rel=1e-7)


@pytest.mark.parametrize("shape", [(7,), (3, 500), (2, 4, 49152)])
def test_softmax_matches_float64_and_keeps_masked_entries_at_zero(shape):
    mx.random.seed(len(shape))
    z = mx.random.normal(shape) * 6
    z = mx.where(mx.random.uniform(shape=shape) < 0.3, -mx.inf, z)  # top-k style masks
    z = mx.concatenate([z, mx.full((*shape[:-1], 1), 3.0)], axis=-1)  # a finite max per row
    got = np.array(fastexp.make_softmax()(z), dtype=np.float64)
    zn = np.array(z, dtype=np.float64)
    want = np.exp(zn - zn.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    # MLX sums float32 rows with float32 accumulators: a 49k-wide row adds up to 1 +- ~3e-5,
    # as mx.softmax's rows do; the entries' ratios are exact to float32 rounding.
    mlx_sums = np.array(mx.softmax(z, axis=-1), dtype=np.float64).sum(-1)
    assert np.allclose(got.sum(-1), 1.0, atol=1e-4)
    assert np.abs(got.sum(-1) - 1.0).max() <= np.abs(mlx_sums - 1.0).max() * 1.5 + 1e-6
    assert (got[np.isneginf(zn)] == 0).all()
    # Entry by entry no worse than MLX's own softmax (both also carry the rounding of z - max).
    mlx = np.array(mx.softmax(z, axis=-1), dtype=np.float64)
    live = want > 1e-30
    err = np.abs(got / got.sum(-1, keepdims=True) - want)[live] / want[live]
    mlx_err = np.abs(mlx / mlx.sum(-1, keepdims=True) - want)[live] / want[live]
    assert err.max() <= mlx_err.max() and err.mean() <= mlx_err.mean()


def test_warp_uses_it_on_the_cpu_and_the_switch_turns_it_off(monkeypatch, engine):
    mx.random.seed(3)
    logits = mx.random.normal((2, 1000)) * 4
    cfg = SamplingConfig(temperature=0.7)
    assert Switches.from_environment().fast_exp  # the CPU, a compiler (else skipped)
    softmax = engine.backend.softmax
    assert softmax is not None
    # The Engine hands it to its states, whose logits warp turns into p and q.
    assert engine._target.softmax is softmax and engine._draft.softmax is softmax
    fast = warp(logits, cfg, softmax)
    # Nothing cut (no top-k/top-p/min-p): the softmax is warp's result, not renormalised again,
    # and the temperature scales the row inside the compiled function.
    assert mx.array_equal(fast, softmax(logits, 1 / 0.7)).item()
    assert mx.allclose(fast, softmax(logits / 0.7), rtol=1e-5, atol=1e-12).item()
    monkeypatch.setenv("EDGESPEC_CPU_OPT", "-fast_exp")
    assert not Switches.from_environment().fast_exp and CpuBackend().softmax is None
    slow = warp(logits, cfg, CpuBackend().softmax)
    assert mx.array_equal(slow, mx.softmax(logits / 0.7, axis=-1)).item()
    # warp itself never picks a softmax: without one it is MLX's, switch or not
    monkeypatch.delenv("EDGESPEC_CPU_OPT", raising=False)
    assert mx.array_equal(warp(logits, cfg), slow).item()
    assert not mx.array_equal(fast, slow).item()  # MLX's exp differs in the last digits
    assert mx.allclose(fast, slow, rtol=1e-5, atol=1e-9).item()


def test_sampled_decoding_warps_with_the_states_softmax_and_configs_hold_values(engine):
    calls = []
    real = engine.backend.softmax

    def spy(z: mx.array, scale: float) -> mx.array:
        calls.append(z.shape)
        return real(z, scale)

    engine._target.softmax = spy
    config = GenerationConfig(max_tokens=3, sampling=SamplingConfig(temperature=0.7, seed=1))
    list(engine.generate([1, 5, 9], dataclasses.replace(config, spec=SpecConfig(method="none"))))
    assert len(calls) == 3  # one warp per plain step
    plain = (bool, int, float, str, tuple, type(None), SamplingConfig, SpecConfig)
    for cfg in (config, config.sampling, config.spec):  # no callables: plain values only
        assert all(isinstance(getattr(cfg, f.name), plain) for f in dataclasses.fields(cfg)), cfg
