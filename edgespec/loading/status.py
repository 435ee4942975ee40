"""What is on this machine for a model spec: a catalogue model pulled into EdgeSpec's cache, an
in-repo folder, or a Hugging Face hub snapshot (no network is touched)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import try_to_load_from_cache

from edgespec.loading import paths
from edgespec.loading.locks import pin, read_lock
from edgespec.loading.paths import SOURCE_FILE, cached
from edgespec.loading.specs import Catalog, is_repo_id


@dataclass(frozen=True)
class ModelStatus:
    """What is on this machine for one model spec (no network is touched)."""

    spec: str
    kind: str  # "catalogue" (pulled into EdgeSpec's cache), "local" (in-repo folder) or "hub"
    present: bool
    path: Path | None
    size_bytes: int
    revision: str | None = None  # the commit it loads at (a hub repo), None if not pinned yet
    pinned_by: str | None = None  # "catalogue", "lock" or (a pulled folder) where it came from
    pin: str = "-"  # its Hub repo's commit: "pinned" (catalogue), "locked" (first pull), "unpinned"


def _snapshot_size(folder: Path) -> int:
    """Bytes of a hub snapshot (its files are symlinks into blobs/)."""
    return sum(f.resolve().stat().st_size for f in folder.rglob("*") if f.is_file())


def hub_snapshot(repo: str, revision: str | None = None) -> Path | None:
    """The cached snapshot folder of `repo` (at `revision`, else its default branch) in the
    Hugging Face hub cache, or None (offline check)."""
    hit = try_to_load_from_cache(repo, "config.json", revision=revision)
    return Path(hit).parent if isinstance(hit, str) else None


def _pulled_from(folder: Path) -> tuple[str | None, str | None]:
    """(commit, "pull") of a pulled folder fetched from the Hub; (None, "pypi:...") for a wheel."""
    try:
        source = str(json.loads((folder / SOURCE_FILE).read_text()).get("source", ""))
    except (OSError, ValueError, AttributeError):
        return None, None
    if source.startswith("hf:") and "@" in source:
        return source.rsplit("@", 1)[1], "pull"
    return None, source or None


def pin_state(repo: str, cat: Catalog) -> str:
    """ "pinned" (the catalogue names its commit), "locked" (the first download recorded one,
    loading/locks.py) or "unpinned" (the next download takes the default branch)."""
    if cat.revision(repo) is not None:
        return "pinned"
    return "locked" if read_lock(repo) is not None else "unpinned"


def model_status(spec: str, cat: Catalog) -> ModelStatus:
    """Whether `spec` (a catalogue name or a hub repo id) is available locally, where, how big."""
    if spec in cat.models:
        entry = cat.model(spec)
        if entry.local is not None:
            ok = entry.available
            size = paths.dir_size(entry.local) if ok else 0
            return ModelStatus(spec, "local", ok, entry.local, size, pin="in repository")
        held = pin(entry.hf_repo, cat) if entry.hf_repo else None
        state = pin_state(entry.hf_repo, cat) if entry.hf_repo else "pinned"  # a wheel: sha256
        folder = cached(spec)
        if folder is None:
            commit = held.commit if held is not None else None
            return ModelStatus(spec, "catalogue", False, None, 0, commit, pin=state)
        commit, by = _pulled_from(folder)
        if by is not None and by.startswith("pypi:"):  # built from the wheel its sha256 pins
            state = "pinned"
        size = paths.dir_size(folder)
        return ModelStatus(spec, "catalogue", True, folder, size, commit, by, state)
    if not is_repo_id(spec):
        return ModelStatus(spec, "hub", False, None, 0)
    held = pin(spec, cat)
    commit = held.commit if held is not None else None
    snap = hub_snapshot(spec, commit)
    size = _snapshot_size(snap) if snap else 0
    by = held.by if held is not None else None
    state = pin_state(spec, cat)
    return ModelStatus(spec, "hub", snap is not None, snap, size, commit, by, state)
