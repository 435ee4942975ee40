"""Resolving and loading models: tiny folders made in tmp dirs, every bad input a typed one-line
error naming the path, the CPU/GPU weight policy, the tokenizer and cache checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.cache import ArraysCache, RotatingKVCache

from edgespec.architectures.token_draft import MODEL_TYPE, build, save_draft
from edgespec.errors import (
    CacheNotTrimmableError,
    ConfigError,
    ModelLoadError,
    ModelNotFoundError,
    TokenizerMismatchError,
)
from edgespec.loading import load as loading
from edgespec.loading.folder import DTYPES, is_quantized, quantize_model
from edgespec.loading.load import check_tokenizers, check_trimmable
from edgespec.loading.resolve import resolve_model
from edgespec.loading.specs import parse_catalog
from tests.helpers.gguf import write_tiny_gguf
from tests.helpers.tiny import make_tiny_pair


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory) -> tuple[Path, Path]:
    return make_tiny_pair(tmp_path_factory.mktemp("pair"), seed=0)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _assert_one_line(err: pytest.ExceptionInfo, path: Path) -> None:
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg, msg


def test_load_local_folder(pair_dir):
    target, _ = pair_dir
    lm = loading.load_model(str(target))
    assert lm.path == target and lm.context_window == 512 and lm.config["model_type"] == "llama"
    ids = lm.tokenizer.encode("the model", add_special_tokens=False)
    assert lm.tokenizer.decode(ids) == "the model"
    assert lm.model(mx.array([ids])).shape == (1, len(ids), lm.config["vocab_size"])


def test_unknown_specs_raise_model_not_found(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no-such-model"):
        resolve_model("no-such-model")
    with pytest.raises(ModelNotFoundError, match="nope"):
        resolve_model(str(tmp_path / "nope"))


@pytest.mark.parametrize(
    "damage,match",
    [
        ("no_config", "no config.json"),
        ("bad_json", "not valid JSON"),
        ("no_weights", "no \\*.safetensors"),
        ("garbage_weights", "cannot load weights"),
        ("truncated_weights", "cannot load weights"),
        ("missing_tensor", "cannot load weights"),
        ("bad_config_value", "cannot load weights"),
    ],
)
def test_broken_folders_raise_model_load_error(pair_dir, tmp_path, damage, match):
    folder = _copy(pair_dir[0], tmp_path / "broken")
    weights, config = folder / "model.safetensors", folder / "config.json"
    if damage == "no_config":
        config.unlink()
    elif damage == "bad_json":
        config.write_text("{ not json")
    elif damage == "no_weights":
        weights.unlink()
    elif damage == "garbage_weights":
        weights.write_bytes(b"\x00garbage" * 64)
    elif damage == "truncated_weights":
        weights.write_bytes(weights.read_bytes()[:5000])
    elif damage == "missing_tensor":
        w = mx.load(str(weights))
        w.pop("model.norm.weight")
        mx.save_safetensors(str(weights), w)
    elif damage == "bad_config_value":
        config.write_text(json.dumps({**json.loads(config.read_text()), "hidden_size": 48}))
    with pytest.raises(ModelLoadError, match=match) as err:
        loading.load_model(str(folder))
    _assert_one_line(err, folder)


def test_non_model_file_raises(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ModelLoadError, match="not a .gguf"):
        resolve_model(str(tmp_path / "notes.txt"))


def test_gguf_spec_converts_once_into_cache_keyed_by_hash(tmp_path):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    first = resolve_model(str(tmp_path / "tiny.gguf"))
    assert first.parent == tmp_path / "home" / "gguf" and (first / "config.json").is_file()
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert resolve_model(str(tmp_path / "tiny.gguf")) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # not converted again
    lm = loading.load_model(str(tmp_path / "tiny.gguf"))
    assert lm.tokenizer.eos_token == "<|im_end|>"


def _quantized_copy(src: Path, dst: Path) -> Path:
    """A 4-bit (group 32) copy of a tiny model folder, as mlx-lm writes quantized models."""
    from mlx.utils import tree_flatten

    folder = _copy(src, dst)
    lm = loading.load_model(str(src), dequantize=False)
    nn.quantize(lm.model, group_size=32, bits=4)
    mx.save_safetensors(
        str(folder / "model.safetensors"), dict(tree_flatten(lm.model.parameters()))
    )
    config = json.loads((folder / "config.json").read_text())
    config["quantization"] = {"group_size": 32, "bits": 4}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _has_quantized(model: nn.Module) -> bool:
    return is_quantized(model)


def test_cpu_policy_dequantizes_to_fp32_and_keeps_logits(pair_dir, tmp_path):
    folder = _quantized_copy(pair_dir[0], tmp_path / "q4")
    kept = loading.load_model(str(folder), dequantize=False)
    dense = loading.load_model(str(folder), dequantize=True)
    assert _has_quantized(kept.model) and not _has_quantized(dense.model)
    dtypes = {p.dtype for _, p in nn.utils.tree_flatten(dense.model.parameters())}
    assert dtypes == {mx.float32}
    ids = mx.array([[5, 9, 33, 101, 7]])
    np.testing.assert_allclose(np.array(kept.model(ids)), np.array(dense.model(ids)), atol=2e-3)


def test_gpu_policy_quantizes_unquantized_draft(pair_dir):
    lm = loading.load_model(str(pair_dir[1]), quantize_bits=4, dequantize=False)
    assert isinstance(lm.model.model.layers[0].mlp.up_proj, nn.QuantizedLinear)
    assert lm.model.model.layers[0].mlp.up_proj.bits == 4


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dtype_casts_every_float_parameter_and_keeps_packed_weights(pair_dir, tmp_path, dtype):
    folder = _quantized_copy(pair_dir[0], tmp_path / "q4")
    ref = loading.load_model(str(folder), dequantize=False)
    cast = loading.load_model(str(folder), dequantize=False, dtype=dtype)
    assert _has_quantized(cast.model)
    dtypes = {p.dtype for _, p in nn.utils.tree_flatten(cast.model.parameters())}
    assert dtypes == {DTYPES[dtype], mx.uint32}
    ids = mx.array([[5, 9, 33, 101, 7]])
    out = cast.model(ids)
    assert out.dtype == DTYPES[dtype]  # activations follow the parameters
    a, b = np.array(out.astype(mx.float32)), np.array(ref.model(ids))
    # the same model, rounded (bfloat16 keeps 8 significant bits; garbage would be ~1.4)
    assert np.abs(a - b).mean() < {"float16": 0.02, "bfloat16": 0.25}[dtype] * np.abs(b).mean()


def test_dtype_auto_is_float32_on_the_cpu_and_unknown_dtypes_are_refused(pair_dir):
    auto = loading.load_model(str(pair_dir[0]), dtype="auto")
    dtypes = {p.dtype for _, p in nn.utils.tree_flatten(auto.model.parameters())}
    assert dtypes == {mx.float32}
    with pytest.raises(ConfigError, match="unknown dtype 'float8'"):
        loading.load_model(str(pair_dir[0]), dtype="float8")


def test_quantize_skips_layers_that_do_not_divide_the_group():
    model = nn.Sequential(nn.Linear(64, 8), nn.Linear(96, 8), nn.Linear(40, 8))
    quantize_model(model, 4)
    kinds = [type(m).__name__ for m in model.layers]
    assert kinds == ["QuantizedLinear", "QuantizedLinear", "Linear"]
    assert model.layers[1].group_size == 32  # 96 is not a multiple of 64


def test_check_tokenizers_accepts_same_and_rejects_different(pair_dir, tmp_path):
    t = loading.load_model(str(pair_dir[0]))
    check_tokenizers(t, loading.load_model(str(pair_dir[1])))
    other, _ = make_tiny_pair(tmp_path / "other", seed=5)
    with pytest.raises(TokenizerMismatchError, match="target .* and draft .*") as err:
        check_tokenizers(t, loading.load_model(str(other)))
    assert "\n" not in str(err.value)


def test_check_tokenizers_finds_vocab_difference_the_probes_miss(pair_dir, tmp_path):
    folder = _copy(pair_dir[1], tmp_path / "swapped")
    tok = json.loads((folder / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = chr(0x100 + 1), chr(0x100 + 2)  # byte-level chars for bytes 0x01, 0x02: never probed
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    t, d = loading.load_model(str(pair_dir[0])), loading.load_model(str(folder))
    with pytest.raises(TokenizerMismatchError, match=f"id {min(vocab[a], vocab[b])} "):
        check_tokenizers(t, d)


def test_check_tokenizers_ignores_padding_past_shared_range(pair_dir, tmp_path):
    folder = _copy(pair_dir[1], tmp_path / "padded")
    tok = json.loads((folder / "tokenizer.json").read_text())
    n = max(tok["model"]["vocab"].values()) + 1
    tok["added_tokens"].append(
        {
            "id": n,
            "content": "<pad_extra>",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    )
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    check_tokenizers(loading.load_model(str(pair_dir[0])), loading.load_model(str(folder)))


def test_check_trimmable():
    class Hybrid(nn.Module):
        layers = [0, 1]

        def make_cache(self):
            return [ArraysCache(2)]

    class Sinks(nn.Module):
        def make_cache(self):
            return [RotatingKVCache(8, keep=4)]

    check_trimmable(Hybrid(), "hybrid")  # recurrent state is restored (edgespec/rewind.py)
    with pytest.raises(CacheNotTrimmableError, match="RotatingKVCache"):
        check_trimmable(Sinks(), "sinks")
    from mlx_lm.models import llama

    args = llama.ModelArgs("llama", 32, 1, 64, 2, 1e-5, 50)
    check_trimmable(llama.Model(args))


def _catalog(tmp_path: Path, target: Path, draft_local: str) -> object:
    raw = {
        "default_pair": "tiny",
        "models": {"tiny-target": {"local": str(target)}, "tiny-draft": {"local": draft_local}},
        "pairs": {"tiny": {"target": "tiny-target", "draft": "tiny-draft"}},
    }
    return parse_catalog(raw, tmp_path)


def test_load_pair_default_from_catalogue(pair_dir, tmp_path):
    cat = _catalog(tmp_path, pair_dir[0], str(pair_dir[1]))
    t, d = loading.load_pair(catalog=cat)
    assert t.name == "tiny-target" and d is not None and d.name == "tiny-draft"


def test_load_pair_with_missing_draft_fails_clearly_unless_no_spec(pair_dir, tmp_path):
    cat = _catalog(tmp_path, pair_dir[0], "not-trained-yet")
    with pytest.raises(ModelNotFoundError, match="not available yet.*--no-spec"):
        loading.load_pair(catalog=cat)
    t, d = loading.load_pair(catalog=cat, with_draft=False)
    assert t.name == "tiny-target" and d is None


def test_load_pair_edgespec_draft_borrows_target_tokenizer(pair_dir, tmp_path):
    from tests.helpers.tiny import llama_config

    target_cfg = json.loads((pair_dir[0] / "config.json").read_text())
    config = {
        **llama_config(target_cfg["vocab_size"], 1),
        "model_type": MODEL_TYPE,
        "head_size": 16,
    }
    draft = build(config)
    draft.head_ids = mx.arange(16, dtype=mx.int32)
    save_draft(draft, config, tmp_path / "own-draft")
    t, d = loading.load_pair(str(pair_dir[0]), str(tmp_path / "own-draft"))
    assert d is not None and d.config["model_type"] == MODEL_TYPE
    logits = d.model(mx.array([[3, 4, 5]]))
    assert logits.shape[-1] == target_cfg["vocab_size"]
    assert mx.isinf(logits[0, 0, 16:]).all().item()  # off-head tokens get q = 0
    assert d.tokenizer is t.tokenizer  # shared, not loaded twice


def test_a_draft_shares_the_tokenizer_only_when_its_files_are_the_targets(pair_dir, tmp_path):
    t, d = loading.load_pair(str(pair_dir[0]), str(pair_dir[1]))  # the same files, copied
    assert d is not None and d.tokenizer is t.tokenizer
    draft = tmp_path / "draft"
    shutil.copytree(pair_dir[1], draft)
    config = json.loads((draft / "tokenizer_config.json").read_text())
    (draft / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 77}))
    t, d = loading.load_pair(str(pair_dir[0]), str(draft))  # one byte apart: its own, checked
    assert d is not None and d.tokenizer is not t.tokenizer
    assert d.tokenizer.model_max_length == 77


def test_load_pair_rejects_mismatched_tokenizers(pair_dir, tmp_path):
    other, _ = make_tiny_pair(tmp_path / "other", seed=5)
    with pytest.raises(TokenizerMismatchError, match=str(other)):
        loading.load_pair(str(pair_dir[0]), str(other))


def test_pair_name_given_as_target_means_that_pair():
    from edgespec.loading.specs import load_catalog, pair_specs

    cat = load_catalog()
    assert pair_specs("smollm2-135m", None, None, cat) == (
        "smollm2-135m-instruct",
        "smollm2-135m-draft",
        "smollm2-135m",
    )
    # a model name stays a model; an explicit draft still overrides the pair's
    assert pair_specs("smollm2-135m-instruct", None, None, cat)[1] is None
    assert pair_specs("smollm2-135m", "/some/draft", None, cat)[1] == "/some/draft"
