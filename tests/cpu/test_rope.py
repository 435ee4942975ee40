"""Rotary embeddings from tables (edgespec/rope.py): the same bits as mx.fast.rope, standing for
nn.RoPE in a CPU backend's twin only where it applies (the model keeps its own), off with
EDGESPEC_CPU_OPT=-table_rope."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from edgespec.cache import KVState
from edgespec.cpu.backend import CpuBackend
from edgespec.cpu.rope import TableRoPE, Tables
from tests.helpers import engine_state

OFFSETS = [0, 1, 2, 7, 31, 255, 256, 1000, 4093, 4095, 4096, 5000, 9000]


@pytest.fixture(autouse=True)
def tables_on(monkeypatch):
    monkeypatch.delenv("EDGESPEC_CPU_OPT", raising=False)


@pytest.mark.parametrize(
    "dims, head_dim, base, scale",
    [(64, 64, 100000.0, 1.0), (128, 128, 1e6, 1.0), (32, 64, 10000.0, 1.0), (64, 64, 500.0, 0.25)],
)
def test_same_bits_as_mx_fast_rope(dims, head_dim, base, scale):
    mx.random.seed(dims + head_dim)
    tables = Tables()
    layer = TableRoPE(dims, traditional=False, base=base, scale=scale, tables=tables)
    for offset in OFFSETS:  # across the first table's end: it doubles, the bits stay
        for length in (1, 2, 3, 5, 17):
            x = mx.random.normal((1, 3, length, head_dim))
            want = mx.fast.rope(x, dims, traditional=False, base=base, scale=scale, offset=offset)
            got = layer(x, offset=offset)
            assert got.shape == want.shape
            assert mx.array_equal(got, want).item(), (offset, length)
    assert tables.tables[(dims, base, scale)][0].shape[0] == 16384  # 4096 doubled twice


def test_the_twin_replaces_only_plain_non_traditional_ropes_and_no_parameters(monkeypatch):
    class Attention(nn.Module):
        def __init__(self, traditional: bool):
            super().__init__()
            self.q = nn.Linear(8, 8)
            self.rope = nn.RoPE(8, traditional=traditional)

    class OtherRope(nn.RoPE):  # e.g. Llama 3's or YaRN's classes: not ours to replace
        pass

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = [Attention(False), Attention(True), Attention(False)]
            self.layers[2].rope = OtherRope(8)

    model, backend = Model(), CpuBackend()
    before = sorted(k for k, _ in tree_flatten(model.parameters()))
    twin = backend.model(model)
    assert (
        isinstance(twin.layers[0].rope, TableRoPE) and twin.layers[0].rope.tables is backend.tables
    )
    assert type(twin.layers[1].rope) is nn.RoPE  # traditional (interleaved) pairs: kept
    assert type(twin.layers[2].rope) is OtherRope
    assert type(model.layers[0].rope) is nn.RoPE  # the model keeps its own
    assert sorted(k for k, _ in tree_flatten(twin.parameters())) == before  # nothing to save
    # the same tree shape: parameters move between twin and model both ways
    Attention(False).update(twin.layers[0].parameters())
    twin.layers[0].update(Attention(False).parameters())
    monkeypatch.setenv("EDGESPEC_CPU_OPT", "-table_rope")
    assert type(CpuBackend().model(Model()).layers[0].rope) is nn.RoPE


def test_other_inputs_take_mlx_own_path():
    tables = Tables()
    layer = TableRoPE(16, base=10000.0, tables=tables)
    x = mx.random.normal((1, 2, 3, 16))
    half = x.astype(mx.float16)  # the fallback rounds its cos/sin to the input's dtype: MLX's path
    got = layer(half, offset=3)
    assert tables.tables == {}  # no table was made: MLX's own function ran
    assert mx.array_equal(
        got, mx.fast.rope(half, 16, traditional=False, base=10000.0, scale=1.0, offset=3)
    ).item()
    layer(x, offset=3)
    assert list(tables.tables) == [(16, 10000.0, 1.0)]


def test_a_real_forward_has_the_same_logits_with_tables(tiny_models, monkeypatch):
    monkeypatch.setenv("EDGESPEC_CPU_OPT", "-grouped_attention")  # the verify as mlx-lm attends
    target = tiny_models[0]
    tabled = engine_state(target.model, "target")  # the Engine's twin: the tables (CPU)
    assert any(isinstance(m.get("rope"), TableRoPE) for _, m in tabled.model.named_modules())
    assert not any(isinstance(m.get("rope"), TableRoPE) for _, m in target.model.named_modules())
    ids = mx.array([1, 5, 9, 2, 7, 3, 8, 4, 6, 10, 11, 12], dtype=mx.int32)

    def logits(state: KVState) -> mx.array:
        state.rewind([], 0)
        state.forward(ids[:9])
        out = state.forward(ids[9:])  # a 3-token verify-like forward at offset 9
        mx.eval(out)
        return out

    with_tables = logits(tabled)
    without = logits(KVState(target.model, "mlx-lm"))  # the model itself: mx.fast.rope
    assert mx.array_equal(with_tables, without).item()
