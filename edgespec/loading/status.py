"""What is on this machine for a model spec: a catalogue model pulled into EdgeSpec's cache, an
in-repo folder, or a Hugging Face hub snapshot (no network is touched)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import try_to_load_from_cache

from edgespec.loading import paths
from edgespec.loading.paths import cached
from edgespec.loading.specs import Catalog, is_repo_id


@dataclass(frozen=True)
class ModelStatus:
    """What is on this machine for one model spec (no network is touched)."""

    spec: str
    kind: str  # "catalogue" (pulled into EdgeSpec's cache), "local" (in-repo folder) or "hub"
    present: bool
    path: Path | None
    size_bytes: int


def _snapshot_size(folder: Path) -> int:
    """Bytes of a hub snapshot (its files are symlinks into blobs/)."""
    return sum(f.resolve().stat().st_size for f in folder.rglob("*") if f.is_file())


def hub_snapshot(repo: str) -> Path | None:
    """The cached snapshot folder of `repo` in the Hugging Face hub cache, or None (offline check)."""
    hit = try_to_load_from_cache(repo, "config.json")
    return Path(hit).parent if isinstance(hit, str) else None


def model_status(spec: str, cat: Catalog) -> ModelStatus:
    """Whether `spec` (a catalogue name or a hub repo id) is available locally, where, how big."""
    if spec in cat.models:
        entry = cat.model(spec)
        if entry.local is not None:
            ok = entry.available
            return ModelStatus(
                spec, "local", ok, entry.local, paths.dir_size(entry.local) if ok else 0
            )
        folder = cached(spec)
        return ModelStatus(
            spec, "catalogue", folder is not None, folder, paths.dir_size(folder) if folder else 0
        )
    snap = hub_snapshot(spec) if is_repo_id(spec) else None
    return ModelStatus(spec, "hub", snap is not None, snap, _snapshot_size(snap) if snap else 0)
