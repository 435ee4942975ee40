"""A model folder: its config, its tokenizer, and the LoadedModel record a loader returns."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.nn as nn
from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

from edgespec.errors import ModelLoadError, one_line

DEFAULT_CONTEXT = 2048
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
# every file a tokenizer may be read from: two folders with the same bytes in all of them load
# the same tokenizer
_TOKENIZER_PARTS = (
    *_TOKENIZER_FILES,
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)


@dataclass
class LoadedModel:
    """A model ready to run: weights, tokenizer, where it came from and its context window."""

    model: nn.Module
    tokenizer: Any  # mlx_lm.tokenizer_utils.TokenizerWrapper
    name: str
    path: Path
    context_window: int
    config: dict


def read_config(path: Path) -> dict:
    try:
        return json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"{path} has no config.json (not a model folder)") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path / 'config.json'} is not valid JSON: {one_line(e)}") from None


def load_tokenizer(path: Path, config: dict, fallback: Path | LoadedModel | None) -> Any:
    """The tokenizer of the model folder `path`; a folder that ships none takes `fallback`'s (a
    folder's, loaded). With a loaded model as `fallback` (a draft's target), a folder that ships
    none or the same files shares that model's tokenizer object instead of loading it again:
    check_tokenizers then has nothing to compare."""
    own = any((path / f).is_file() for f in _TOKENIZER_FILES)
    if isinstance(fallback, LoadedModel):
        if not own or same_tokenizer_files(path, fallback.path):
            return fallback.tokenizer
        fallback = fallback.path
    source = path if own else fallback
    if source is None:
        raise ModelLoadError(f"{path} has no tokenizer (tokenizer.json / tokenizer_config.json)")
    try:
        return mlx_load_tokenizer(source, eos_token_ids=config.get("eos_token_id"))
    except Exception as e:
        raise ModelLoadError(f"cannot load the tokenizer of {source}: {one_line(e)}") from None


def same_tokenizer_files(a: Path, b: Path) -> bool:
    """Whether folders `a` and `b` hold the same tokenizer files, byte for byte."""
    if a.resolve() == b.resolve():
        return True
    for name in _TOKENIZER_PARTS:
        fa, fb = a / name, b / name
        if fa.is_file() != fb.is_file():
            return False
        if fa.is_file() and (
            fa.stat().st_size != fb.stat().st_size or fa.read_bytes() != fb.read_bytes()
        ):
            return False
    return True


def context_window(config: dict) -> int:
    """The model's context window from its config (a multimodal model's text_config), else
    DEFAULT_CONTEXT."""
    context = config.get("max_position_embeddings") or config.get("text_config", {}).get(
        "max_position_embeddings"
    )
    return int(context or DEFAULT_CONTEXT)
