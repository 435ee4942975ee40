"""The block draft model (edgespec/architectures/block_model.py): config formats, z-lab's file
layout, the context cache, the non-causal block, the training mask, and refusing a target it was not
made for."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest

from edgespec.architectures import architecture_of
from edgespec.architectures.block_model import (
    MODEL_TYPE,
    BlockArgs,
    BlockModel,
    load_block,
)
from edgespec.loading.load import load_model
from research.block_draft.export import save_block
from tests.helpers.block_models import tiny_qwen3, write_dflash


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, object, Path]:
    root = tmp_path_factory.mktemp("block_model")
    target = tiny_qwen3(root)
    return target, load_model(str(target)).model, write_dflash(target, root / "dflash")


def _ctx(model: BlockModel, s: int, seed: int = 1) -> mx.array:
    raw = mx.random.normal((1, s, len(model.args.target_layer_ids) * 64), key=mx.random.key(seed))
    return model.context(raw)


def test_config_formats_round_trip(pair):
    target, _, folder = pair
    import json

    zlab = json.loads((folder / "config.json").read_text())
    args = BlockArgs.from_config(zlab)
    assert args.target_layer_ids == (0, 2) and args.mask_token_id == 5 and args.block_size == 4
    assert args.num_target_layers == 4 and args.qk_norm
    assert architecture_of(zlab) == "block" and architecture_of(args.to_config()) == "block"
    assert args.to_config()["model_type"] == MODEL_TYPE
    assert BlockArgs.from_config(args.to_config()) == args
    assert architecture_of({"model_type": "qwen3"}) != "block"


def test_cached_context_gives_the_same_block(pair):
    """The block after a context fed in two pieces through the cache equals the block after the
    whole context at once (the block's own K/V is never cached)."""
    _, target, folder = pair
    model, _ = load_block(folder, target)
    ctx = _ctx(model, 7)
    toks = mx.array([[9, 5, 5, 5]], dtype=mx.int32)
    whole = model(toks, ctx)
    cache = model.make_cache()
    model(mx.array([[11, 5, 5]], dtype=mx.int32), ctx[:, :3], cache)
    assert cache[0].offset == 3
    split = model(toks, ctx[:, 3:], cache)
    assert cache[0].offset == 7
    assert mx.allclose(whole, split, atol=1e-4).item()
    again = model(toks, ctx[:, :0], cache)  # nothing new: the cached context alone
    assert mx.allclose(whole, again, atol=1e-4).item()
    assert model.logits(whole).shape == (1, 4, model.args.vocab_size)


def test_block_is_not_causal_and_mask_applies(pair):
    _, target, folder = pair
    model, _ = load_block(folder, target)
    ctx = _ctx(model, 5)
    a = model(mx.array([[9, 5, 5, 5]], dtype=mx.int32), ctx)
    b = model(mx.array([[9, 5, 5, 7]], dtype=mx.int32), ctx)
    assert not mx.allclose(a[:, 0], b[:, 0], atol=1e-5).item()  # position 0 sees position 3
    keep = mx.ones((1, 1, 4, 9), dtype=mx.bool_)
    assert mx.allclose(model(mx.array([[9, 5, 5, 5]]), ctx, mask=keep), a, atol=1e-5).item()
    causal = mx.concatenate([mx.ones((4, 5), dtype=mx.bool_), mx.tril(mx.ones((4, 4)) > 0)], 1)
    ca = model(mx.array([[9, 5, 5, 5]]), ctx, mask=causal[None, None])
    cb = model(mx.array([[9, 5, 5, 7]]), ctx, mask=causal[None, None])
    assert mx.allclose(ca[:, :3], cb[:, :3], atol=1e-5).item()


def test_save_and_load_our_format(pair, tmp_path):
    _, target, folder = pair
    model, _ = load_block(folder, target)
    config = model.args.to_config()
    save_block(model, config, tmp_path / "ours")
    again, cfg = load_block(tmp_path / "ours", target)
    ctx = _ctx(model, 4)
    toks = mx.array([[3, 5, 5, 5]], dtype=mx.int32)
    assert cfg["model_type"] == MODEL_TYPE
    assert mx.allclose(model(toks, ctx), again(toks, ctx)).item()


def test_llama_style_draft_without_qk_norm(pair):
    _, target, _ = pair
    args = BlockArgs.from_config({**_args(pair).to_config(), "qk_norm": False})
    model = BlockModel(args)
    assert "q_norm" not in model.layers[0].self_attn
    assert "bias" not in model.layers[0].self_attn.o_proj
    biased = BlockModel(BlockArgs.from_config({**args.to_config(), "attention_bias": True}))
    assert all("bias" in biased.layers[0].self_attn[p] for p in ("q_proj", "o_proj"))
    model.attach(target)
    assert model(mx.array([[1, 5]]), _ctx(model, 3)).shape == (1, 2, 64)


def _args(pair) -> BlockArgs:
    import json

    return BlockArgs.from_config(json.loads((pair[2] / "config.json").read_text()))


@pytest.mark.parametrize(
    "change, words",
    [
        ({"num_target_layers": 6}, "6 layers"),
        ({"dflash_config": {"mask_token_id": 5, "target_layer_ids": [0, 4]}}, "layers [0, 4]"),
        ({"vocab_size": 999}, "999 tokens"),
    ],
)
def test_a_draft_for_another_target_is_refused(pair, tmp_path, change, words):
    target_path, target, _ = pair
    folder = write_dflash(target_path, tmp_path / "other", **change)
    with pytest.raises(ValueError, match=words) as e:
        load_block(folder, target)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="together with its target"):
        load_block(folder, None)


def test_quantized_at_load_like_the_target(pair, tmp_path):
    """On a GPU backend an unquantized draft is quantized at load (draft_bits 4): the block draft
    too; saved quantized, it loads back as stored, with the same outputs."""
    _, target, folder = pair
    dense, _ = load_block(folder, target)
    d = load_model(str(folder), quantize_bits=4, dequantize=False, target=target)
    assert isinstance(d.model, BlockModel)
    assert isinstance(d.model.fc, nn.QuantizedLinear)
    assert isinstance(d.model.layers[0].self_attn.q_proj, nn.QuantizedLinear)
    ctx = _ctx(dense, 6)
    toks = mx.array([[3, 5, 5, 5]], dtype=mx.int32)
    a, b = dense.logits(dense(toks, ctx)), d.model.logits(d.model(toks, ctx))
    assert mx.abs(a - b).max().item() < 0.5 * mx.abs(a).max().item()  # 4 bits, same model
    config = {**d.config, "quantization": {"group_size": 64, "bits": 4}}
    save_block(d.model, config, tmp_path / "q4")
    again, _ = load_block(tmp_path / "q4", target)
    assert isinstance(again.fc, nn.QuantizedLinear)
    assert mx.allclose(again(toks, ctx), d.model(toks, ctx)).item()


def test_catalogue_block_pairs():
    from edgespec.loading.specs import load_catalog

    pairs = {n: p for n, p in load_catalog().pairs.items() if n.endswith("-dflash")}
    assert {"qwen3-4b-dflash", "qwen3-8b-dflash", "llama3.1-8b-dflash"} <= set(pairs)
    assert {"qwen3.5-4b-dflash", "qwen3.5-9b-dflash"} <= set(pairs)
    assert pairs["qwen3-8b-dflash"].draft == "z-lab/Qwen3-8B-DFlash-b16"
    assert pairs["qwen3-8b-dflash"].target == "mlx-community/Qwen3-8B-4bit"
    for p in pairs.values():
        assert p.draft.startswith("z-lab/") and p.platform == "mac"
        assert p.vocab is not None and p.vocab.target_rows == p.vocab.draft_rows


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"layer_types": ["full_attention", "linear_attention"]}, "other than full or sliding"),
        ({"output_multiplier": 2.0}, "output_multiplier"),
    ],
)
def test_options_it_does_not_run_are_refused(pair, extra, words):
    import json

    cfg = {**json.loads((pair[2] / "config.json").read_text()), **extra}
    with pytest.raises(ValueError, match=words):
        BlockArgs.from_config(cfg)
    plain = {
        **cfg,
        "layer_types": ["full_attention", "sliding_attention"],
        "output_multiplier": 1.0,
    }
    plain["dflash_config"] = {"mask_token_id": 5, "target_layer_ids": [0]}
    assert BlockArgs.from_config(plain).target_layer_ids == (0,)


def test_forward_matches_a_numpy_reference(pair):
    """The MLX block (cache-free and with the context cached in two pieces) against
    tests/helpers/reference_block.py on the same weights, context and tokens."""
    import json

    import numpy as np

    from tests.helpers.reference_block import block_logits

    _, target, folder = pair
    model, _ = load_block(folder, target)
    cfg = json.loads((folder / "config.json").read_text())
    w = {
        k: np.array(v, dtype=np.float64)
        for k, v in mx.load(str(folder / "model.safetensors")).items()
    }
    embed = np.array(target.model.embed_tokens.weight, dtype=np.float64)
    raw = np.random.default_rng(3).standard_normal((6, 2 * 64))
    tokens = [9, 5, 5, 5]
    want = block_logits(w, cfg, tokens, raw, embed, embed)  # the tiny qwen3 ties its head
    ctx = model.context(mx.array(raw, dtype=mx.float32)[None])
    toks = mx.array([tokens], dtype=mx.int32)
    free = np.array(model.logits(model(toks, ctx))[0])
    cache = model.make_cache()
    model(toks, ctx[:, :4], cache)
    cached = np.array(model.logits(model(toks, ctx[:, 4:], cache))[0])
    scale = np.abs(want).max()
    assert np.abs(free - want).max() < 1e-4 * scale
    assert np.abs(cached - want).max() < 1e-4 * scale


def test_transformers_5_rope_and_sliding_window_layers(pair, tmp_path):
    """rope_parameters (transformers 5) and sliding-window layers (z-lab's Qwen3.5 drafts carry
    use_sliding_window): read as transformers reads them, run as the numpy reference does (the
    sliding layer causal within the block: the config has no is_causal, block_mask.py)."""
    import json

    import numpy as np

    from tests.helpers.reference_block import block_logits

    target_path, target, _ = pair
    cfg = {
        "rope_theta": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "use_sliding_window": True,
        "sliding_window": 3,
        "max_window_layers": 1,
    }
    folder = write_dflash(target_path, tmp_path / "windowed", **cfg)
    args = BlockArgs.from_config(json.loads((folder / "config.json").read_text()))
    assert args.rope_theta == 10000.0 and args.rope_scaling is None
    assert args.layer_types == ("full_attention", "sliding_attention") and args.sliding_window == 3
    assert args.causal_layers == (False, True)
    default = {**cfg, "max_window_layers": 28}  # transformers' default: no draft layer slides
    assert (
        BlockArgs.from_config({**args.to_config(), "layer_types": [], **default}).layer_types == ()
    )
    model, _ = load_block(folder, target)
    assert [layer.self_attn.window for layer in model.layers] == [0, 3]
    w = {
        k: np.array(v, dtype=np.float64)
        for k, v in mx.load(str(folder / "model.safetensors")).items()
    }
    embed = np.array(target.model.embed_tokens.weight, dtype=np.float64)
    raw = np.random.default_rng(4).standard_normal((6, 2 * 64))
    full = {**json.loads((folder / "config.json").read_text()), "rope_theta": 10000.0}
    want = block_logits(w, full, [9, 5, 5], raw, embed, embed, windows={1: 3}, causal={1})
    ctx = model.context(mx.array(raw, dtype=mx.float32)[None])
    got = np.array(model.logits(model(mx.array([[9, 5, 5]]), ctx))[0])
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
    unwindowed = block_logits(w, full, [9, 5, 5], raw, embed, embed, causal={1})
    assert np.abs(got - unwindowed).max() > 1e-2 * np.abs(want).max()  # the window mattered


def test_a_batch_gives_each_row_its_own_block(pair):
    """Training runs [B, L] blocks over [B, S, d] contexts: each row as if alone."""
    _, target, folder = pair
    model, _ = load_block(folder, target)
    ctx = mx.concatenate([_ctx(model, 5, seed=1), _ctx(model, 5, seed=2)])
    toks = mx.array([[9, 5, 5], [4, 5, 5]], dtype=mx.int32)
    both = model(toks, ctx)
    for row in range(2):
        alone = model(toks[row : row + 1], ctx[row : row + 1])
        assert mx.allclose(both[row : row + 1], alone, atol=1e-5).item()
