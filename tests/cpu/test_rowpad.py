"""One-row products run as two rows (edgespec.cpu.rowpad): same parameters, same logits, chosen by the
BLAS, applied by the Engine (in its CPU backend's twin of the model) when EDGESPEC_PAD_ROWS=1."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from edgespec.cache import KVState
from edgespec.cpu import blas
from edgespec.cpu.backend import CpuBackend, Switches
from edgespec.cpu.rowpad import RowPadEmbedding, RowPadLinear, matmul_t
from edgespec.loading.load import load_model
from edgespec.runtime import Engine


def is_padded(model: nn.Module) -> bool:
    return any(isinstance(m, RowPadLinear | RowPadEmbedding) for _, m in model.named_modules())


def _close(a: mx.array, b: mx.array) -> None:
    a_, b_ = np.array(a), np.array(b)
    assert a_.shape == b_.shape
    if blas.rows_exact():
        np.testing.assert_array_equal(a_, b_)  # exact mode: a row's bits do not depend on M
    else:
        np.testing.assert_allclose(a_, b_, rtol=1e-5, atol=1e-5)


def test_matmul_t_pads_one_row_only() -> None:
    w = mx.random.normal((40, 16), key=mx.random.key(0))
    for shape in [(1, 16), (1, 1, 16), (3, 16), (1, 5, 16)]:
        x = mx.random.normal(shape, key=mx.random.key(1))
        _close(matmul_t(x, w, pad=True), x @ w.T)
        _close(matmul_t(x, w, pad=False), x @ w.T)
    v = mx.ones((16,))  # a vector has no row axis to pad along: left as it is
    assert matmul_t(v, w, pad=True).shape == (40,)


def test_padded_layers_match_and_keep_parameters() -> None:
    lin = nn.Linear(16, 24, bias=True)
    emb = nn.Embedding(50, 16)
    model = nn.Sequential(emb, lin)
    before = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    x = mx.random.normal((1, 1, 16), key=mx.random.key(2))
    ref_lin, ref_head = lin(x), emb.as_linear(x)
    model = CpuBackend(Switches(pad_rows=True)).model(model)  # a twin: row padding alone
    assert isinstance(model.layers[0], RowPadEmbedding)
    assert isinstance(model.layers[1], RowPadLinear)
    assert is_padded(model)
    after = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    assert before.keys() == after.keys()
    for k in before:
        np.testing.assert_array_equal(before[k], after[k])
    _close(model.layers[1](x), ref_lin)
    _close(model.layers[0].as_linear(x), ref_head)
    assert model.layers[1](x).shape == (1, 1, 24)
    x3 = mx.random.normal((2, 3, 16), key=mx.random.key(3))  # several rows: the plain product
    _close(model.layers[1](x3), lin(x3))


def test_off_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGESPEC_PAD_ROWS", raising=False)
    assert not blas.pads_single_rows()
    monkeypatch.setenv("EDGESPEC_PAD_ROWS", "0")
    assert not blas.pads_single_rows()
    monkeypatch.setenv("EDGESPEC_PAD_ROWS", "1")
    assert blas.pads_single_rows()


def test_engine_pads_when_told_and_decodes_the_same(
    tiny_pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, _ = tiny_pair
    monkeypatch.setenv("EDGESPEC_PAD_ROWS", "0")
    plain = Engine(load_model(str(target)), None)._target.model  # what the Engine runs
    monkeypatch.setenv("EDGESPEC_PAD_ROWS", "1")
    loaded = load_model(str(target))
    assert not is_padded(loaded.model)  # the loader leaves the model as it is
    padded = Engine(loaded, None)._target.model
    assert not is_padded(plain) and is_padded(padded)
    assert not is_padded(loaded.model)  # and so does the Engine: it runs a twin
    # Greedy decoding one token at a time (every product a single row) gives the same logits.
    a, b = KVState(plain), KVState(padded)
    tok_a = tok_b = 5
    for _ in range(12):
        la, lb = a.forward(mx.array([tok_a])), b.forward(mx.array([tok_b]))
        _close(la, lb)
        tok_a, tok_b = int(mx.argmax(la[-1])), int(mx.argmax(lb[-1]))
        assert tok_a == tok_b
    # and a several-token forward is untouched
    _close(a.forward(mx.array([1, 2, 3])), b.forward(mx.array([1, 2, 3])))
