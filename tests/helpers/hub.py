"""A Hugging Face hub cache laid out in a temporary folder, and an offline hub for the tests
that resolve presets (the catalogue's, pull's, the block and MTP drafts')."""

from __future__ import annotations

import shutil
from pathlib import Path

import huggingface_hub.constants as hf_constants
import pytest

REV = "0123456789abcdef0123456789abcdef01234567"


def make_hub_cache(cache: Path, repo: str, src: Path) -> Path:
    """Lay out `src` as the hub cache does: models--org--name/{refs/main, snapshots/<rev>/...}."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snap = root / "snapshots" / REV
    shutil.copytree(src, snap)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(REV)
    return snap


@pytest.fixture
def offline_hub(tmp_path, monkeypatch) -> Path:
    """An empty hub cache in tmp, HF_HUB_OFFLINE on (constants are read at import, so patch them)."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    return cache
