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


def load_tokenizer(path: Path, config: dict, fallback: Path | None) -> Any:

    source = path if any((path / f).is_file() for f in _TOKENIZER_FILES) else fallback
    if source is None:
        raise ModelLoadError(f"{path} has no tokenizer (tokenizer.json / tokenizer_config.json)")
    try:
        return mlx_load_tokenizer(source, eos_token_ids=config.get("eos_token_id"))
    except Exception as e:
        raise ModelLoadError(f"cannot load the tokenizer of {source}: {one_line(e)}") from None


def context_window(config: dict) -> int:
    """The model's context window from its config (a multimodal model's text_config), else
    DEFAULT_CONTEXT."""
    context = config.get("max_position_embeddings") or config.get("text_config", {}).get(
        "max_position_embeddings"
    )
    return int(context or DEFAULT_CONTEXT)
