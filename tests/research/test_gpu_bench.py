"""research/recipes/gpu_bench.py: the archive `pack` cuts into pieces is the one `run` joins,
installs and benches from, without the network (wheels from a local folder) and without a GPU;
a missing piece, missing or wrong target weights, and where MLX's CUDA library finds CUDA."""

from __future__ import annotations

import importlib
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from research.recipes import gpu_bench

pytestmark = pytest.mark.slow  # pack builds EdgeSpec's wheel and carries the research drafts


def fake_wheel(folder: Path, spec: str) -> None:
    """A valid wheel of `name==version` holding metadata only (nothing to import)."""
    name, version = spec.split("==")
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{dist}-{version}-py3-none-any.whl", "w") as whl:
        for path, text in files.items():
            whl.writestr(path, text)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    """pack's pieces (weights left out) from fake wheels and a small target folder: the pieces'
    folder, the weights left out, pack's arguments."""
    root = tmp_path_factory.mktemp("pack")
    links = root / "links"
    links.mkdir()
    for spec in gpu_bench.wheels_wanted(""):
        if "==" not in spec:  # not installed here: pin a version for the fake
            spec += "==1.0"
        fake_wheel(links, spec)
    target = root / "target"
    target.mkdir()
    (target / "config.json").write_text('{"model_type": "llama"}')
    (target / "model.safetensors").write_bytes(b"weights" * 1000)
    out = root / "pieces"
    args = ["pack", "--out", str(out), "--target", str(target), "--piece-mb", "15"]
    args += ["--cuda", "", "--find-links", str(links), "--skip-weights"]
    args += ["--python", f"{sys.version_info.major}.{sys.version_info.minor}"]
    assert gpu_bench.main(args) == 0
    return out, target / "model.safetensors", args


def test_run_joins_installs_and_benches_from_the_pieces(packed, tmp_path, capfd):
    pieces, weights, pack_args = packed
    assert len(list(pieces.glob("bench.tar.[0-9]*"))) >= 3  # the wheel and drafts: about 40 MB
    work = tmp_path / "gb"
    args = ["run", "--pieces", str(pieces), "--work", str(work), "--weights", str(weights)]
    assert gpu_bench.main([*args, "--", "--help"]) == 0
    out = capfd.readouterr().out
    assert str(work / "site" / "edgespec") in out  # the wheel's EdgeSpec, not a source folder
    assert "usage: edgespec bench" in out
    installed = {p.name.split("-")[0] for p in (work / "site").glob("*.dist-info")}
    assert {"edgespec", "mlx", "mlx_lm", "mlx_cpu", "textual"} <= installed
    placed = work / "stage" / "home" / "models" / "target" / "model.safetensors"
    assert placed.resolve() == weights.resolve()
    # the research drafts, out of the wheel, where the installed package looks for them
    drafts = work / "site" / "edgespec" / "research"
    assert (drafts / "block_draft" / "smollm2-135m-block" / "model.safetensors").is_file()


def test_pack_again_replaces_its_pieces_and_nothing_else(packed, tmp_path):
    pieces, weights, pack_args = packed
    again = tmp_path / "again"
    again.mkdir()
    for p in pieces.iterdir():
        (again / p.name).write_bytes(p.read_bytes())
    (again / "notes.txt").write_text("mine")
    args = list(pack_args)
    args[args.index("--out") + 1], args[args.index("--piece-mb") + 1] = str(again), "100"
    assert gpu_bench.main(args) == 0
    assert sorted(p.name for p in again.iterdir()) == [
        "bench.tar.000",
        "bench.tar.sha256",
        "notes.txt",
    ]
    assert (gpu_bench.join(again, tmp_path / "w", str(weights)) / "wheels").is_dir()


def test_a_missing_piece_is_refused(packed, tmp_path):
    pieces, weights, pack_args = packed
    partial = tmp_path / "partial"
    partial.mkdir()
    for p in sorted(pieces.iterdir())[1:]:  # all but the first piece
        (partial / p.name).write_bytes(p.read_bytes())
    with pytest.raises(SystemExit, match="sha256 is not"):
        gpu_bench.join(partial, tmp_path / "w", str(weights))


def test_weights_left_out_must_be_given_and_be_the_same(packed, tmp_path):
    pieces, weights, pack_args = packed
    with pytest.raises(SystemExit, match="give --weights"):
        gpu_bench.join(pieces, tmp_path / "a", None)
    other = tmp_path / "other.safetensors"
    other.write_bytes(b"other weights")
    with pytest.raises(SystemExit, match="is not the model.safetensors"):
        gpu_bench.join(pieces, tmp_path / "b", str(other))


def test_cuda_libraries_come_from_the_machines_nvidia_wheels(tmp_path, monkeypatch):
    for lib in ("cublas", "cu13"):
        (tmp_path / "nvidia" / lib / "lib").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.delitem(sys.modules, "nvidia", raising=False)
    env = {"LD_LIBRARY_PATH": "/old"}
    gpu_bench._cuda_env(env)
    paths = env["LD_LIBRARY_PATH"].split(":")
    assert str(tmp_path / "nvidia" / "cublas" / "lib") in paths
    assert str(tmp_path / "nvidia" / "cu13" / "lib") in paths
    assert paths[-1] == "/old"


def test_wheels_wanted_pin_what_is_installed():
    wanted = gpu_bench.wheels_wanted("13")
    assert f"mlx=={metadata.version('mlx')}" in wanted
    assert f"mlx-cuda-13=={metadata.version('mlx')}" in wanted
    assert f"mlx-lm=={metadata.version('mlx-lm')}" in wanted
