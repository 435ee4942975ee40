"""Resolve a model spec to a local folder. A spec is, in this order: a local folder, a local *.gguf
file (converted once into the cache, keyed by its hash), a catalogue model name (pulled if
needed), or a Hugging Face repo id (the hub cache at its pinned commit, loading/hub.py;
HF_HUB_OFFLINE respected).
Which of these a spec is, and the refusals that need no download or conversion: loading/specs.py.
"""

from __future__ import annotations

from pathlib import Path

from edgespec.errors import ModelLoadError
from edgespec.loading import ProgressFn, paths, report
from edgespec.loading.specs import Catalog, load_catalog, spec_kind


def resolve_model(
    spec: str,
    *,
    on_progress: ProgressFn | None = None,
    catalog: Catalog | None = None,
    update: bool = False,
) -> Path:
    """Turn a spec into a local model folder (downloading / converting once if needed); what it
    names, or that it names nothing, is decided by `spec_kind` first (loading/specs.py). A hub
    repo loads at its pinned commit (loading/locks.py); update=True moves an unpinned one to its
    latest commit."""
    kind = spec_kind(spec, catalog)
    if kind == "folder":
        return Path(spec).expanduser()
    if kind == "gguf":
        return _resolve_gguf(Path(spec).expanduser(), on_progress)
    if kind == "catalogue":
        return _resolve_catalogue(spec, catalog or load_catalog(), on_progress, update)
    report(on_progress, f"fetching {spec} from Hugging Face")
    return _resolve_hf(spec, catalog, update)


def _resolve_gguf(path: Path, on_progress: ProgressFn | None) -> Path:
    from edgespec.files import sha256_file

    report(on_progress, f"hashing {path.name}")
    digest = sha256_file(path)
    out = paths.gguf_cache_dir(digest)
    if not (out / "config.json").is_file():
        report(on_progress, f"converting {path.name} to MLX (once)")
        from edgespec.loading.gguf import convert_gguf  # only for a .gguf file

        try:
            convert_gguf(path, out, sha256=digest)
        except OSError as e:
            raise ModelLoadError(f"cannot convert {path}: {e.strerror or e}") from None
    return out


def _resolve_catalogue(
    name: str, cat: Catalog, on_progress: ProgressFn | None, update: bool
) -> Path:
    """An in-repo folder as it is (`spec_kind` checked it exists), else pulled into the cache."""
    entry = cat.model(name)
    if entry.local is not None:
        return entry.local
    hit = None if update else paths.cached(name)
    if hit is not None:  # already pulled: nothing of loading/download.py is needed
        report(on_progress, "cached", 1.0)
        return hit
    from edgespec.loading.download import pull

    return pull(name, on_progress=on_progress, catalog=cat, update=update)


def _resolve_hf(repo: str, cat: Catalog | None, update: bool) -> Path:
    """The hub snapshot at the repo's pinned commit (loading/hub.py); one-line typed errors."""
    from edgespec.loading.hub import fetch_snapshot  # only for a hub repo id

    return fetch_snapshot(repo, cat or load_catalog(), update=update)
