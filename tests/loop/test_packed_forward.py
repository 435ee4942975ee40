"""The packed forward (edgespec/server/packed.py): several sequences' new tokens through one forward give
each the logits and the cache its own forward gives, at its own positions over its own cache;
with mlx-lm's modules and with the CPU backend's twin; and a one-line refusal is `packable`'s.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

from edgespec.cache import KVState
from edgespec.cpu.backend import CpuBackend
from edgespec.server.packed import causal, packable, packed_forward
from edgespec.trees.forward import PLAIN
from tests.helpers.tiny import tiny_gpt2

CPU = CpuBackend()
CPU_KERNELS = CPU.kernels()  # as the Engine passes
# Prompts of different lengths (so different offsets) and new tokens of different lengths: a
# one-token step, a verify of 3 and one of 6.
PROMPTS = [list(range(3, 40)), list(range(5, 17)), list(range(9, 70))]
NEW = [[1], [7, 9, 11], [4, 6, 8, 10, 12, 14]]


@pytest.fixture(scope="module", params=[False, True], ids=["mlx-modules", "cpu-rewrites"])
def target(request, tiny_pair):
    model, _ = load(str(tiny_pair[0]))
    return (CPU.model(model) if request.param else model), request.param


def _states(model, optimised: bool) -> list[KVState]:
    out = []
    for prompt in PROMPTS:
        state = KVState(model, "t", CPU.new_cache if optimised else make_prompt_cache)
        state.prefill(prompt + [1])
        out.append(state)
    return out


def _close(a: mx.array, b: mx.array) -> bool:
    return np.allclose(np.array(a), np.array(b), rtol=1e-4, atol=1e-4)


def test_each_sequence_gets_its_own_forwards_logits_and_cache(target):
    model, optimised = target
    alone, packed = _states(model, optimised), _states(model, optimised)
    want = [s.forward(mx.array(n, dtype=mx.int32)) for s, n in zip(alone, NEW, strict=True)]
    kernels = CPU_KERNELS if optimised else PLAIN
    parts = [(s.cache, mx.array(n, dtype=mx.int32)) for s, n in zip(packed, NEW, strict=True)]
    got = packed_forward(model, parts, kernels)
    for w, g in zip(want, got, strict=True):
        assert w.shape == g.shape
        assert _close(w, g)
        assert mx.array_equal(mx.argmax(w, axis=-1), mx.argmax(g, axis=-1)).item()
    for a, p in zip(alone, packed, strict=True):
        assert a.offset == p.offset
        for mine, theirs in zip(a.cache, p.cache, strict=True):
            assert _close(mine.keys[..., : mine.offset, :], theirs.keys[..., : theirs.offset, :])
            assert _close(
                mine.values[..., : mine.offset, :], theirs.values[..., : theirs.offset, :]
            )


def test_causal_mask_golden():
    assert causal(2, 4).astype(mx.int32).tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]


def test_packable_takes_llama_blocks_on_plain_caches_only(tiny_pair):
    model, _ = load(str(tiny_pair[0]))
    assert packable(KVState(model, "t"))
    assert not packable(KVState(tiny_gpt2(), "g"))
