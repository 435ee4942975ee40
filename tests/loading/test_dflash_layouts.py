"""z-lab's DFlash drafts in both published layouts (docs/architectures.md, DFlash and DFlash2):
the layout through May 2026 (block_size and rope_theta at top level, 8 full-attention layers,
mask id 248070, 5 target layers) and the one z-lab moved to in June 2026 (block_size under
dflash_config, rope_parameters, 6 layers of which 5 slide, mask id 248077, 8 target layers).
Each scaled down on a tiny qwen3 target, loaded through the real load path, speculating exactly;
a changed or missing key is named in one line."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest

from edgespec.architectures.block_model import BlockModel
from edgespec.config import SpecConfig
from edgespec.errors import ModelLoadError
from edgespec.loading.load import load_pair
from edgespec.runtime import Engine
from tests.helpers import PROMPT, gen, plain_ids, token_ids
from tests.helpers.block_models import tiny_qwen3, write_dflash

# The published fields that differ between the two layouts (the rest are alike), scaled down:
# layer counts and ids to the tiny target, the mask ids (248070, 248077) to token 5.
MAY = {"block_size": 16, "rope_theta": 10000.0, "layer_types": ["full_attention"] * 8}
JUNE = {
    "dflash_config": {"block_size": 16, "mask_token_id": 5, "target_layer_ids": [0, 1, 2, 3]},
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
    "sliding_window": 8,
    "use_sliding_window": True,
    "max_window_layers": 6,
}


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return tiny_qwen3(tmp_path_factory.mktemp("dflash_layouts"))


def _write(target: Path, out: Path, layout: str) -> Path:
    if layout == "may":
        folder = write_dflash(target, out, layers=8, layer_ids=(0, 1, 2), block=16)
        cfg = json.loads((folder / "config.json").read_text())
        cfg |= MAY
    else:
        folder = write_dflash(target, out, layers=6, layer_ids=(0, 1, 2, 3), block=16)
        cfg = json.loads((folder / "config.json").read_text())
        for key in ("block_size", "rope_theta", "rope_scaling"):
            del cfg[key]
        cfg |= JUNE
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


@pytest.mark.parametrize("layout", ["may", "june"])
def test_both_layouts_load_and_speculate_exactly(target, tmp_path, layout):
    t, d = load_pair(str(target), str(_write(target, tmp_path / layout, layout)))
    assert d is not None and isinstance(d.model, BlockModel)
    args = d.model.args
    assert args.block_size == 16 and args.mask_token_id == 5 and args.rope_theta == 10000.0
    windows = [layer.self_attn.window for layer in d.model.layers]
    assert windows == ([0] * 8 if layout == "may" else [8] * 5 + [0])
    causal = [layer.self_attn.causal for layer in d.model.layers]
    assert causal == ([False] * 8 if layout == "may" else [True] * 5 + [False])
    engine = Engine(t, d)
    ids = engine.encode_raw(PROMPT)
    events = gen(
        engine, ids, SpecConfig(method="block", k=7, adaptive=False), 40
    )  # past the 8-token window
    assert token_ids(events) == plain_ids(engine, ids, 40)


@pytest.mark.parametrize("layout", ["may", "june"])
def test_a_changed_or_missing_key_is_named(target, tmp_path, layout):
    folder = _write(target, tmp_path / layout, layout)
    weights = dict(mx.load(str(folder / "model.safetensors")))
    weights["layers.5.self_attn.qnorm.weight"] = weights.pop("layers.5.self_attn.q_norm.weight")
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    with pytest.raises(ModelLoadError, match="layers.5.self_attn.q_norm.weight") as err:
        load_pair(str(target), str(folder))
    assert "\n" not in str(err.value)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.get("dflash_config", {}).pop("block_size", None)
    cfg.pop("block_size", None)
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="block_size"):
        load_pair(str(target), str(folder))


@pytest.mark.parametrize("is_causal", [None, False, True])
def test_sliding_layers_are_causal_unless_the_config_says_not(target, tmp_path, is_causal):
    """As z-lab's reference reads a config: no `is_causal` makes the sliding layers causal
    within the block (a row does not see the rows after it), `is_causal` decides for every
    layer when given. All layers slide here, so a causal draft's rows before the changed one
    stay as they were."""
    from edgespec.architectures.block_model import load_block
    from edgespec.loading.load import load_model

    folder = _write(target, tmp_path / "june", "june")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["layer_types"] = ["sliding_attention"] * 6
    if is_causal is not None:
        cfg["is_causal"] = is_causal
    (folder / "config.json").write_text(json.dumps(cfg))
    model, _ = load_block(folder, load_model(str(target)).model)
    raw = mx.random.normal((1, 5, 4 * 64), key=mx.random.key(1))
    ctx = model.context(raw)
    a = model(mx.array([[9, 5, 5, 5]], dtype=mx.int32), ctx)
    b = model(mx.array([[9, 5, 5, 7]], dtype=mx.int32), ctx)
    same = mx.allclose(a[:, :3], b[:, :3], atol=1e-5).item()
    assert same == (is_causal is not False)
    assert not mx.allclose(a[:, 3], b[:, 3], atol=1e-5).item()
