"""Pinned checkpoints without a network: the catalogue's revisions, locks, the checksum of every
file of a fresh snapshot, `edgespec models`' REVISION column and the per-pair mlx-lm floor.
Over HTTP, end to end: tests/loading/test_hub_http.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from edgespec.commands import models as models_cmd
from edgespec.errors import ConfigError, DownloadError, ModelNotFoundError
from edgespec.loading import locks
from edgespec.loading import specs as catalog
from edgespec.loading.hub import fetch_snapshot, git_blob_sha1, verify_snapshot
from edgespec.loading.specs import check_mlx_lm, check_pair
from tests.helpers.hub import REV, make_hub_cache
from tests.helpers.tiny import make_tiny_pair

ROOT = Path(__file__).resolve().parents[2]


def test_every_catalogue_revision_is_a_commit_of_an_id_the_catalogue_uses():
    cat = catalog.load_catalog()
    used = {m.hf_repo for m in cat.models.values() if m.hf_repo}
    used |= {p.target for p in cat.pairs.values()} | {p.draft for p in cat.pairs.values()}
    assert cat.revisions
    for repo, rev in cat.revisions.items():
        assert repo in used, f"{repo} is pinned but no pair or model uses it"
        assert re.fullmatch(r"[0-9a-f]{40}", rev.commit) and rev.source


def test_a_branch_name_is_not_a_pin():
    raw = {
        "pairs": {"p": {"target": "a/b", "draft": "c/d"}},
        "revisions": {"a/b": {"commit": "main"}},
    }
    with pytest.raises(ModelNotFoundError, match="a/b .*'main', not a 40-hex-digit commit id"):
        catalog.parse_catalog(raw, ROOT)


def test_gemma4_ids_as_published_and_their_mlx_lm_floor():
    cat = catalog.load_catalog()
    assert cat.pair("gemma4-12b").target == "mlx-community/gemma-4-12B-it-4bit"
    assert "gemma4_unified" in cat.pair("gemma4-12b").model_types  # mlx-lm PR #1349
    assert catalog.pair_floor(cat.pair("gemma4-12b").model_types, None) == (
        "0.32.0",
        "model_type gemma4_unified",
    )
    assert catalog.pair_floor(cat.pair("gemma4-31b").model_types, None)[0] == "0.31.2"


def test_an_older_mlx_lm_is_refused_in_one_line(monkeypatch):
    cat = catalog.load_catalog()
    with pytest.raises(ConfigError) as err:
        check_mlx_lm("gemma4-12b", cat, have="0.31.3")
    assert str(err.value).startswith(
        "pair 'gemma4-12b' needs mlx-lm >= 0.32.0 (model_type gemma4_unified); you have 0.31.3"
    )
    assert "\n" not in str(err.value)
    check_mlx_lm("gemma4-12b", cat, have="0.32.0")
    check_mlx_lm("gemma4-12b", cat, have="0.32.2.dev3")
    check_mlx_lm("gemma4-31b", cat, have="0.31.2")
    with pytest.raises(ConfigError, match=r"needs mlx-lm >= 0\.31\.3; you have 0\.31\.2"):
        check_mlx_lm("gemma4-31b-assistant", cat, have="0.31.2")  # its own min_mlx_lm
    check_mlx_lm("smollm2-135m", cat, have="0.22.0")
    monkeypatch.setattr("edgespec.loading.specs.version", lambda _: "0.31.1")
    with pytest.raises(ConfigError, match="needs mlx-lm >= 0.31.2 .*; you have 0.31.1"):
        check_pair(None, None, "gemma4-31b", catalog=cat)  # what commands call before imports


def _hub_snapshot(root: Path, files: dict[str, bytes], lfs: set[str]) -> Path:
    """A snapshot laid out as huggingface_hub does: links into blobs/ named by the Hub's ETag."""
    (root / "blobs").mkdir(parents=True)
    snap = root / "snapshots" / REV
    snap.mkdir(parents=True)
    for name, data in files.items():
        tmp = root / "blobs" / "tmp"
        tmp.write_bytes(data)
        etag = hashlib.sha256(data).hexdigest() if name in lfs else git_blob_sha1(tmp)
        tmp.rename(root / "blobs" / etag)
        os.symlink(os.path.relpath(root / "blobs" / etag, snap), snap / name)
    return snap


def test_git_blob_sha1_is_gits(tmp_path):
    f = tmp_path / "x"
    f.write_bytes(b"hello\n")
    assert git_blob_sha1(f) == "ce013625030ba8dba906f756967f9e9ca394464a"  # git hash-object


@pytest.mark.parametrize("bad", ["config.json", "model.safetensors"])
def test_a_file_that_does_not_hash_to_its_etag_is_removed(tmp_path, bad):
    files = {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"\0" * 64}
    snap = _hub_snapshot(tmp_path, files, {"model.safetensors"})
    verify_snapshot("org/x", snap)  # all good
    blob = (snap / bad).resolve()
    blob.write_bytes(blob.read_bytes()[:-1] + b"!")
    with pytest.raises(DownloadError, match=f"org/x@{REV[:12]}: {bad} does not match its checksum"):
        verify_snapshot("org/x", snap)
    assert not (snap / bad).exists() and not (snap / bad).is_symlink() and not blob.exists()
    other = ({"config.json", "model.safetensors"} - {bad}).pop()
    assert (snap / other).is_file()


def test_the_first_resolve_writes_a_lock_and_later_ones_ask_for_it(
    offline_hub, tmp_path, monkeypatch
):
    """Offline from a hub cache: the first fetch locks the commit main pointed at; moving main
    (another snapshot) changes nothing; a lock naming a commit not in the cache is one line."""
    target, _ = make_tiny_pair(tmp_path / "src")
    make_hub_cache(offline_hub, "org/Tiny", target)
    cat = catalog.parse_catalog({"pairs": {"p": {"target": "org/Tiny", "draft": "org/Tiny"}}}, ROOT)
    assert locks.pin("org/Tiny", cat) is None
    snap = fetch_snapshot("org/Tiny", cat)
    assert snap.name == REV
    record = json.loads(locks.lock_path("org/Tiny").read_text())
    assert record["commit"] == REV and record["pinned_by"] == "lock"
    assert locks.pin("org/Tiny", cat) == locks.Pin(REV, "lock")
    moved = "f" * 40
    (offline_hub / "models--org--Tiny" / "refs" / "main").write_text(moved)
    assert fetch_snapshot("org/Tiny", cat) == snap  # the lock, not main
    locks.write_lock("org/Tiny", "e" * 40, "lock")
    with pytest.raises(ModelNotFoundError, match=r"org/Tiny at eeeeeeeeeeee is not in the local"):
        fetch_snapshot("org/Tiny", cat)


def test_a_catalogue_pin_wins_over_a_lock_and_over_update(offline_hub, tmp_path):
    target, _ = make_tiny_pair(tmp_path / "src")
    make_hub_cache(offline_hub, "org/Tiny", target)
    raw = {
        "pairs": {"p": {"target": "org/Tiny", "draft": "org/Tiny"}},
        "revisions": {"org/Tiny": {"commit": REV, "source": "test"}},
    }
    cat = catalog.parse_catalog(raw, ROOT)
    locks.write_lock("org/Tiny", "e" * 40, "lock")
    assert fetch_snapshot("org/Tiny", cat, update=True).name == REV
    assert json.loads(locks.lock_path("org/Tiny").read_text())["pinned_by"] == "catalogue"


def test_models_shows_the_revision_each_hub_model_loads_at(offline_hub, capsys):
    models_cmd.run(type("A", (), {"json": True})())
    rows = {r["pair"]: r for r in json.loads(capsys.readouterr().out)}
    pin = catalog.load_catalog().revision("mlx-community/Qwen3-4B-4bit")
    assert pin is not None
    assert rows["qwen3-4b"]["target"]["revision"] == pin.commit
    assert rows["qwen3-4b"]["target"]["pinned_by"] == "catalogue"
    assert rows["qwen3-4b"]["target"]["pin"] == "pinned"
    models_cmd.run(type("A", (), {"json": False})())
    table = capsys.readouterr().out
    assert "REVISION" in table.splitlines()[0]
    assert f"pinned {pin.commit[:12]}" in table


# Hub ids for which public sources name no single commit (two commits, neither more often).
NO_PUBLIC_COMMIT = {"google/gemma-4-26B-A4B-it-assistant"}


def test_every_hub_id_with_a_public_commit_is_pinned():
    cat = catalog.load_catalog()
    used = {m.hf_repo for m in cat.models.values() if m.hf_repo}
    used |= {p.target for p in cat.pairs.values()} | {p.draft for p in cat.pairs.values()}
    hub = {r for r in used if r and catalog.is_repo_id(r)}
    assert hub - set(cat.revisions) == NO_PUBLIC_COMMIT
    dflash = cat.revision("z-lab/Qwen3-8B-DFlash-b16")
    assert dflash is not None and dflash.commit == "9b41424b7109f9c5413454f481b09a82b85333f4"


def test_models_says_pinned_locked_or_unpinned_per_id(offline_hub, capsys):
    """The one unpinned id reads "unpinned" until a first pull locks it, then "locked"."""
    repo = next(iter(NO_PUBLIC_COMMIT))

    def rows() -> dict[str, dict]:
        models_cmd.run(type("A", (), {"json": True})())
        return {r["pair"]: r for r in json.loads(capsys.readouterr().out)}

    assert rows()["gemma4-26b-a4b-assistant"]["draft"]["pin"] == "unpinned"
    assert rows()["gemma4-26b-a4b-assistant"]["target"]["pin"] == "pinned"
    assert rows()["smollm2-135m"]["draft"]["pin"] == "in repository"
    locks.write_lock(repo, "e" * 40, "lock")
    assert rows()["gemma4-26b-a4b-assistant"]["draft"]["pin"] == "locked"
    models_cmd.run(type("A", (), {"json": False})())
    assert f"locked {'e' * 12}" in capsys.readouterr().out
