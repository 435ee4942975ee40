"""Which commit of a Hugging Face repo EdgeSpec loads: the catalogue's pin, else the lock that the
first download wrote (as Ollama's manifests and uv's lock do), so an id means the same weights
until `edgespec pull NAME --update` moves it.

A lock is `<home>/locks/<org>--<name>.json`:
    {"repo": "mlx-community/Qwen3-4B-4bit", "commit": "<40 hex>", "pinned_by": "lock",
     "resolved_at": "2026-11-29T01:00:00"}
It is written (atomically) only after a snapshot was downloaded completely and its files matched
their checksums (loading/hub.py). No network is touched here.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from edgespec.loading import paths
from edgespec.loading.specs import Catalog

COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Pin:
    """The commit a repo id is held at, and by what: "catalogue" (models/catalog.json) or
    "lock" (recorded by the first download)."""

    commit: str
    by: str


def lock_path(repo: str) -> Path:
    """The lock file of hub repo `repo` (`<home>/locks/<org>--<name>.json`)."""
    return paths.home() / "locks" / f"{repo.replace('/', '--')}.json"


def read_lock(repo: str) -> str | None:
    """The commit recorded for `repo`, or None (no lock, or one that is not a commit id)."""
    try:
        raw = json.loads(lock_path(repo).read_text())
    except (OSError, ValueError):
        return None
    commit = raw.get("commit") if isinstance(raw, dict) else None
    return commit if isinstance(commit, str) and COMMIT.fullmatch(commit) else None


def write_lock(repo: str, commit: str, pinned_by: str) -> None:
    """Record `commit` for `repo`, replacing any earlier lock in one rename."""
    file = lock_path(repo)
    file.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "repo": repo,
        "commit": commit,
        "pinned_by": pinned_by,
        "resolved_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    fd, tmp = tempfile.mkstemp(prefix=f".{file.name}.", dir=file.parent)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, file)


def pin(repo: str, cat: Catalog) -> Pin | None:
    """The commit `repo` loads at: the catalogue's revision, else the lock's, else None."""
    published = cat.revision(repo)
    if published is not None:
        return Pin(published.commit, "catalogue")
    locked = read_lock(repo)
    return Pin(locked, "lock") if locked is not None else None
