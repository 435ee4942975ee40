"""The tree forward (edgespec/trees/forward.py): exact against the ordinary forward, masks and
positions right for branching trees, caches compacted to the accepted path, and a one-line refusal
of what it cannot run.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import load
from mlx_lm.models import qwen3
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

from edgespec.cache import KVState
from edgespec.cpu.backend import CpuBackend
from edgespec.errors import TreeUnsupportedError
from edgespec.trees.forward import (
    PLAIN,
    check_tree_cache,
    compact,
    tree_forward,
    tree_layers,
)
from edgespec.trees.shapes import (
    Tree,
    chain_shape,
    shape_tree,
    tree_mask,
    tree_positions,
    widths_shape,
)
from tests.helpers.tiny import tiny_gpt2

IDS = list(range(3, 40))
CPU = CpuBackend()


def _state(model, optimised: bool) -> KVState:
    new_cache = CPU.new_cache if optimised else make_prompt_cache
    state = KVState(model, "t", new_cache)
    state.prefill(IDS + [1])
    return state


CPU_KERNELS = CPU.kernels()  # as the Engine passes


def _tree_logits(state: KVState, tree: Tree, tokens: list[int], pending: list[int]):
    mask = tree_mask(tree, state.offset, len(pending))
    pos = tree_positions(tree, state.offset, len(pending))
    inputs = mx.array(pending + tokens, dtype=mx.int32)
    kernels = CPU_KERNELS if state.new_cache == CPU.new_cache else PLAIN
    return tree_forward(state.model, inputs, mx.array(pos), mx.array(mask), state.cache, kernels)


@pytest.fixture(scope="module", params=[False, True], ids=["mlx-modules", "cpu-rewrites"])
def target(request, tiny_pair):
    model, _ = load(str(tiny_pair[0]))
    if request.param:
        model = CPU.model(model)  # the twin: table rope, lean ops, compiled blocks (on the CPU)
    return model, request.param


@pytest.mark.parametrize("k", [1, 3, 6])
def test_chain_shaped_tree_gives_the_ordinary_forwards_bits(target, k):
    model, optimised = target
    plain, tree_state = _state(model, optimised), _state(model, optimised)
    drafts = [7, 9, 11, 13, 15, 17][:k]
    want = plain.forward(mx.array([1] + drafts, dtype=mx.int32))
    _, got = _tree_logits(tree_state, shape_tree(chain_shape(k)), drafts, [1])
    assert mx.array_equal(want, got).item()


def test_every_node_sees_exactly_its_path(target):
    """Each node's logits equal those of a chain forward over its own path, siblings share a
    position, and compacting the cache to a path leaves the chain forward's keys and values."""
    model, optimised = target
    tree = shape_tree(widths_shape([3, 2, 2]))  # parents (-1, -1, -1, 0, 0, 3, 3)
    tokens = [7, 8, 9, 10, 11, 12, 13]
    state = _state(model, optimised)
    base = state.offset + 1
    _, logits = _tree_logits(state, tree, tokens, [1])
    for node in range(tree.size):
        path = [tokens[i] for i in tree.path(node)]
        chain = _state(model, optimised)
        want = chain.forward(mx.array([1] + path, dtype=mx.int32))[-1]
        assert np.allclose(np.array(want), np.array(logits[node + 1]), rtol=1e-4, atol=1e-4), node
    path = tree.path(6)  # nodes 0, 3, 6: tokens 7, 10, 13
    compact(state.cache, base, [base + i for i in path])
    chain = _state(model, optimised)
    chain.forward(mx.array([1, 7, 10, 13], dtype=mx.int32))
    assert state.offset == chain.offset == base + 3
    for mine, theirs in zip(state.cache, chain.cache, strict=True):
        k1, v1 = mine.keys[..., : mine.offset, :], mine.values[..., : mine.offset, :]
        k2, v2 = theirs.keys[..., : theirs.offset, :], theirs.values[..., : theirs.offset, :]
        assert np.allclose(np.array(k1), np.array(k2), rtol=1e-4, atol=1e-4)
        assert np.allclose(np.array(v1), np.array(v2), rtol=1e-4, atol=1e-4)


def test_mask_and_positions_golden():
    tree = Tree((-1, -1, 0))
    assert tree_positions(tree, 4, 1).tolist() == [4, 5, 5, 6]
    assert tree_mask(tree, 2, 1).astype(int).tolist() == [
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 0, 1, 0],
        [1, 1, 1, 1, 0, 1],
    ]


def test_compact_moves_only_what_is_out_of_place():
    cache = make_prompt_cache(_tiny_qwen3())
    for c in cache:
        c.update_and_fetch(
            mx.arange(14.0).reshape(1, 1, 14, 1), mx.arange(14.0).reshape(1, 1, 14, 1)
        )
    compact(cache, 10, [11, 13])
    assert cache[0].offset == 12
    assert cache[0].keys[0, 0, :12, 0].tolist() == [*range(10), 11, 13]


def _tiny_qwen3() -> qwen3.Model:
    args = qwen3.ModelArgs(
        model_type="qwen3",
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=4,
        rms_norm_eps=1e-6,
        vocab_size=50,
        num_key_value_heads=2,
        max_position_embeddings=256,
        head_dim=8,
        tie_word_embeddings=True,
        rope_theta=10000.0,
    )
    model = qwen3.Model(args)
    mx.eval(model.parameters())
    return model


def test_qwen3_blocks_are_supported():
    model = _tiny_qwen3()
    plain, tree_state = KVState(model, "q"), KVState(model, "q")
    for s in (plain, tree_state):
        s.prefill([3, 4, 5, 6, 1])
    want = plain.forward(mx.array([1, 7, 9], dtype=mx.int32))
    _, got = _tree_logits(tree_state, shape_tree(chain_shape(2)), [7, 9], [1])
    assert np.allclose(np.array(want), np.array(got), atol=1e-5)


def test_other_architectures_and_caches_are_refused_in_one_line():
    with pytest.raises(TreeUnsupportedError, match="llama, mistral, qwen2 and qwen3") as err:
        tree_layers(tiny_gpt2())
    assert "\n" not in str(err.value) and "--tree chain" in str(err.value)
    with pytest.raises(TreeUnsupportedError, match="RotatingKVCache"):
        check_tree_cache([RotatingKVCache(max_size=16)], "target x")
