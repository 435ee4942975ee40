"""`edgespec pull NAME` and `edgespec generate --pair NAME` end to end over HTTP, against a
stand-in Hub (tests/helpers/hub_server.py) that serves tiny checkpoints under the catalogue's
real repo ids, at the commits the catalogue pins. The real CLI runs as a subprocess with only
HF_ENDPOINT (and the caches) pointing elsewhere: nothing in the catalogue or the loading path
knows it is a test. Checked: pinned revisions against a moved branch, locks and --update, a
download cut half way and resumed with a Range request, an unknown repo (404), a corrupt file and
a short one: each failure one line, with nothing left in the caches that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgespec.loading.specs import load_catalog
from tests.helpers.block_models import write_dflash
from tests.helpers.hub_server import StandInHub
from tests.helpers.tiny_arch import make_family

ROOT = Path(__file__).resolve().parents[2]
TARGET, DRAFT = "mlx-community/Qwen3-4B-4bit", "mlx-community/Qwen3-0.6B-4bit"
# The draft of pair gemma4-26b-a4b-assistant: the one id without a catalogue revision (its
# target, pinned, is published here with the tiny target's files; `pull` only downloads).
UNPINNED, UNPINNED_PAIR = "google/gemma-4-26B-A4B-it-assistant", "gemma4-26b-a4b-assistant"
UNPINNED_TARGET = "mlx-community/gemma-4-26b-a4b-it-4bit"
DFLASH = "z-lab/Qwen3-4B-DFlash-b16"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny qwen3 families (so a moved branch has other weights) and a DFlash draft
    published as z-lab's are (no tokenizer files)."""
    root = tmp_path_factory.mktemp("tiny")
    target, draft = make_family(root / "a", "qwen3", seed=0)
    other, _ = make_family(root / "b", "qwen3", seed=7)
    dflash = write_dflash(target, root / "dflash")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (dflash / name).unlink(missing_ok=True)
    return {"target": target, "draft": draft, "other": other, "dflash": dflash}


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[StandInHub]:
    server = StandInHub().start()
    yield server
    server.stop()


def pinned(repo: str) -> str:
    rev = load_catalog().revision(repo)
    assert rev is not None, f"the catalogue pins no commit of {repo}"
    return rev.commit


def publish_pair(hub: StandInHub, tiny: dict[str, Path]) -> None:
    """The qwen3-4b pair at the catalogue's commits; each branch then moved to other weights."""
    hub.publish(TARGET, tiny["target"], commit=pinned(TARGET))
    hub.publish(DRAFT, tiny["draft"], commit=pinned(DRAFT))
    hub.publish(TARGET, tiny["other"])  # main moved on: a pin must not follow it


def edgespec(
    tmp: Path, hub: StandInHub, *args: str, offline: bool = False
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env |= {
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(tmp / "hf"),
        "HF_HUB_CACHE": str(tmp / "hf" / "hub"),
        "HF_HUB_OFFLINE": "1" if offline else "0",
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "EDGESPEC_HOME": str(tmp / "home"),
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.run(
        [sys.executable, "-m", "edgespec", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The process failed with a single stderr line and no traceback; return that line."""
    assert proc.returncode != 0, proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    return lines[0]


def lock(tmp: Path, repo: str) -> dict | None:
    file = tmp / "home" / "locks" / f"{repo.replace('/', '--')}.json"
    return json.loads(file.read_text()) if file.is_file() else None


def snapshots(tmp: Path, repo: str) -> list[str]:
    folder = tmp / "hf" / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def blobs(tmp: Path, repo: str) -> list[str]:
    folder = tmp / "hf" / "hub" / f"models--{repo.replace('/', '--')}" / "blobs"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def tokens(tmp: Path, hub: StandInHub, *args: str, offline: bool = False) -> list[int]:
    """The token ids `edgespec generate` answers a fixed prompt with, greedy."""
    proc = edgespec(tmp, hub, "generate", "hello world", "--json", "--temp", "0",
                    "--max-tokens", "12", *args, offline=offline)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    ids = [e["id"] for e in lines if e.get("type") == "token"]
    assert len(ids) == 12
    return ids


def revisions(tmp: Path, hub: StandInHub, pair: str) -> tuple[str | None, str | None]:
    proc = edgespec(tmp, hub, "models", "--json", offline=True)
    assert proc.returncode == 0, proc.stderr
    row = next(r for r in json.loads(proc.stdout) if r["pair"] == pair)
    return row["target"]["revision"], row["draft"]["revision"]


@pytest.mark.slow
def test_pull_then_generate_at_the_pinned_commits(tiny, hub, tmp_path):
    """`pull qwen3-4b` fetches both models at the catalogue's commits although main has moved,
    records them, and `generate --pair` then runs offline on exactly those snapshots."""
    publish_pair(hub, tiny)
    proc = edgespec(tmp_path, hub, "pull", "qwen3-4b", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert f"at {pinned(TARGET)} (catalogue)" in proc.stdout
    assert snapshots(tmp_path, TARGET) == [pinned(TARGET)]
    assert lock(tmp_path, TARGET)["commit"] == pinned(TARGET)  # type: ignore[index]
    assert not [r for r in hub.requests if "/revision/" in r[1]]  # a pin needs no branch lookup
    assert revisions(tmp_path, hub, "qwen3-4b") == (pinned(TARGET), pinned(DRAFT))
    spec = tokens(tmp_path, hub, "--pair", "qwen3-4b", offline=True)
    assert spec == tokens(tmp_path, hub, "--target", str(tiny["target"]), "--no-spec")
    assert spec != tokens(tmp_path, hub, "--target", str(tiny["other"]), "--no-spec")


@pytest.mark.slow
def test_an_unpinned_id_is_locked_until_update(tiny, hub, tmp_path):
    """An id the catalogue does not pin is locked at the commit the first pull got; a moved
    branch changes nothing until `pull --update`, which moves the lock and the snapshot."""
    first = hub.publish(UNPINNED, tiny["draft"])
    hub.publish(UNPINNED_TARGET, tiny["target"], commit=pinned(UNPINNED_TARGET))
    assert edgespec(tmp_path, hub, "pull", UNPINNED_PAIR, "--quiet").returncode == 0
    assert lock(tmp_path, UNPINNED)["commit"] == first  # type: ignore[index]
    moved = hub.publish(UNPINNED, tiny["other"])
    hub.requests.clear()
    again = edgespec(tmp_path, hub, "pull", UNPINNED_PAIR, "--quiet")
    assert again.returncode == 0, again.stderr
    assert f"at {first} (lock)" in again.stdout
    assert not [r for r in hub.requests if "/revision/" in r[1]]  # the lock, not main
    assert snapshots(tmp_path, UNPINNED) == [first]
    upd = edgespec(tmp_path, hub, "pull", UNPINNED_PAIR, "--update", "--quiet")
    assert upd.returncode == 0, upd.stderr
    assert f"at {moved} (lock)" in upd.stdout
    assert lock(tmp_path, UNPINNED)["commit"] == moved  # type: ignore[index]
    assert revisions(tmp_path, hub, UNPINNED_PAIR)[1] == moved


@pytest.mark.slow
def test_a_cut_download_resumes_with_a_range_request(tiny, hub, tmp_path):
    """The connection drops near the end of a file: huggingface_hub asks for the rest with a
    Range request (it keeps what it got in whole 10 MB chunks, so the file here is 14 MB: a
    model card beside the weights) and the snapshot ends up byte-identical."""
    card = tmp_path / "published"
    shutil.copytree(tiny["target"], card)
    text = b"".join(b"line %d of a long model card\n" % i for i in range(440_000))
    (card / "README.md").write_bytes(text)
    hub.publish(TARGET, card, commit=pinned(TARGET))
    hub.publish(DRAFT, tiny["draft"], commit=pinned(DRAFT))
    hub.faults[(TARGET, "README.md")] = "cut"
    proc = edgespec(tmp_path, hub, "pull", "qwen3-4b", "--quiet")
    assert proc.returncode == 0, proc.stderr
    ranges = [r for r in hub.gets("README.md") if r]
    assert ranges and all(r.startswith("bytes=") and not r.startswith("bytes=0-") for r in ranges)
    snap = tmp_path / "hf" / "hub" / "models--mlx-community--Qwen3-4B-4bit" / "snapshots"
    assert (snap / pinned(TARGET) / "README.md").read_bytes() == text
    assert lock(tmp_path, TARGET)["commit"] == pinned(TARGET)  # type: ignore[index]


@pytest.mark.slow
def test_an_unknown_repo_is_one_line_and_leaves_nothing(hub, tmp_path):
    """Pair qwen2.5-7b's repos are not on this hub: a 404, one line, no lock, no snapshot."""
    line = one_line_error(edgespec(tmp_path, hub, "pull", "qwen2.5-7b", "--quiet"))
    assert "mlx-community/Qwen2.5-7B-Instruct-4bit" in line and "does not exist" in line
    assert lock(tmp_path, "mlx-community/Qwen2.5-7B-Instruct-4bit") is None
    assert snapshots(tmp_path, "mlx-community/Qwen2.5-7B-Instruct-4bit") == []


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["corrupt", "short"])
def test_a_bad_file_is_one_line_and_removed(tiny, hub, tmp_path, fault):
    """A file whose bytes do not hash to the sha256 the Hub advertised (corrupt), or that ends
    early (short): one line naming it, no lock, no blob or partial file left behind; the next
    pull, once the file is served right, completes."""
    publish_pair(hub, tiny)
    hub.faults[(TARGET, "model.safetensors")] = fault
    line = one_line_error(edgespec(tmp_path, hub, "pull", "qwen3-4b", "--quiet"))
    assert TARGET in line
    assert ("does not match its checksum" in line) if fault == "corrupt" else ("size" in line)
    assert lock(tmp_path, TARGET) is None
    weights = (tiny["target"] / "model.safetensors").read_bytes()
    sha = hashlib.sha256(weights).hexdigest()
    assert not [b for b in blobs(tmp_path, TARGET) if b.startswith(sha) or "incomplete" in b]
    del hub.faults[(TARGET, "model.safetensors")]
    proc = edgespec(tmp_path, hub, "pull", "qwen3-4b", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert lock(tmp_path, TARGET)["commit"] == pinned(TARGET)  # type: ignore[index]


@pytest.mark.slow
def test_a_dflash_pair_over_http(tiny, hub, tmp_path):
    """qwen3-4b-dflash: z-lab's block draft (no tokenizer of its own) at its pinned commit,
    pulled and run as a block draft."""
    publish_pair(hub, tiny)
    hub.publish(DFLASH, tiny["dflash"], commit=pinned(DFLASH))
    proc = edgespec(tmp_path, hub, "pull", "qwen3-4b-dflash", "--quiet")
    assert proc.returncode == 0, proc.stderr
    spec = tokens(tmp_path, hub, "--pair", "qwen3-4b-dflash", "--method", "block", offline=True)
    assert spec == tokens(tmp_path, hub, "--target", str(tiny["target"]), "--no-spec")
