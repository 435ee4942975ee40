"""Rotary embeddings from tables (edgespec/rope.py): the same bits as mx.fast.rope, installed only
where it applies, off inside native() and with EDGESPEC_TABLE_ROPE=0."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from edgespec.cpu import rope
from edgespec.cpu.rope import TableRoPE
from tests.helpers import engine_state

OFFSETS = [0, 1, 2, 7, 31, 255, 256, 1000, 4093, 4095, 4096, 5000, 9000]


@pytest.fixture(autouse=True)
def fresh_tables(monkeypatch):
    monkeypatch.setattr(rope, "_tables", {})
    monkeypatch.setattr(rope, "_rows_kept", {})
    monkeypatch.delenv("EDGESPEC_TABLE_ROPE", raising=False)


@pytest.mark.parametrize(
    "dims, head_dim, base, scale",
    [(64, 64, 100000.0, 1.0), (128, 128, 1e6, 1.0), (32, 64, 10000.0, 1.0), (64, 64, 500.0, 0.25)],
)
def test_same_bits_as_mx_fast_rope(dims, head_dim, base, scale):
    mx.random.seed(dims + head_dim)
    layer = TableRoPE(dims, traditional=False, base=base, scale=scale)
    for offset in OFFSETS:  # across the first table's end: it doubles, the bits stay
        for length in (1, 2, 3, 5, 17):
            x = mx.random.normal((1, 3, length, head_dim))
            want = mx.fast.rope(x, dims, traditional=False, base=base, scale=scale, offset=offset)
            got = layer(x, offset=offset)
            assert got.shape == want.shape
            assert mx.array_equal(got, want).item(), (offset, length)
    assert rope._tables[(dims, base, scale)][0].shape[0] == 16384  # 4096 doubled twice


def test_install_replaces_only_plain_non_traditional_ropes_and_no_parameters(monkeypatch):
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

    model = Model()
    before = sorted(k for k, _ in tree_flatten(model.parameters()))
    assert rope.install(model) == 1
    assert isinstance(model.layers[0].rope, TableRoPE)
    assert type(model.layers[1].rope) is nn.RoPE  # traditional (interleaved) pairs: kept
    assert type(model.layers[2].rope) is OtherRope
    assert sorted(k for k, _ in tree_flatten(model.parameters())) == before  # nothing to save
    # the same tree shape: parameters move between patched and unpatched models both ways
    Attention(False).update(model.layers[0].parameters())
    model.layers[0].update(Attention(False).parameters())
    assert rope.install(model) == 0  # idempotent
    monkeypatch.setenv("EDGESPEC_TABLE_ROPE", "0")
    fresh = Model()
    assert rope.install(fresh) == 0 and type(fresh.layers[0].rope) is nn.RoPE


def test_native_block_and_other_inputs_take_mlx_own_path():
    layer = TableRoPE(16, base=10000.0)
    x = mx.random.normal((1, 2, 3, 16))
    with rope.native():
        with rope.native():
            pass
        got = layer(x, offset=10)  # still inside the outer block
    assert rope._tables == {}  # no table was made: MLX's own function ran
    assert mx.array_equal(
        got, mx.fast.rope(x, 16, traditional=False, base=10000.0, scale=1.0, offset=10)
    ).item()
    half = x.astype(mx.float16)  # the fallback rounds its cos/sin to the input's dtype: MLX's path
    layer(half, offset=3)
    assert rope._tables == {}
    layer(x, offset=3)
    assert list(rope._tables) == [(16, 10000.0, 1.0)]


def test_a_real_forward_has_the_same_logits_with_tables(tiny_models):
    target = tiny_models[0]
    state = engine_state(target.model, "target")  # the Engine's rewrites: the tables (CPU)
    assert any(isinstance(m.get("rope"), TableRoPE) for _, m in target.model.named_modules())
    ids = mx.array([1, 5, 9, 2, 7, 3, 8, 4, 6, 10, 11, 12], dtype=mx.int32)

    def logits() -> mx.array:
        state.rewind([], 0)
        state.forward(ids[:9])
        out = state.forward(ids[9:])  # a 3-token verify-like forward at offset 9
        mx.eval(out)
        return out

    with_tables = logits()
    with rope.native():
        without = logits()
    assert mx.array_equal(with_tables, without).item()
