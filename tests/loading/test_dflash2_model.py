"""DFlash2 drafts (edgespec/architectures/dflash2_model.py) as published: the config.json fields,
the tensor names (tests/helpers/tiny_dflash2.py), a forward against the numpy reference, and a
one-line error naming a changed or missing key."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from edgespec.architectures import architecture_of
from edgespec.architectures.dflash2_model import DFlash2Args, grouped_conv, load_dflash2
from edgespec.errors import ModelLoadError
from edgespec.loading.folder import cast_floats
from edgespec.loading.load import load_model, load_pair
from tests.helpers.block_models import tiny_qwen3
from tests.helpers.tiny_dflash2 import PUBLISHED, QWEN38_DRAFT, write_dflash2


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return tiny_qwen3(tmp_path_factory.mktemp("dflash2_model"))


def test_published_configs_read_as_published():
    args = DFlash2Args.from_config(PUBLISHED)
    assert (args.block_size, args.mask_token_id, args.target_layer_ids) == (
        16,
        201818,
        (1, 13, 25, 37, 49),
    )
    assert (args.conv_kernel_size, args.conv_group_size) == (2, 16)
    assert (args.selector_rank, args.selector_top_k) == (256, 16)
    assert args.layer_types == ("sliding_attention",) * 5 and args.sliding_window == 2048
    assert args.output_multiplier == pytest.approx(0.196116135)
    assert args.final_logit_softcapping == 20.0 and args.input_embedding_scale == 1.0
    assert args.rope_theta == 500000.0 and args.num_target_layers == 52
    qwen = DFlash2Args.from_config({**PUBLISHED, "dflash_config": QWEN38_DRAFT})
    assert qwen.block_size == 8 and qwen.mask_token_id == 248070
    assert qwen.output_multiplier == 1.0 and qwen.final_logit_softcapping == 0.0
    assert architecture_of(PUBLISHED) == "dflash2" and architecture_of(PUBLISHED) != "block"


def test_the_tiny_checkpoint_has_the_published_key_set(target, tmp_path):
    _, cfg = write_dflash2(target, tmp_path / "d")
    assert set(cfg) == set(PUBLISHED)
    assert set(cfg["dflash_config"]) == set(QWEN38_DRAFT)
    _, with_scalars = write_dflash2(target, tmp_path / "s", scalars=True)
    assert set(with_scalars["dflash_config"]) == set(PUBLISHED["dflash_config"])
    names = set(mx.load(str(tmp_path / "d" / "model.safetensors")))
    assert "candidate_selector.predecessor_codebook" in names
    assert "layers.1.mlp_conv.kernel_projection.weight" in names


def test_grouped_conv_is_a_causal_sum_over_taps():
    y = mx.array([[[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]]])  # [1, 3, d = 2]
    base = mx.array([[1.0, 1.0], [0.5, 0.5]])  # taps 2
    delta = mx.zeros((1, 3, 2, 1))  # one group of 2 channels
    out = np.array(grouped_conv(y, delta, base))[0]
    assert np.allclose(out, [[1, 10], [2.5, 25], [4, 40]])
    delta = mx.ones((1, 3, 2, 1))
    assert np.allclose(np.array(grouped_conv(y, delta, base))[0], [[2, 20], [5.5, 55], [9, 90]])


@pytest.mark.parametrize("scalars", [False, True])
def test_forward_matches_the_numpy_reference(target, tmp_path, scalars):
    """Block logits (cache-free, and with the context cached in two pieces, longer than the
    16-token window) against tests/helpers/reference_block.py with its convolutions, times the
    output multiplier and soft-capped when the config has them."""
    from tests.helpers.reference_block import block_logits

    folder, cfg = write_dflash2(target, tmp_path / "d", scalars=scalars)
    t = load_model(str(target)).model
    model, _ = load_dflash2(folder, t)
    cast_floats(model, "float32")  # stored bf16, as published
    stored = mx.load(str(folder / "model.safetensors")).items()
    w = {k: np.array(v.astype(mx.float32), dtype=np.float64) for k, v in stored}
    embed = np.array(t.model.embed_tokens.weight, dtype=np.float64)
    raw = np.random.default_rng(3).standard_normal((20, 2 * 64))
    tokens = [9, 5, 5, 5, 5]
    ref_cfg = {**cfg, "rope_theta": 10000.0}
    want = block_logits(w, ref_cfg, tokens, raw, embed, embed, windows={0: 16, 1: 16}, conv=True)
    if scalars:
        dc = cfg["dflash_config"]
        cap = dc["final_logit_softcapping"]
        want = np.tanh(want * dc["output_multiplier"] / cap) * cap
    ctx = model.context(mx.array(raw, dtype=mx.float32)[None])
    toks = mx.array([tokens], dtype=mx.int32)
    free = np.array(model.logits(model(toks, ctx))[0])
    cache = model.make_cache()
    model(toks, ctx[:, :12], cache)
    cached = np.array(model.logits(model(toks, ctx[:, 12:], cache))[0])
    scale = np.abs(want).max()
    assert np.abs(free - want).max() < 1e-3 * scale
    assert np.abs(cached - want).max() < 1e-3 * scale
    plain = block_logits(w, ref_cfg, tokens, raw, embed, embed, windows={0: 16, 1: 16})
    assert scalars or np.abs(plain - want).max() > 1e-2 * scale  # the convolutions mattered


def _broken(target: Path, folder: Path, change) -> str:
    weights = dict(mx.load(str(folder / "model.safetensors")))
    change(weights)
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    with pytest.raises(ModelLoadError) as err:
        load_pair(str(target), str(folder))
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_missing_or_changed_key_is_named_in_one_line(target, tmp_path):
    sel = "candidate_selector.predecessor_codebook"
    folder, _ = write_dflash2(target, tmp_path / "missing")
    assert sel in _broken(target, folder, lambda w: w.pop(sel))
    folder, _ = write_dflash2(target, tmp_path / "renamed")
    message = _broken(target, folder, lambda w: w.update({sel + ".weight": w.pop(sel)}))
    assert sel in message
    folder, _ = write_dflash2(target, tmp_path / "shape")
    conv = "layers.0.attention_conv.base_kernel"
    message = _broken(target, folder, lambda w: w.update({conv: w[conv][:, :1]}))
    assert conv in message and "[2, 1, 64]" in message


@pytest.mark.parametrize(
    "change, words",
    [
        ({"dflash": {"selector_top_k": None}}, "selector_top_k"),
        ({"dflash": {"conv_group_size": 48}}, "conv_group_size 48"),
        ({"dflash": {"conv_kernel_size": 0}}, "conv_kernel_size"),
    ],
)
def test_config_fields_it_cannot_run_are_named(target, tmp_path, change, words):
    folder, cfg = write_dflash2(target, tmp_path / "d")
    dc = {**cfg["dflash_config"], **change.get("dflash", {})}
    cfg = {**cfg, **{k: v for k, v in change.items() if k != "dflash"}}
    cfg["dflash_config"] = {k: v for k, v in dc.items() if v is not None}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=words) as err:
        load_pair(str(target), str(folder))
    assert "\n" not in str(err.value)
