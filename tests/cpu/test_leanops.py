"""Lean Linear / RMSNorm (edgespec/leanops.py): the same bits as MLX's layers, fewer graph
operations, standing only for exact nn.Linear / nn.RMSNorm in a CPU backend's twin (the model
keeps its layers), safe when weights change or are differentiated, off with EDGESPEC_CPU_OPT=-lean_ops."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from edgespec.cache import KVState
from edgespec.cpu.backend import CpuBackend
from edgespec.cpu.leanops import LeanLinear, LeanRMSNorm
from tests.helpers import engine_state, same_bits


@pytest.fixture(autouse=True)
def lean_on(monkeypatch):
    monkeypatch.delenv("EDGESPEC_CPU_OPT", raising=False)


def lean(module: nn.Module) -> nn.Module:
    """`module`'s twin with the lean layers (a CPU backend's)."""
    twin = CpuBackend().model(module)
    assert any(isinstance(m, LeanLinear | LeanRMSNorm) for _, m in twin.named_modules())
    return twin


@pytest.mark.parametrize("bias", [False, True])
def test_lean_linear_has_the_same_bits(bias):
    mx.random.seed(1)
    plain = nn.Linear(96, 40, bias=bias)
    twin = lean(nn.Linear(96, 40, bias=bias))
    twin.update(plain.parameters())
    assert isinstance(twin, LeanLinear)
    for shape in [(96,), (1, 96), (1, 1, 96), (1, 3, 96), (2, 5, 96)]:
        x = mx.random.normal(shape) * 3
        assert same_bits(twin(x), plain(x)), shape


@pytest.mark.parametrize("dims", [3, 64, 576, 960])
def test_lean_rms_norm_has_the_same_bits_as_mx_fast(dims):
    mx.random.seed(dims)
    for eps in (1e-5, 1e-6, 9.999999747378752e-06):
        norm = lean(nn.RMSNorm(dims, eps=eps))
        norm.weight = mx.random.normal((dims,))
        for length in (1, 2, 3, 7):
            # rows of very different sizes: the sum, the 1/n and the eps all matter
            x = mx.random.normal((1, length, dims)) * mx.exp(mx.random.normal((1, length, 1)) * 3)
            for _ in range(2):  # the second call uses the kept constants
                assert same_bits(norm(x), mx.fast.rms_norm(x, norm.weight, eps)), (eps, length)


def test_a_new_weight_is_noticed():
    mx.random.seed(3)
    linear, norm = lean(nn.Linear(8, 4)), lean(nn.RMSNorm(8))
    x = mx.random.normal((1, 2, 8))
    linear(x), norm(x)  # keep views of the first weights
    linear.update({"weight": mx.random.normal((4, 8)), "bias": mx.random.normal((4,))})
    norm.update({"weight": mx.random.normal((8,))})
    want = mx.addmm(linear.bias, x, linear.weight.T)
    assert same_bits(linear(x), want)
    assert same_bits(norm(x), mx.fast.rms_norm(x, norm.weight, norm.eps))


def test_gradients_flow_to_the_weights_as_through_mlx_layers():
    mx.random.seed(4)

    def make() -> nn.Module:
        mx.random.seed(5)
        return nn.Sequential(nn.Linear(6, 6), nn.RMSNorm(6), nn.Linear(6, 2))

    plain, twin = make(), lean(make())
    for x in (mx.random.normal((3, 6)), mx.random.normal((1, 3, 6))):  # 2-D, and a batch of one
        twin(x)  # views kept before differentiating: they must not stand in for traced weights

        def loss(model: nn.Module, x: mx.array = x) -> mx.array:
            return (model(x) ** 2).sum()

        want = nn.value_and_grad(plain, loss)(plain)
        got = nn.value_and_grad(twin, loss)(twin)
        assert mx.allclose(got[0], want[0]).item()
        for (k1, g1), (k2, g2) in zip(tree_flatten(want[1]), tree_flatten(got[1]), strict=True):
            assert k1 == k2 and mx.allclose(g1, g2, atol=1e-6).item(), k1


class OtherLinear(nn.Linear):  # someone else's subclass: not ours to change
    pass


def test_the_twin_changes_only_exact_layers_and_keeps_the_tree(monkeypatch):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8, bias=False)
            self.padded = OtherLinear(8, 8)
            self.norm = nn.RMSNorm(8)
            self.layer_norm = nn.LayerNorm(8)
            self.quantized = nn.QuantizedLinear(64, 64)

    model, backend = Block(), CpuBackend()
    before = [(k, v.shape) for k, v in tree_flatten(model.parameters())]
    twin = backend.model(model)
    assert type(twin.proj) is LeanLinear and type(twin.norm) is LeanRMSNorm
    assert type(twin.padded) is OtherLinear and type(twin.layer_norm) is nn.LayerNorm
    assert type(twin.quantized) is nn.QuantizedLinear
    assert type(model.proj) is nn.Linear and type(model.norm) is nn.RMSNorm  # left as it was
    assert twin.proj.weight is model.proj.weight  # the same arrays, nothing copied
    assert [(k, v.shape) for k, v in tree_flatten(twin.parameters())] == before
    Block().update(twin.parameters())  # weights move both ways between lean and plain trees
    twin.update(Block().parameters())
    assert backend.model(model) is twin  # one twin per model
    monkeypatch.setenv("EDGESPEC_CPU_OPT", "-lean_ops")
    assert type(CpuBackend().model(Block()).proj) is nn.Linear


def test_other_dtypes_and_the_model_itself_run_mlx_own_code():
    plain_linear, plain_norm = nn.Linear(8, 8), nn.RMSNorm(8)
    linear, norm = lean(plain_linear), lean(plain_norm)
    x = mx.random.normal((1, 2, 8))
    plain_linear(x), plain_norm(x)
    assert "_lean_t" not in plain_linear.__dict__ and "_lean_c" not in plain_norm.__dict__
    half = x.astype(mx.float16)
    assert same_bits(norm(half), mx.fast.rms_norm(half, norm.weight, norm.eps))
    assert "_lean_c" not in norm.__dict__
    norm(x), linear(x)
    assert "_lean_c" in norm.__dict__ and "_lean_t" in linear.__dict__
    assert "_lean_c" not in plain_norm.__dict__ and "_lean_t" not in plain_linear.__dict__


def ops_in(out: mx.array, path: Path) -> list[str]:
    mx.export_to_dot(str(path), out)
    return re.findall(r'label ="([^"]*)"', path.read_text())


def test_a_real_forward_keeps_its_logits_and_builds_fewer_operations(
    tiny_pair, tmp_path, monkeypatch
):
    from mlx_lm import load

    # the lean layers alone (test_blocks.py), the prompt as mlx-lm attends to it
    monkeypatch.setenv("EDGESPEC_CPU_OPT", "-compiled_blocks,-grouped_attention")
    target = SimpleNamespace(model=load(str(tiny_pair[0]))[0])
    lean_state = engine_state(target.model, "target")  # the Engine's twin: the lean layers (CPU)
    kinds = {type(m) for _, m in lean_state.model.named_modules()}
    assert {LeanLinear, LeanRMSNorm} <= kinds and not {nn.Linear, nn.RMSNorm} & kinds
    plain_state = KVState(target.model, "mlx-lm")  # the model itself: mlx-lm's layers
    ids = mx.array([1, 5, 9, 2, 7, 3, 8, 4, 6, 10, 11, 12], dtype=mx.int32)

    def step(state: KVState, count: bool = False) -> tuple[mx.array, list[str]]:
        state.rewind([], 0)
        mx.eval(state.forward(ids[:9]))
        out = state.forward(ids[9:10])  # a one-token decoding step at offset 9
        ops = ops_in(out, tmp_path / "g.dot") if count else []
        mx.eval(out)
        return out, ops

    step(lean_state)  # the kept views and constants get computed once
    lean_out, lean_ops = step(lean_state, count=True)
    plain_out, plain_ops = step(plain_state, count=True)
    assert same_bits(lean_out, plain_out)
    layers = len(target.model.layers)
    for kind in ("Transpose", "Flatten", "Unflatten"):  # 7 Linear calls per layer
        assert plain_ops.count(kind) - lean_ops.count(kind) >= 7 * layers, kind
    assert len(plain_ops) - len(lean_ops) >= 30 * layers
