"""Layouts as published, loaded through the real path: tiny checkpoints with the real config.json's
full key set and tensor names (tests/helpers/published.py, block_models.py) served by the stand-in
Hub (tests/helpers/hub_server.py) under the catalogue's ids, resolved at their pinned commits and
loaded. A key taken out, renamed or changed gives one line naming it. In-process: huggingface_hub's
endpoint setting is patched the way HF_ENDPOINT sets it at import."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub.constants as hf_constants
import mlx.core as mx
import pytest
from huggingface_hub.utils import disable_progress_bars

from edgespec.architectures.mtp import MTP_FILE, MtpModel
from edgespec.errors import ModelLoadError
from edgespec.loading.download import SOURCE_FILE, pull
from edgespec.loading.load import load_model, load_pair
from edgespec.loading.specs import load_catalog, parse_catalog
from edgespec.loading.status import model_status
from tests.helpers.block_models import write_dflash
from tests.helpers.hub_server import StandInHub
from tests.helpers.published import (
    MLX_4BIT,
    QWEN3_4B_CONFIG,
    qwen3_tensor_names,
    write_mlx_community_qwen3,
    write_mtp_checkpoint,
)
from tests.helpers.tiny import make_tokenizer

TARGET, DFLASH = "mlx-community/Qwen3-4B-4bit", "z-lab/Qwen3-4B-DFlash-b16"
SPARE = "edgespec-tests/Qwen3-spare-4bit"  # unpinned: each broken copy is a fresh commit of it
# The keys mlx-lm's qwen3 cannot do without: each one's absence must be named.
REQUIRED = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "rms_norm_eps",
    "vocab_size",
    "head_dim",
    "rope_theta",
    "tie_word_embeddings",
    "max_position_embeddings",
)


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("published")
    vocab = make_tokenizer(root / "tok")
    target = write_mlx_community_qwen3(root / "qwen3", root / "tok", vocab)
    dflash = write_dflash(target, root / "dflash", layer_ids=(0, 1))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (dflash / name).unlink(missing_ok=True)
    return {"target": target, "dflash": dflash}


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandInHub]:
    server = StandInHub().start()
    monkeypatch.setattr(hf_constants, "ENDPOINT", server.url)
    template = server.url + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    disable_progress_bars()
    yield server
    server.stop()


def pinned(repo: str) -> str:
    rev = load_catalog().revision(repo)
    assert rev is not None
    return rev.commit


def test_mlx_community_qwen3_4bit_as_published(published, hub):
    """Every key of the published config.json, mlx-lm's tensor names, loaded from the hub at the
    catalogue's commit."""
    hub.publish(TARGET, published["target"], commit=pinned(TARGET))
    loaded = load_model(TARGET)
    assert loaded.path.name == pinned(TARGET)
    config = json.loads((loaded.path / "config.json").read_text())
    assert set(config) == set(QWEN3_4B_CONFIG) | {"quantization", "quantization_config"}
    assert config["quantization"] == MLX_4BIT
    assert set(mx.load(str(loaded.path / "model.safetensors"))) == qwen3_tensor_names()
    assert loaded.model(mx.array([[1, 2, 3]])).shape[-1] == config["vocab_size"]


def _broken(published: dict[str, Path], tmp: Path, config=None, weights=None) -> Path:
    out = tmp / "broken"
    shutil.copytree(published["target"], out)
    if config is not None:
        cfg = json.loads((out / "config.json").read_text())
        config(cfg)
        (out / "config.json").write_text(json.dumps(cfg))
    if weights is not None:
        w = mx.load(str(out / "model.safetensors"))
        weights(w)
        mx.save_safetensors(str(out / "model.safetensors"), w)
    return out


def _error(hub: StandInHub, folder: Path) -> str:
    hub.publish(SPARE, folder)
    with pytest.raises(ModelLoadError) as err:
        load_model(SPARE)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("key", REQUIRED)
def test_a_missing_config_key_is_named(published, hub, tmp_path, key):
    assert key in _error(hub, _broken(published, tmp_path, config=lambda c: c.pop(key)))


def test_a_changed_model_type_is_named(published, hub, tmp_path):
    def change(c: dict) -> None:
        c["model_type"] = "qwen9"

    assert "qwen9" in _error(hub, _broken(published, tmp_path, config=change))


@pytest.mark.parametrize("how", ["missing", "renamed"])
def test_a_missing_or_renamed_tensor_is_named(published, hub, tmp_path, how):
    name = "model.layers.1.self_attn.q_norm.weight"

    def edit(w: dict) -> None:
        value = w.pop(name)
        if how == "renamed":
            w["model.layers.1.self_attn.query_norm.weight"] = value

    line = _error(hub, _broken(published, tmp_path, weights=edit))
    assert ("query_norm" if how == "renamed" else name) in line


def test_z_lab_dflash_layout_over_the_hub(published, hub):
    """Pair qwen3-4b-dflash: the target and z-lab's block draft (no tokenizer of its own, as
    z-lab ships it) at their pinned commits, the draft loaded as a block draft."""
    hub.publish(TARGET, published["target"], commit=pinned(TARGET))
    hub.publish(DFLASH, published["dflash"], commit=pinned(DFLASH))
    target, draft = load_pair(pair="qwen3-4b-dflash")
    assert draft is not None and type(draft.model).__name__ == "BlockModel"
    assert draft.path.name == pinned(DFLASH) and target.path.name == pinned(TARGET)


@pytest.mark.parametrize(
    ("where", "key"),
    [("dflash_config", "mask_token_id"), ("dflash_config", "target_layer_ids"), ("", "block_size")],
)
def test_a_missing_dflash_key_is_named(published, hub, tmp_path, where, key):
    out = tmp_path / "dflash"
    shutil.copytree(published["dflash"], out)
    cfg = json.loads((out / "config.json").read_text())
    (cfg[where] if where else cfg).pop(key)
    (out / "config.json").write_text(json.dumps(cfg))
    hub.publish(TARGET, published["target"], commit=pinned(TARGET))
    hub.publish("edgespec-tests/Qwen3-spare-DFlash-b16", out)  # unpinned: a fresh commit each
    with pytest.raises(ModelLoadError) as err:
        load_pair(TARGET, "edgespec-tests/Qwen3-spare-DFlash-b16")
    assert key in str(err.value) and "\n" not in str(err.value)


def test_qwen3_5_original_checkpoint_with_mtp_keys_pulled_at_its_pin(hub, tmp_path):
    """Catalogue model qwen3.5-9b-mtp is Qwen/Qwen3.5-9B, the original checkpoint with `mtp.*`
    keys: pulled from the hub at the catalogue's commit, converted with its head kept, recorded,
    and the pair whose draft is "mtp" loads that head."""
    checkpoint = write_mtp_checkpoint(tmp_path / "src", "qwen3_5")
    hub.publish("Qwen/Qwen3.5-9B", checkpoint, commit=pinned("Qwen/Qwen3.5-9B"))
    cat = load_catalog()
    folder = pull("qwen3.5-9b-mtp", catalog=cat, progress_bar=False)
    assert (folder / MTP_FILE).is_file()
    source = json.loads((folder / SOURCE_FILE).read_text())["source"]
    assert source == f"hf:Qwen/Qwen3.5-9B@{pinned('Qwen/Qwen3.5-9B')}"
    status = model_status("qwen3.5-9b-mtp", cat)
    assert (status.revision, status.pinned_by) == (pinned("Qwen/Qwen3.5-9B"), "pull")
    _, draft = load_pair(pair="qwen3.5-9b-mtp", catalog=cat)
    assert isinstance(draft.model, MtpModel)  # type: ignore[union-attr]


@pytest.mark.parametrize("family", ["deepseek_v3", "qwen3_next"])
def test_other_mtp_layouts_pulled_over_the_hub(hub, tmp_path, family):
    """DeepSeek-V3's next-n layer (its own shard) and Qwen3-Next's `mtp.*` keys: a catalogue
    model naming such a repo is pulled, converted with the head kept and drafts with it."""
    checkpoint = write_mtp_checkpoint(tmp_path / "src", family)
    commit = hub.publish(f"org/Tiny-{family}", checkpoint)
    raw = {
        "models": {"tiny": {"license": "Apache-2.0", "hf_repo": f"org/Tiny-{family}"}},
        "pairs": {"tiny-mtp": {"target": "tiny", "draft": "mtp"}},
    }
    cat = parse_catalog(raw, tmp_path)
    folder = pull("tiny", catalog=cat, progress_bar=False)
    assert (folder / MTP_FILE).is_file()
    assert model_status("tiny", cat).revision == commit
    _, draft = load_pair(pair="tiny-mtp", catalog=cat)
    expected = "NextnModel" if family == "deepseek_v3" else "MtpModel"
    assert draft is not None and type(draft.model).__name__ == expected
