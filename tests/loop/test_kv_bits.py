"""Quantized KV caches (Engine kv_bits, --kv-bits; cache.quantized) on tiny seeded models: the
target's and the token draft's caches are mlx-lm's QuantizedKVCache, speculative output equals
plain decoding with the same setting (rewinds after rejections, a chat's second turn), they hold
less memory, and what needs full-precision caches refuses or falls back in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from edgespec.cache import KVState
from edgespec.config import MIN_DRAFT_WINDOW, GenerationConfig, SpecConfig
from edgespec.errors import ConfigError, TreeUnsupportedError
from edgespec.events import Finished
from edgespec.runtime import Engine
from edgespec.server.packed import packable
from edgespec.server.prefix import Slot, forkable
from tests.helpers import gen, plain_ids, rounds_of, token_ids
from tests.helpers.tiny import make_tiny_pair

PROMPT = "the cat and the dog went to the river with a model token draft to the city"
METHODS = [
    SpecConfig(k=4, method="draft", adaptive=False),
    SpecConfig(k=4, method="hybrid", adaptive=False),
    SpecConfig(k=6, method="hybrid", adaptive=True),
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Heads 32 wide (the narrowest MLX quantizes); the draft is the target with noise, so that
    rounds both accept and reject."""
    root = tmp_path_factory.mktemp("kv_bits")
    target, draft = make_tiny_pair(root, seed=5, hidden=128, draft="self", noise=0.05)
    return str(target), str(draft)


@pytest.fixture(scope="module", params=[8, 4])
def engine(pair: tuple[str, str], request: pytest.FixtureRequest) -> Engine:
    return Engine.load(target=pair[0], draft=pair[1], kv_bits=request.param)


def _layers(state: KVState) -> set[tuple[type, int | None]]:
    return {(type(layer), getattr(layer, "bits", None)) for layer in state.cache}


def _nbytes(state: KVState) -> int:
    return sum(int(layer.nbytes) for layer in state.cache)


@pytest.mark.parametrize("spec", METHODS, ids=["draft", "hybrid", "adaptive-hybrid"])
def test_greedy_output_equals_plain_decoding_with_the_same_kv_bits(engine, spec):
    ids = engine.encode_raw(PROMPT)
    engine.reset()
    plain = plain_ids(engine, ids, 64)
    engine.reset()
    events = gen(engine, ids, spec, 64)
    assert token_ids(events) == plain and len(plain) == 64
    rounds = rounds_of(events)
    # Rounds rejected drafted tokens (the caches were trimmed back past them) and, at a fixed K,
    # accepted some (at 4 bits the noisy draft agrees seldom, and adaptive K soon stops it).
    assert any(r.accepted < r.drafted for r in rounds)
    assert spec.adaptive or sum(r.accepted for r in rounds) > 0
    bits = {(QuantizedKVCache, engine.kv_bits)}
    assert _layers(engine._target) == bits
    assert isinstance(engine._draft, KVState) and _layers(engine._draft) == bits


def test_a_chats_second_turn_reuses_the_quantized_prefix_and_stays_exact(engine):
    spec = GenerationConfig(spec=SpecConfig(k=4, method="hybrid", adaptive=False), max_tokens=40)
    plain = GenerationConfig(spec=SpecConfig(method="none"), max_tokens=40)
    first = [{"role": "user", "content": PROMPT}]
    engine.reset()
    answer = list(engine.chat(first, spec))[-1]
    assert isinstance(answer, Finished)
    second = [*first, {"role": "assistant", "content": answer.text}]
    second.append({"role": "user", "content": "and the moon and the sun"})
    events = list(engine.chat(second, spec))
    stats = events[-1].stats
    reused = stats.prompt_tokens - stats.prefilled_tokens
    assert reused >= len(engine.encode_chat(first)) - 1  # the first turn's prompt was not re-read
    engine.reset()
    assert token_ids(events) == token_ids(engine.chat(second, plain))


def test_a_quantized_cache_holds_less_memory_than_a_full_one(pair, engine):
    full = Engine.load(target=pair[0], draft=pair[1])
    ids = (full.encode_raw(PROMPT) * 20)[:300]
    sizes = []
    for e in (full, engine):
        e.reset()
        e._target.prefill(ids)
        assert e._target.offset == len(ids) - 1
        sizes.append(_nbytes(e._target))
    # fp32 keys and values against `bits` per value plus an fp32 scale and bias per group of 32
    assert sizes[1] <= sizes[0] * (engine.kv_bits + 2) / 32
    assert _layers(full._target) == {(KVCache, None)}


def test_a_bounded_draft_keeps_its_quantized_cache_and_stays_exact(engine):
    ids = (engine.encode_raw(PROMPT) * 20)[:400]  # past the bound's start (2 windows)
    engine.reset()
    plain = plain_ids(engine, ids, 24)
    engine.reset()
    events = gen(
        engine,
        ids,
        SpecConfig(k=4, method="draft", draft_window=MIN_DRAFT_WINDOW, adaptive=False),
        24,
    )
    assert token_ids(events) == plain
    assert _layers(engine._draft) == {(QuantizedKVCache, engine.kv_bits)}  # not windows


def test_trees_packing_and_prefix_copies_refuse_or_fall_back(engine):
    ids = engine.encode_raw(PROMPT)
    with pytest.raises(TreeUnsupportedError, match="plain KV caches"):
        gen(engine, ids, SpecConfig(k=3, method="draft", tree="chain"), 8)
    target, draft = engine.new_states()
    assert isinstance(draft, KVState)
    assert not packable(target) and not packable(draft)  # the server runs them one forward each
    assert not forkable(Slot(target, draft))  # its prefix pool keeps them, without copies
    engine.reset()
    assert token_ids(
        gen(engine, ids, SpecConfig(k=4, method="draft", adaptive=False), 8)
    ) == plain_ids(engine, ids, 8)


def test_other_bits_are_refused_in_one_line(pair):
    with pytest.raises(ConfigError, match="--kv-bits must be 8 or 4, got 3"):
        Engine.load(target=pair[0], draft=pair[1], kv_bits=3)


def test_the_cli_refuses_kv_bits_with_trees_before_loading(pair):
    for extra in (["--tree", "chain"], ["--method", "block-tree"]):
        run = subprocess.run(
            [sys.executable, "-m", "edgespec", "generate", "--kv-bits", "8", *extra, "hi"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 2
        assert run.stderr.strip().splitlines() == [
            "edgespec generate: error: --kv-bits: draft trees need full-precision KV caches; "
            "leave out --tree or --kv-bits"
        ]


@pytest.mark.slow
@pytest.mark.parametrize("bits", [8, 4])
def test_the_embedded_pair_with_quantized_kv_caches_keeps_greedy_output(bits):
    """SmolLM2-135M-Instruct and its draft, 64 tokens: speculative output equals plain decoding
    with the same kv_bits. Under a BLAS whose verify rows do not keep one-token steps' bits (MKL
    on AMD), a quantized cache turns their last-digit differences into whole quantization steps,
    so near-ties flip more often there (docs/measurements/2026-11-28-kv-bits.md)."""
    from edgespec import blas
    from edgespec.loading.specs import load_catalog
    from edgespec.loading.status import model_status

    if not blas.rows_exact():
        pytest.skip(f"{blas.active()}: verify rows are not bit-exact here")
    name = load_catalog().pair().target
    if not model_status(name, load_catalog()).present:
        pytest.skip(f"{name} is not on this machine (edgespec pull)")
    engine = Engine.load(kv_bits=bits)
    ids = engine.encode_chat([{"role": "user", "content": "Why is the sky blue? Explain."}])
    plain = plain_ids(engine, ids, 64)
    assert _layers(engine._target) == {(QuantizedKVCache, bits)}
    for spec in (
        SpecConfig(k=4, method="draft", adaptive=False),
        SpecConfig(method="hybrid", adaptive=True),
    ):
        engine.reset()
        events = gen(engine, ids, spec, 64)
        assert token_ids(events) == plain and len(plain) == 64
        assert any(r.accepted < r.drafted for r in rounds_of(events))


def test_bench_refuses_kv_bits_with_tree_and_mlx_lm_methods_before_loading():
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgespec",
            "bench",
            "--kv-bits",
            "4",
            "--methods",
            "plain,tree,mlx-lm",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "edgespec bench: error: --kv-bits: tree, mlx-lm cannot run on quantized KV caches; drop "
        "them or --kv-bits"
    ]
