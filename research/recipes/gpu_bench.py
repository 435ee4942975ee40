"""One prepared `edgespec bench` run on a lent NVIDIA GPU, on MLX's CUDA backend.

The GPU machine has Python, NumPy, transformers and PyTorch but no MLX, no mlx-lm, no network,
and a call carries at most 64 MiB. So everything the bench needs besides what the machine has
travels as one archive in pieces (`pack`, here): EdgeSpec as a wheel (the token draft inside),
the research drafts of the catalogue (EAGLE, EAGLE-3, block: not in the wheel), the wheels of MLX, its CUDA 13 backend, mlx-lm and Textual (with the few of Textual's needs the
machine lacks), and the target's folder as `edgespec pull` left it. On the machine, `run` joins
the pieces, checks the archive's sha256, installs the wheels into a folder of their own, puts the
research drafts where the installed package looks for them (a clone's layout), and runs
`edgespec bench` with EDGESPEC_HOME pointing at the carried target (`--out` under $OUT).

Only the standard library is used by `run`, so it works with the machine's own python3. The
calls to make are printed by `pack`; research/README.md tells the rest (which tracked files to
leave behind so that a piece fits).

    python -m research.recipes.gpu_bench pack --out .gpucarry/bench          # here
    python3 research/recipes/gpu_bench.py run --pieces .gpucarry/bench \\
        --work /tmp/gb -- --pair smollm2-135m-block --temp 0,0.7 ...          # on the GPU
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

# The machine's image lacks these (textual's needs beside rich, pygments, typing-extensions and
# markdown-it-py, which it has). Versions: the ones installed here, else the newest.
EXTRA = ("mdit-py-plugins", "linkify-it-py", "uc-micro-py", "platformdirs")
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 27, 28, 31, 34, 35, 39)]
PLATFORMS += ["manylinux2014_x86_64", "linux_x86_64"]
ARCHIVE = "bench.tar"
# What the wheel's copy of the tree leaves behind: tests/project/test_wheel.py's list (build
# outputs, caches, work folders such as .dev/ and .gpucarry/), and the folders no wheel holds.
LEFT_BEHIND = (".git", "build", "dist", "*.egg-info", "__pycache__", ".*cache", ".venv", ".dev")
LEFT_BEHIND += ("bench-out", "runs", ".whl", ".gpucarry", ".gl", ".benchmarks")
LEFT_BEHIND += ("research", "tests", "docs")
WEIGHTS_SUM = "model.safetensors.sha256"  # in the target's folder, where its weights stayed behind


def sha256(path: Path) -> str:
    """edgespec.files.sha256_file's twin: `run` has the standard library only (no EdgeSpec yet)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(names: list[str], dest: Path, python: str, find_links: str | None) -> None:
    """Wheels of `names` (name==version) for CPython `python` on Linux x86-64, no dependencies."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", python, "--implementation", "cp", "-d", str(dest)]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    if find_links:
        cmd += ["--no-index", "--find-links", find_links]
    subprocess.run(cmd + names, check=True)


def wheels_wanted(cuda: str) -> list[str]:
    """name==version of every wheel to carry, at the versions installed here."""
    mlx = metadata.version("mlx")
    names = [f"mlx=={mlx}", f"mlx-lm=={metadata.version('mlx-lm')}"]
    if cuda:
        names.append(f"mlx-cuda-{cuda}=={mlx}")
    else:  # a dry run on a CPU machine
        names.append(f"mlx-cpu=={mlx}")
    names.append(f"textual=={metadata.version('textual')}")
    names += [_pinned(name) for name in EXTRA]
    return names


def _pinned(name: str) -> str:
    """name==the version installed here, or name (the newest) where it is not installed."""
    for spelling in (name, name.replace("-", "_")):
        try:
            return f"{name}=={metadata.version(spelling)}"
        except metadata.PackageNotFoundError:
            continue
    return name


def cmd_pack(a: argparse.Namespace) -> int:
    from edgespec.loading.paths import model_dir
    from edgespec.loading.specs import load_catalog  # here only: `run` has no EdgeSpec

    root = Path(__file__).resolve().parents[2]
    target = Path(a.target) if a.target else model_dir(a.target_name)
    if not (target / "config.json").is_file():
        sys.exit(f"gpu_bench: no target at {target} (run `edgespec pull {a.target_name}`)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{ARCHIVE}.*"):  # an earlier pack's pieces, and only those
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp) / "stage"
        wheels = stage / "wheels"
        wheels.mkdir(parents=True)
        # From a copy: a build/ folder left in the tree would put stale modules in the wheel.
        src = Path(tmp) / "src"
        shutil.copytree(root, src, ignore=shutil.ignore_patterns(*LEFT_BEHIND))
        pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(src), "-w", str(wheels)]
        if subprocess.run([*pip, "--no-build-isolation"]).returncode != 0:  # setuptools < 77
            subprocess.run(pip, check=True)
        download(wheels_wanted(a.cuda), wheels, a.python, a.find_links)
        for entry in load_catalog(root / "models" / "catalog.json").models.values():
            if entry.research is not None and entry.local is not None and entry.available:
                shutil.copytree(entry.local, stage / "research" / entry.research)
        folder = stage / "home" / "models" / target.name
        skip = ("model.safetensors",) if a.skip_weights else ()
        shutil.copytree(target, folder, ignore=lambda _d, names: [n for n in names if n in skip])
        if a.skip_weights:  # `run --weights` brings them: the training calls carried them
            (folder / WEIGHTS_SUM).write_text(sha256(target / "model.safetensors") + "\n")
        archive = Path(tmp) / ARCHIVE
        with tarfile.open(archive, "w") as tar:
            tar.add(stage, arcname=".")
        digest, size = sha256(archive), archive.stat().st_size
        piece = int(a.piece_mb * 1e6)
        with open(archive, "rb") as f:
            for i in range(0, size, piece):
                (out / f"{ARCHIVE}.{i // piece:03d}").write_bytes(f.read(piece))
    (out / f"{ARCHIVE}.sha256").write_text(f"{digest}  {ARCHIVE}\n")
    pieces = sorted(p.name for p in out.glob(f"{ARCHIVE}.[0-9]*"))
    print(f"{size / 1e6:.1f} MB in {len(pieces)} pieces of at most {a.piece_mb} MB: {out}")
    for i, name in enumerate(pieces):
        last = i == len(pieces) - 1
        carry = [str(out / name)] + ([str(out / f"{ARCHIVE}.sha256")] if last else [])
        print(f"call {i + 1}: carry {carry}" + ("  command: gpu_bench.py run ..." if last else ""))
    return 0


def join(pieces_dir: Path, work: Path, weights: str | None) -> Path:
    """The pieces joined (sha256 checked) and unpacked under `work`; the target's weights linked
    in where `pack --skip-weights` left them out. Returns the unpacked folder."""
    pieces = sorted(pieces_dir.glob(f"{ARCHIVE}.[0-9]*"))
    if not pieces:
        sys.exit(f"gpu_bench: no pieces in {pieces_dir}")
    work.mkdir(parents=True, exist_ok=True)
    archive = work / ARCHIVE
    with open(archive, "wb") as f:
        for p in pieces:
            f.write(p.read_bytes())
    want = (pieces_dir / f"{ARCHIVE}.sha256").read_text().split()[0]
    if sha256(archive) != want:
        sys.exit(f"gpu_bench: the joined archive's sha256 is not {want} (a piece is missing?)")
    stage = work / "stage"
    if stage.exists():
        shutil.rmtree(stage)
    with tarfile.open(archive) as tar:
        tar.extractall(stage, filter="data")
    archive.unlink()
    for folder in (stage / "home" / "models").iterdir():
        if (folder / WEIGHTS_SUM).is_file():
            _place_weights(folder, weights)
    return stage


def cmd_run(a: argparse.Namespace) -> int:
    work = Path(a.work)
    stage, site = join(Path(a.pieces), work, a.weights), work / "site"
    wheels = sorted(str(w) for w in (stage / "wheels").glob("*.whl"))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    subprocess.run(pip + ["--no-compile", "--upgrade", "--target", str(site)] + wheels, check=True)
    research = site / "edgespec" / "research"  # where the package finds research drafts (a clone)
    if (stage / "research").is_dir() and not research.exists():
        research.symlink_to(stage / "research", target_is_directory=True)
    env = dict(os.environ, PYTHONPATH=str(site), EDGESPEC_HOME=str(stage / "home"))
    env.setdefault("EDGESPEC_BLAS", "system")  # no BLAS to preload there: the GPU does the work
    env["PYTHONUNBUFFERED"] = "1"
    _cuda_env(env)
    args = a.bench[1:] if a.bench[:1] == ["--"] else a.bench
    check = "import mlx.core as mx, edgespec; print(mx.__version__, mx.default_device(), edgespec)"
    # Not from the repository's root: there `edgespec` is the source folder, without the
    # packages the wheel maps into it (tui/, models/).
    subprocess.run([sys.executable, "-c", check], env=env, cwd=work, check=True)
    bench = [sys.executable, "-m", "edgespec", "bench", *args]
    return subprocess.run(bench, env=env, cwd=work).returncode


def _cuda_env(env: dict[str, str]) -> None:
    """Where MLX's CUDA library finds CUDA. Its RPATH points at `nvidia/*/lib` beside itself,
    which is not where it was installed: the machine's own NVIDIA wheels (PyTorch's) go on
    LD_LIBRARY_PATH. Its kernels are compiled at run time against CUDA's headers: CUDA_HOME is
    nvcc's installation where not set. Nothing changes on a machine without them."""
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    libs = sorted(str(d) for root in roots for d in Path(root).glob("*/lib") if d.is_dir())
    if libs:
        old = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libs + ([old] if old else []))
    nvcc = shutil.which("nvcc")
    if nvcc and not (env.get("CUDA_HOME") or env.get("CUDA_PATH")):
        env["CUDA_HOME"] = str(Path(nvcc).resolve().parents[1])


def _place_weights(folder: Path, weights: str | None) -> None:
    """Link the target's weights, left out of the archive, into its folder (sha256 checked)."""
    want = (folder / WEIGHTS_SUM).read_text().split()[0]
    if weights is None or not Path(weights).is_file():
        sys.exit(f"gpu_bench: {folder.name}'s weights stayed behind: give --weights FILE")
    if sha256(Path(weights)) != want:
        sys.exit(f"gpu_bench: {weights} is not the model.safetensors {folder.name} was packed with")
    (folder / "model.safetensors").symlink_to(Path(weights).resolve())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("pack", help="here: the archive's pieces and the calls to make")
    k.add_argument(
        "--out", required=True, help="a folder for the pieces (an earlier pack's are replaced)"
    )
    k.add_argument("--target", help="the target's folder (default: the pulled target-name)")
    k.add_argument("--target-name", default="smollm2-135m-instruct")
    k.add_argument("--piece-mb", type=float, default=52.0)
    k.add_argument(
        "--skip-weights", action="store_true", help="leave the target's weights out (run --weights)"
    )
    k.add_argument("--python", default="3.12", help="the GPU machine's Python")
    k.add_argument("--cuda", default="13", help="MLX's CUDA wheel (12, 13; '' for the CPU one)")
    k.add_argument("--find-links", help="take the wheels from this folder, not PyPI")
    r = sub.add_parser("run", help="on the GPU machine: join, install, bench")
    r.add_argument("--pieces", required=True)
    r.add_argument("--work", default="/tmp/gb")
    r.add_argument("--weights", help="the target's model.safetensors, where pack skipped it")
    r.add_argument("bench", nargs=argparse.REMAINDER, help="-- then `edgespec bench` arguments")
    a = p.parse_args(argv)
    return cmd_pack(a) if a.cmd == "pack" else cmd_run(a)


if __name__ == "__main__":
    sys.exit(main())
