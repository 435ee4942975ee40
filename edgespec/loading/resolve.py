"""Resolve a model spec to a local folder. A spec is, in this order: a local folder, a local *.gguf
file (converted once into the cache, keyed by its hash), a catalogue model name (pulled if
needed), or a Hugging Face repo id (hub cache via snapshot_download; HF_HUB_OFFLINE respected).
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.constants import is_offline_mode
from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError

from edgespec.errors import DownloadError, ModelLoadError, ModelNotFoundError, one_line
from edgespec.files import sha256_file
from edgespec.loading import paths
from edgespec.loading.catalog import Catalog, is_repo_id, load_catalog
from edgespec.loading.gguf import convert_gguf
from edgespec.loading.progress import ProgressFn, report
from edgespec.loading.pull import pull

_HF_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken", "LICENSE*"]


def resolve_model(
    spec: str, *, on_progress: ProgressFn | None = None, catalog: Catalog | None = None
) -> Path:
    """Turn a spec into a local model folder (downloading / converting once if needed)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} has no config.json (not a model folder)")
        return path
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return _resolve_gguf(path, on_progress)
        raise ModelLoadError(f"{path} is a file but not a .gguf model (pass a model folder)")
    cat = catalog or load_catalog()
    if spec in cat.models:
        return _resolve_catalogue(spec, cat, on_progress)
    if is_repo_id(spec):
        return _resolve_hf(spec, on_progress)
    raise ModelNotFoundError(
        f"model {spec!r} not found: not a folder, .gguf file, catalogue name or Hugging Face repo id"
    )


def _resolve_gguf(path: Path, on_progress: ProgressFn | None) -> Path:
    report(on_progress, f"hashing {path.name}")
    digest = sha256_file(path)
    out = paths.gguf_cache_dir(digest)
    if not (out / "config.json").is_file():
        report(on_progress, f"converting {path.name} to MLX (once)")
        try:
            convert_gguf(path, out, sha256=digest)
        except OSError as e:
            raise ModelLoadError(f"cannot convert {path}: {e.strerror or e}") from None
    return out


def _resolve_catalogue(name: str, cat: Catalog, on_progress: ProgressFn | None) -> Path:

    entry = cat.model(name)
    if entry.local is not None:
        if not entry.available:
            raise ModelNotFoundError(
                f"catalogue model {name!r} is not available yet ({entry.local} has no config.json)"
            )
        return entry.local
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
