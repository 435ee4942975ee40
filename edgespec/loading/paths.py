"""Where EdgeSpec keeps what it downloads or converts, and how a cache entry is written atomically.

Layout under the home (``$EDGESPEC_HOME``, default ``~/.cache/edgespec``):
    models/<name>/            a converted, ready-to-load MLX model folder (one per catalogue name)
    gguf/<sha256[:16]>/       a user's *.gguf converted once, keyed by the file's hash
    converted/<name>-<hash>/  a checkpoint's MTP head converted once
                              (edgespec/loading/mtp_checkpoint.py)
    calibration/              adaptive K's measured costs per pair (edgespec/calibration.py)

A cache entry either exists completely or not at all: it is built in a temp folder beside its
destination and renamed into place only when everything is written (`atomic_dir`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

HOME_ENV = "EDGESPEC_HOME"


def home() -> Path:
    """EdgeSpec's cache root: ``$EDGESPEC_HOME`` if set, else ``~/.cache/edgespec``."""
    env = os.environ.get(HOME_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "edgespec"


def models_dir() -> Path:
    """Folder of converted catalogue models (``<home>/models``)."""
    return home() / "models"


def model_dir(name: str) -> Path:
    """The cache folder of one named model, e.g. ``<home>/models/smollm2-135m-instruct``."""
    return models_dir() / name


def gguf_cache_dir(sha256: str) -> Path:
    """The cache folder of a user-supplied GGUF file, keyed by the first 16 hex digits of its hash."""
    return home() / "gguf" / sha256[:16]


def dir_size(path: Path) -> int:
    """Total bytes of the regular files under `path` (0 if it does not exist)."""
    if not path.exists():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


@contextlib.contextmanager
def atomic_dir(dest: Path, *, replace: bool = False) -> Iterator[Path]:
    """Yield an empty temp folder beside `dest`; on success rename it to `dest`, on any failure
    (exception or KeyboardInterrupt) delete it, so `dest` is never half-written.

    If `dest` already exists when the block finishes, `replace=True` swaps the new copy in (the old
    one is moved aside first, then deleted); otherwise (another process won the race) the new copy
    is discarded and the existing one kept.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; a cache entry should look like any folder
        yield tmp
        if replace and dest.exists():
            old = dest.with_name(f".{dest.name}.old-{tmp.name[-8:]}")
            os.replace(dest, old)
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
            return
        try:
            os.replace(tmp, dest)
        except OSError:
            if not dest.exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


SOURCE_FILE = "edgespec-source.json"  # written last: its presence marks a complete entry


def is_complete(folder: Path) -> bool:
    """A cache entry is complete when its provenance file, config and weights are all there."""
    return (
        (folder / SOURCE_FILE).is_file()
        and (folder / "config.json").is_file()
        and any(folder.glob("*.safetensors"))
    )


def cached(name: str) -> Path | None:
    """The complete cache folder of catalogue model `name`, or None."""
    folder = model_dir(name)
    return folder if is_complete(folder) else None
