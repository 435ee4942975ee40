"""Resolve a model spec to a local folder. A spec is, in this order: a local folder, a local *.gguf
file (converted once into the cache, keyed by its hash), a catalogue model name (pulled if
needed), or a Hugging Face repo id (hub cache via snapshot_download; HF_HUB_OFFLINE respected).
Which of these a spec is, and the refusals that need no download or conversion: loading/specs.py.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.constants import is_offline_mode
from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError

from edgespec.errors import DownloadError, ModelLoadError, ModelNotFoundError, one_line
from edgespec.loading import ProgressFn, paths, report
from edgespec.loading.specs import Catalog, load_catalog, spec_kind

_HF_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken", "LICENSE*"]


def resolve_model(
    spec: str, *, on_progress: ProgressFn | None = None, catalog: Catalog | None = None
) -> Path:
    """Turn a spec into a local model folder (downloading / converting once if needed); what it
    names, or that it names nothing, is decided by `spec_kind` first (loading/specs.py)."""
    kind = spec_kind(spec, catalog)
    if kind == "folder":
        return Path(spec).expanduser()
    if kind == "gguf":
        return _resolve_gguf(Path(spec).expanduser(), on_progress)
    if kind == "catalogue":
        return _resolve_catalogue(spec, catalog or load_catalog(), on_progress)
    return _resolve_hf(spec, on_progress)


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


def _resolve_catalogue(name: str, cat: Catalog, on_progress: ProgressFn | None) -> Path:
    """An in-repo folder as it is (`spec_kind` checked it exists), else pulled into the cache."""
    entry = cat.model(name)
    if entry.local is not None:
        return entry.local
    hit = paths.cached(name)
    if hit is not None:  # already pulled: nothing of loading/pull.py is needed
        report(on_progress, "cached", 1.0)
        return hit
    from edgespec.loading.pull import pull

    return pull(name, on_progress=on_progress, catalog=cat)


def _resolve_hf(repo: str, on_progress: ProgressFn | None) -> Path:
    """snapshot_download from the hub cache or the network; errors become one-line typed errors."""
    report(on_progress, f"fetching {repo} from Hugging Face")
    offline = is_offline_mode()
    try:
        return Path(snapshot_download(repo, allow_patterns=_HF_PATTERNS))
    except RepositoryNotFoundError:
        raise ModelNotFoundError(
            f"Hugging Face repo {repo!r} does not exist (or is private)"
        ) from None
    except LocalEntryNotFoundError as e:
        if offline:
            raise ModelNotFoundError(
                f"{repo} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set"
            ) from None
        raise DownloadError(f"cannot download {repo} from Hugging Face: {one_line(e)}") from None
    except KeyboardInterrupt:
        raise DownloadError(f"download of {repo} interrupted") from None
    except Exception as e:  # network, disk, permission
        raise DownloadError(f"cannot download {repo} from Hugging Face: {one_line(e)}") from None
