"""Compiled llama blocks (edgespec/blocks.py): the same logits as mlx-lm's blocks for every
forward length a decoding loop uses, standing only for exact llama blocks in a CPU backend's twin
(the model keeps mlx-lm's), traced again when a weight is replaced, off for prompt chunks and
with EDGESPEC_CPU_OPT=-compiled_blocks."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm import load
from mlx_lm.models import llama

from edgespec.cache import KVState
from edgespec.cpu import blocks
from edgespec.cpu.backend import CpuBackend
from edgespec.cpu.blocks import CompiledBlock
from edgespec.cpu.fastexp import compiler_works
from tests.helpers import engine_state, same_bits

pytestmark = pytest.mark.skipif(not compiler_works(), reason="MLX cannot compile here")


@pytest.fixture(autouse=True)
def blocks_on(monkeypatch):
    monkeypatch.delenv("EDGESPEC_CPU_OPT", raising=False)


def fresh_target(tiny_pair) -> nn.Module:
    model, _ = load(str(tiny_pair[0]))
    return model


def run(state: KVState, prefix: list[int], lengths: list[int], ids: list[int]) -> list[mx.array]:
    """Prefill `prefix`, then forwards of the given lengths over `ids`, as a loop would run them
    (the cache keeps growing); the logits of each."""
    state.rewind([], 0)
    mx.eval(state.forward(mx.array(prefix, dtype=mx.int32)))
    outs, at = [], 0
    for n in lengths:
        out = state.forward(mx.array(ids[at : at + n], dtype=mx.int32))
        mx.eval(out)
        outs.append(out)
        at += n
    return outs


def test_compiled_blocks_keep_the_logits_bit_for_bit(tiny_pair, monkeypatch):
    compiled_state = engine_state(fresh_target(tiny_pair), "target")
    kinds = {type(layer) for layer in compiled_state.model.model.layers}
    assert kinds == {CompiledBlock}
    monkeypatch.setenv("EDGESPEC_CPU_OPT", "-compiled_blocks")
    plain_state = engine_state(fresh_target(tiny_pair), "target")
    assert {type(layer) for layer in plain_state.model.model.layers} == {llama.TransformerBlock}
    prefix = [1, 5, 9, 2, 7, 3, 8, 4, 6, 10, 11]
    ids = [(7 * i + 3) % 300 + 4 for i in range(40)]
    lengths = [1, 2, 1, 3, 5, 1, 2, 8, 1, 4]  # steps, verifies, a catch-up, repeats of a shape
    for got, want in zip(
        run(compiled_state, prefix, lengths, ids),
        run(plain_state, prefix, lengths, ids),
        strict=True,
    ):
        assert same_bits(got, want)


def test_prompt_chunks_the_model_and_cache_free_calls_keep_mlx_lm_code(tiny_pair):
    model = fresh_target(tiny_pair)
    state = engine_state(model, "target")
    block = state.model.model.layers[0]
    long = mx.array(list(range(4, 4 + blocks.MAX_LENGTH + 1)), dtype=mx.int32)
    mx.eval(state.forward(long))  # a prompt chunk: no trace made
    assert blocks._TRACES not in block.__dict__
    mx.eval(KVState(model).forward(mx.array([5], dtype=mx.int32)))  # the model itself
    assert blocks._TRACES not in block.__dict__ and type(model.model.layers[0]) is not CompiledBlock
    mx.eval(state.model(mx.array([[5, 6]], dtype=mx.int32)))  # no cache (training, checks)
    assert blocks._TRACES not in block.__dict__
    mx.eval(state.forward(mx.array([5], dtype=mx.int32)))
    assert blocks._TRACES in block.__dict__


def test_a_replaced_weight_is_used_at_once(tiny_pair, monkeypatch):
    compiled = engine_state(fresh_target(tiny_pair), "target")
    monkeypatch.setenv("EDGESPEC_CPU_OPT", "-compiled_blocks")
    plain = engine_state(fresh_target(tiny_pair), "target")
    prefix, ids = [1, 5, 9, 2], [7, 3, 8]
    run(compiled, prefix, [1, 2], ids)  # traced with the first weights
    mx.random.seed(7)
    for state in (compiled, plain):  # the same new weights in both
        layer = state.model.model.layers[1]
        shape = layer.mlp.up_proj.weight.shape
        new = mx.random.normal(shape, key=mx.random.key(3)) * 0.1
        layer.mlp.up_proj.update({"weight": new})
        layer.input_layernorm.update({"weight": layer.input_layernorm.weight * 2})
    got, want = run(compiled, prefix, [1, 2], ids), run(plain, prefix, [1, 2], ids)
    assert all(same_bits(a, b) for a, b in zip(got, want, strict=True))


def test_only_exact_llama_blocks_compile_and_the_switch_turns_it_off(tiny_pair, monkeypatch):
    class OtherBlock(llama.TransformerBlock):  # someone else's subclass: not ours to change
        pass

    model = fresh_target(tiny_pair)
    args = model.args
    other = OtherBlock(args)
    other.update(model.model.layers[0].parameters())
    model.model.layers[0] = other
    twin = CpuBackend().model(model)
    assert type(twin.model.layers[0]) is OtherBlock
    assert {type(layer) for layer in twin.model.layers[1:]} == {CompiledBlock}
    assert type(model.model.layers[1]) is llama.TransformerBlock  # the model keeps its blocks
    monkeypatch.setenv("EDGESPEC_CPU_OPT", "-compiled_blocks")
    twin = CpuBackend().model(fresh_target(tiny_pair))
    assert not any(isinstance(layer, CompiledBlock) for layer in twin.model.layers)
    monkeypatch.delenv("EDGESPEC_CPU_OPT", raising=False)
    twin = CpuBackend().model(llama.Model(args))
    assert {type(layer) for layer in twin.model.layers} == {CompiledBlock}


def test_a_head_size_other_than_hidden_over_heads_keeps_the_logits(monkeypatch):
    # Llama configs may set head_dim apart from hidden_size / num_attention_heads.
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rms_norm_eps=1e-5,
        vocab_size=100,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    )
    mx.random.seed(9)
    compiled_model = llama.Model(args)
    mx.eval(compiled_model.parameters())
    plain_model = llama.Model(args)
    plain_model.update(compiled_model.parameters())
    compiled = engine_state(compiled_model, "target")
    assert {type(layer) for layer in compiled.model.model.layers} == {CompiledBlock}
    monkeypatch.setenv("EDGESPEC_CPU_OPT", "-compiled_blocks")
    plain = engine_state(plain_model, "target")
    prefix, ids = [1, 5, 9, 2, 7], [3, 8, 4, 6, 10, 11]
    got, want = run(compiled, prefix, [1, 2, 3], ids), run(plain, prefix, [1, 2, 3], ids)
    assert all(same_bits(a, b) for a, b in zip(got, want, strict=True))
