"""The fused CPU attention kernel (edgespec/cpu/attend.c, fused.py): MLX's attention values for
every head layout it takes, each row's bits whatever forward it is part of (a verify's row is
the one-token step over its keys; a masked key adds an exact zero, so a chain-shaped tree is the
chain), the build kept and reused, and the NumPy softmax kept where no compiler is."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec.cpu import attention, fused


@pytest.fixture(scope="module")
def kernel():
    k = fused.kernel()
    assert k is not None, fused.problem()  # the test machines have a C compiler
    return k


def _qkv(heads: int, groups: int, dim: int, length: int, keys: int, seed: int = 0, room: int = 0):
    """Queries [1, heads, length, dim] and keys / values [1, groups, keys, dim] as the first
    `keys` positions of a longer buffer (`room` more), strided as a KV cache's are."""
    mx.random.seed(seed)
    q = mx.random.normal((1, heads, length, dim))
    k = mx.random.normal((1, groups, keys + room, dim)) * 2
    v = mx.random.normal((1, groups, keys + room, dim))
    mx.eval(q, k, v)
    return q, k[:, :, :keys], v[:, :, :keys]


@pytest.mark.parametrize(
    "heads,groups,dim", [(9, 3, 64), (4, 2, 16), (8, 8, 128), (4, 1, 256), (6, 2, 48), (2, 2, 112)]
)
@pytest.mark.parametrize("length,keys", [(1, 1), (1, 17), (1, 1100), (2, 33), (5, 1030), (40, 300)])
def test_the_kernel_is_mlx_attention(kernel, heads, groups, dim, length, keys):
    if keys < length:
        pytest.skip("a forward's queries are its last positions")
    q, k, v = _qkv(heads, groups, dim, length, keys, seed=length * keys, room=37)
    scale = dim**-0.5
    for causal in (True, False):
        mask = "causal" if causal and length > 1 else None
        want = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
        got = kernel(q, k, v, scale, causal)
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("length,keys", [(2, 1024), (5, 1031), (9, 2000), (65, 1500)])
def test_a_verify_row_keeps_the_bits_of_a_one_token_step(kernel, length, keys):
    q, k, v = _qkv(9, 3, 64, length, keys, seed=keys, room=100)
    verify = np.array(kernel(q, k, v, 0.125, True))
    for t in range(length):
        seen = keys - length + t + 1
        step = kernel(q[:, :, t : t + 1], k[:, :, :seen], v[:, :, :seen], 0.125, True)
        assert np.array_equal(verify[:, :, t], np.array(step)[:, :, 0]), t


def test_a_chain_shaped_mask_is_the_causal_forward_and_a_hidden_key_counts_for_nothing(kernel):
    length, keys = 6, 1200
    q, k, v = _qkv(9, 3, 64, length, keys, seed=7)
    causal = np.array(kernel(q, k, v, 0.125, True))
    chain = np.tri(length, keys, keys - length, dtype=bool)
    assert np.array_equal(np.array(kernel(q, k, v, 0.125, True, chain)), causal)
    tree = chain.copy()
    tree[3:, keys - 3] = False  # the last three rows do not see the key at S - 3
    tree[1, :500] = False  # nor row 1 the first 500
    got = np.array(kernel(q, k, v, 0.125, True, tree))
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mx.array(tree))
    np.testing.assert_allclose(got, np.array(want), rtol=2e-5, atol=2e-6)
    assert np.array_equal(got[:, :, :1], causal[:, :, :1])  # rows with nothing hidden: same bits


def test_it_refuses_a_shape_it_does_not_take(kernel):
    q, k, v = _qkv(4, 2, 24, 1, 10)
    assert not fused.takes(q, k)
    assert not fused.takes(*_qkv(4, 2, 144, 1, 10)[:2])  # (576 wide, 4 heads: a test model's)
    with pytest.raises(ValueError, match="does not take shape"):
        kernel(q, k, v, 0.2, True)
    assert not fused.takes(q.astype(mx.float16), k.astype(mx.float16))


def test_grouped_attention_sends_long_rows_to_it(kernel, monkeypatch):
    """Rows on both sides of FROM_KEYS: the short ones MLX's, the long ones the kernel's, in calls
    of FUSED_TOKENS query tokens, whose size leaves each row's bits alone."""
    monkeypatch.setattr(attention, "FROM_KEYS", 110)
    calls = []
    monkeypatch.setattr(fused, "kernel", lambda: lambda *a: calls.append(a[0].shape) or kernel(*a))
    q, k, v = _qkv(9, 3, 16, 6, 113)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask="causal")
    got = attention.grouped_attention(q, k, v, 0.25, True, None, attention.numpy_softmax, True)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)
    assert calls == [(1, 9, 4, 16)]  # rows 2..5 see 110..113 keys
    monkeypatch.setattr(attention, "FUSED_TOKENS", 3)
    pieces = attention.grouped_attention(q, k, v, 0.25, True, None, attention.numpy_softmax, True)
    assert calls[1:] == [(1, 9, 3, 16), (1, 9, 1, 16)]
    assert np.array_equal(np.array(pieces), np.array(got))


def test_a_prompt_chunks_rows_keep_the_bits_of_one_token_steps(kernel, monkeypatch):
    """A 40-token chunk past FROM_KEYS in the kernel: MLX's values, and each row the bits of the
    one-token step at its position (the same kernel, whatever forward the row is in)."""
    monkeypatch.setattr(attention, "FROM_KEYS", 100)
    q, k, v = _qkv(9, 3, 64, 40, 1200, seed=4, room=8)
    chunk = attention.grouped_attention(q, k, v, 0.125, True, None, attention.numpy_softmax, True)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    np.testing.assert_allclose(np.array(chunk), np.array(want), rtol=2e-5, atol=2e-6)
    for t in (0, 17, 39):
        seen = 1200 - 40 + t + 1
        one = (q[:, :, t : t + 1], k[:, :, :seen], v[:, :, :seen])
        step = attention.grouped_attention(*one, 0.125, False, None, attention.numpy_softmax, True)
        assert np.array_equal(np.array(step)[:, :, 0], np.array(chunk)[:, :, t]), t


def test_the_build_is_kept_and_reused(tmp_path):
    first = fused.build(tmp_path)
    stamp = first.stat().st_mtime_ns
    assert fused.build(tmp_path) == first and first.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no scratch file left


def test_gccs_own_shuffle_gives_the_same_bits(kernel, tmp_path):
    """GCC before 12 builds the shuffles with __builtin_shuffle: forced here, same rows."""
    import shutil
    import subprocess

    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("needs GCC")
    out = tmp_path / "old.so"
    cmd = [gcc, *fused.flags(), "-DATTEND_GCC_SHUFFLE", "-o", str(out), str(fused.SOURCE)]
    subprocess.run(cmd, check=True, capture_output=True)
    old = fused.load(out)
    q, k, v = _qkv(9, 3, 64, 5, 1500, seed=11, room=20)
    assert np.array_equal(
        np.array(old(q, k, v, 0.125, True)), np.array(kernel(q, k, v, 0.125, True))
    )


def test_without_a_compiler_the_numpy_softmax_stays(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("EDGESPEC_KERNEL_DIR", str(tmp_path))
    monkeypatch.setattr(fused, "_problem", [])
    fused.kernel.cache_clear()
    try:
        assert fused.kernel() is None
        assert fused.problem().startswith("no C compiler")
        monkeypatch.setattr(attention, "FROM_KEYS", 100)
        q, k, v = _qkv(9, 3, 16, 3, 120)
        want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask="causal")
        got = attention.grouped_attention(q, k, v, 0.25, True, None, attention.numpy_softmax, True)
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)
    finally:
        fused.kernel.cache_clear()


def test_a_compiler_error_is_reported_in_one_line(monkeypatch, tmp_path):
    cc = tmp_path / "cc"
    cc.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && echo fake 1.0 && exit 0\necho boom >&2\nexit 1\n'
    )
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("EDGESPEC_KERNEL_DIR", str(tmp_path / "k"))
    monkeypatch.setattr(fused, "_problem", [])
    fused.kernel.cache_clear()
    try:
        assert fused.kernel() is None
        assert fused.problem() == "the C compiler failed: boom"
    finally:
        fused.kernel.cache_clear()


def test_the_switch_turns_it_off(monkeypatch):
    from edgespec.cpu.backend import Switches

    assert Switches.from_environment().fused_attention  # the tests run on the CPU backend
    monkeypatch.setenv("EDGESPEC_CPU_OPT", "-fused_attention")
    assert not Switches.from_environment().fused_attention
    monkeypatch.delenv("EDGESPEC_CPU_OPT", raising=False)
    monkeypatch.setenv("EDGESPEC_CPU_OPT", "-numpy_softmax")  # it takes the NumPy softmax's rows
    assert not Switches.from_environment().fused_attention
