"""A target's own MTP head as its draft (edgespec/architectures/mtp.py), and the conversion of an
original Hugging Face checkpoint that keeps it.

`load_mtp_draft(target)` reads the MTP weights stored with a loaded target: a converted folder's
mtp.safetensors, or the `mtp.*` keys of the original safetensors. An mlx-community folder has
none (mlx-lm drops them): a one-line ConfigError says how to get them.

`convert_checkpoint(src, dst)` turns an original checkpoint folder (safetensors + config.json with
`mtp_num_hidden_layers`) into an MLX folder: the model quantized by mlx-lm (4 bits by default),
its MTP layer beside it in mtp.safetensors (8 bits by default, `pull --mtp-bits` 4 or 0 for
float; `mtp_quantization` in config.json), the tokenizer files copied. `edgespec pull FOLDER`
runs it into the cache; `edgespec pull NAME` of a catalogue model whose Hugging Face repo is
such a checkpoint converts the download in place.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from edgespec.architectures.mtp import MTP_FILE
from edgespec.architectures.nextn import (
    build_head,
    has_raw_head,
    head_layers,
    load_head,
    read_head,
)
from edgespec.device import kind as backend_kind
from edgespec.errors import ConfigError
from edgespec.loading import paths
from edgespec.loading.folder import DTYPES, LoadedModel, cast_floats, dequantize_model, read_config

_SKIP = ("config.json", "model.safetensors.index.json")  # written anew, not copied
SOURCE_FILE = "edgespec-source.json"


def load_mtp_draft(target: LoadedModel, dtype: str | None = None) -> LoadedModel:
    """The MTP head of a loaded target as a draft LoadedModel (its tokenizer and folder)."""
    model = load_head(target.path, target.config, target.model)
    if backend_kind().dequantizes:
        dequantize_model(model)
    if dtype in DTYPES:
        cast_floats(model, dtype)
    name = f"{target.name} (mtp)"
    return LoadedModel(
        model, target.tokenizer, name, target.path, target.context_window, target.config
    )


def is_checkpoint_with_mtp(path: Path) -> bool:
    """An original checkpoint folder that declares an MTP layer and holds its weights (not a
    converted folder, nor a conversion that dropped them)."""
    if not (path / "config.json").is_file():
        return False
    config = read_config(path)
    if head_layers(config) < 1 or "mtp_quantization" in config:
        return False
    return has_raw_head(path, config)


def converted_dir(src: Path, mtp_bits: int = 8) -> Path:
    """Where `edgespec pull FOLDER` puts a folder's conversion: <home>/converted/<name>-<hash>,
    keyed by the folder's absolute path, its config.json and the MTP layer's bits (when not the
    default 8, so that a 4-bit or float head gets a folder of its own)."""
    src = src.resolve()
    config = json.dumps(read_config(src), sort_keys=True)  # one-line error without config.json
    key = f"{src}\n{config}" + ("" if mtp_bits == 8 else f"\nmtp_bits={mtp_bits}")
    digest = hashlib.sha256(key.encode()).hexdigest()
    return paths.home() / "converted" / f"{src.name}-{digest[:12]}"


def _quantize(model: nn.Module, bits: int) -> dict | None:
    """Quantize every layer whose input width divides 64 (MLX's default group); the config entry
    (None for bits 0: the layer stays float)."""
    if bits == 0:
        return None
    nn.quantize(
        model,
        group_size=64,
        bits=bits,
        class_predicate=lambda p, m: hasattr(m, "to_quantized") and m.weight.shape[-1] % 64 == 0,
    )
    return {"group_size": 64, "bits": bits}


def convert_checkpoint(src: Path, dst: Path, bits: int = 4, mtp_bits: int = 8) -> Path:
    """Write the MLX folder of checkpoint `src` into `dst` atomically (an existing `dst` is kept:
    a conversion runs once), MTP kept; returns `dst`."""
    if (dst / "config.json").is_file():
        return dst
    with paths.atomic_dir(dst) as tmp:
        write_conversion(src, tmp, bits, mtp_bits)
        record = {"source": str(src.resolve()), "bits": bits, "mtp_bits": mtp_bits}
        (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return dst


def convert_in_place(folder: Path, bits: int = 4, mtp_bits: int = 8) -> None:
    """Replace the files of an original checkpoint in `folder` by its conversion (a pull's
    download: links into the Hugging Face cache, moved aside, then dropped)."""
    original = folder / ".original"
    original.mkdir()
    for f in list(folder.iterdir()):
        if f.is_file():
            os.replace(f, original / f.name)
    write_conversion(original, folder, bits, mtp_bits)
    shutil.rmtree(original)


def write_conversion(src: Path, out: Path, bits: int, mtp_bits: int) -> None:
    """Write checkpoint `src` into the existing folder `out`: the model quantized by mlx-lm
    (`bits`), its MTP layer in mtp.safetensors (`mtp_bits`; 0 keeps it float), config.json
    with both quantizations, the tokenizer and licence files."""
    from mlx_lm.utils import load_model, quantize_model, save_config, save_model

    config = read_config(src)
    if head_layers(config) < 1:
        raise ConfigError(
            f"{src} declares no MTP layer (mtp_num_hidden_layers or num_nextn_predict_layers "
            "in config.json)"
        )
    mtp = build_head(config)
    mtp.load_weights(list(read_head(src, config).items()), strict=True)
    model, loaded = load_model(src, lazy=True)
    model, loaded = quantize_model(model, loaded, group_size=64, bits=bits)
    save_model(out, model)
    loaded["mtp_quantization"] = _quantize(mtp, mtp_bits)
    weights = dict(tree_flatten(mtp.parameters()))
    mx.save_safetensors(str(out / MTP_FILE), weights, metadata={"format": "mlx"})
    save_config(loaded, out / "config.json")
    for f in src.iterdir():
        if f.is_file() and _copied(f.name):
            shutil.copyfile(f, out / f.name)


def _copied(name: str) -> bool:
    """Files of the checkpoint that go with the converted weights: tokenizer, template, licence."""
    if name in _SKIP:
        return False
    return name.startswith("LICENSE") or name.endswith((".json", ".txt", ".model", ".jinja"))
