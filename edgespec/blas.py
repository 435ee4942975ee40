"""Use an optimised BLAS under MLX's CPU backend on Linux, without rebuilding anything.

The `mlx[cpu]` wheel links the unoptimised reference BLAS (docs/cpu-backend.md has its speed next
to the others'). A library cannot swap BLAS after MLX is loaded, so the `edgespec` command (and pytest,
through tests.plugins.pytest_blas) re-executes itself once, before importing MLX, with a better one in
LD_PRELOAD. EDGESPEC_BLAS picks it:

- `auto` (default): Intel MKL in exact mode when the `mkl` wheel is installed (`pip install
  edgespec[cpu]`, Linux x86-64), else OpenBLAS when installed (`apt-get install
  libopenblas0-pthread`), else nothing.
- `mkl`: MKL in exact mode. MKL_CBWR=AUTO,STRICT (its "strict conditional numerical
  reproducibility"): on an Intel CPU a target forward over L tokens then gives the same bits as L
  one-token forwards (tests/cpu/test_blas.py), so greedy speculative output is bit-for-bit plain
  decoding's, near-ties included. MKL honours that setting on Intel CPUs only: on an AMD EPYC the
  rows still differ (in the 5th digit), yet it remains the fastest choice there
  (docs/cpu-backend.md), so it stays the default and greedy output is exact up to floating-point
  near-ties, as with OpenBLAS. OpenBLAS and MKL's
  default mode differ in the 5th significant digit (a 1-token product takes a different kernel),
  which can flip a near-tie.
- `mkl-fast`: MKL without that constraint: the fastest decoding on x86, but, like OpenBLAS,
  exact up to floating-point near-ties only.
- `openblas`, or `system` (leave the process alone).
OpenBLAS picks its kernel set for the CPU when it loads, unless OPENBLAS_CORETYPE names one (the
re-exec leaves that variable alone; `kernels()` reports the set in use, and the bench records it).
A choice that is not installed falls back down that list with a one-line note (`plan`'s
`notes`; the command prints it on stderr, the library never prints).
Scripts that `import edgespec` can export the same variables themselves; `plan()` returns them.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
from collections.abc import Callable, MutableMapping
from pathlib import Path

from edgespec.switches import BLAS, BLAS_ACTIVE

CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)
MKL_NAMES = ("libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so")
MODES = ("auto", "mkl", "mkl-fast", "openblas", "system")
EXACT_CBWR = "AUTO,STRICT"
# Set in the re-executed process: which BLAS it runs on (and that it need not re-execute again).
ACTIVE = BLAS_ACTIVE
THREAD_VARIABLES = ("MKL_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def share_cores(processes: int, environ: MutableMapping[str, str] = os.environ) -> str | None:
    """When `processes` processes compute side by side on this machine (ranks of one launch, test
    workers), set each BLAS thread count left unset in `environ` to cores // processes (at least
    1), so that together they start no more compute threads than there are cores: MKL's OpenMP
    threads spin while they wait, and over-subscribed they slow each other down. A count the user
    set stays. Returns the share set, or None for one process (nothing set).

        share_cores(3, env) on 2 cores -> "1"; share_cores(1, env) -> None
    """
    if processes <= 1:
        return None
    share = str(max(1, (os.cpu_count() or 1) // processes))
    for name in THREAD_VARIABLES:
        environ.setdefault(name, share)
    return share


def openblas_path() -> str | None:
    """The first installed OpenBLAS that can stand in for libblas.so.3, or None."""
    return next((p for p in CANDIDATES if Path(p).exists()), None)


def mkl_path() -> str | None:
    """libmkl_rt from the `mkl` wheel, or None. The wheel installs it into the environment's data
    lib/ folder (site-packages/../../); its RECORD says where, else the usual prefixes are tried."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        dist = distribution("mkl")
        for f in dist.files or []:
            if f.name in MKL_NAMES:
                path = Path(str(dist.locate_file(f))).resolve()
                if path.exists():
                    return str(path)
    except PackageNotFoundError:
        return None
    except Exception:  # an unreadable RECORD: fall back to the prefixes
        pass
    roots = [sys.prefix, sys.base_prefix, sysconfig.get_paths().get("data", ""), site.USER_BASE]
    for root in dict.fromkeys(r for r in roots if r):
        for name in MKL_NAMES:
            path = Path(root) / "lib" / name
            if path.exists():
                return str(path)
    return None


def plan(
    mode: str | None = None, notes: list[str] | None = None
) -> tuple[str, str, dict[str, str]] | None:
    """(name, library to preload, extra environment) for EDGESPEC_BLAS=mode (default: the
    variable, else auto), or None for nothing to preload. When the choice falls back, a one-line
    note is appended to `notes` (if given)."""
    said = notes if notes is not None else []
    mode = (mode if mode is not None else os.environ.get(BLAS, "auto")).strip() or "auto"
    if mode not in MODES:
        said.append(
            f"edgespec: EDGESPEC_BLAS={mode!r} is not one of {', '.join(MODES)}; using auto"
        )
        mode = "auto"
    if mode == "system":
        return None
    if mode in ("auto", "mkl", "mkl-fast"):
        lib = mkl_path()
        if lib is not None:
            threads = "INTEL" if (Path(lib).parent / "libiomp5.so").exists() else "GNU"
            env = {"MKL_THREADING_LAYER": os.environ.get("MKL_THREADING_LAYER", threads)}
            if mode != "mkl-fast":
                env["MKL_CBWR"] = EXACT_CBWR
            return ("mkl-fast" if mode == "mkl-fast" else "mkl", lib, env)
        if mode != "auto":
            said.append(
                f"edgespec: EDGESPEC_BLAS={mode}: MKL is not installed "
                "(pip install mkl); trying OpenBLAS"
            )
    lib = openblas_path()
    if lib is None:
        if mode != "auto":
            said.append(
                f"edgespec: EDGESPEC_BLAS={mode}: no optimised BLAS installed; "
                "MLX's CPU backend keeps its reference BLAS"
            )
        return None
    return ("openblas", lib, {})


def openblas_core(lib: str | None) -> str:
    """The kernel set the OpenBLAS at `lib` picks for this CPU ("Haswell", "SkylakeX", ...), or ""
    when it cannot be asked. None: the OpenBLAS already loaded in this process (preloaded)."""
    try:
        import ctypes

        handle = ctypes.CDLL(lib)
        handle.openblas_get_corename.restype = ctypes.c_char_p
        return (handle.openblas_get_corename() or b"").decode()
    except (OSError, AttributeError):
        return ""


def kernels() -> str:
    """The kernel set of the OpenBLAS under this process ("SkylakeX", ...; asked of the loaded
    library), "" under any other BLAS. For the bench's environment record."""
    return openblas_core(None) if active() == "openblas" else ""


def cpu_model() -> str:
    """The CPU's name, with its family and model numbers where the name alone is vague ("AMD EPYC
    (family 26, model 2)", a Zen 5: speedups differ between CPU generations), or ""."""
    if sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True
            )
            return out.stdout.strip()
        except OSError:
            return ""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
            if not line.strip():  # the first processor's block is enough
                break
    except OSError:
        return ""
    name = fields.get("model name", "")
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name.strip()


def cpu_vendor() -> str:
    """The CPU's vendor string from /proc/cpuinfo ("GenuineIntel", "AuthenticAMD", ...), or ""."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def rows_exact(name: str | None = None) -> bool:
    """Whether a verify forward's rows carry the same bits as one-token steps under this BLAS
    (`active()` by default): MKL's exact mode on an Intel CPU (measured; tests/cpu/test_blas.py) or
    the unoptimised reference BLAS. Elsewhere greedy output is exact up to floating-point
    near-ties."""
    name = active() if name is None else name
    return name == "reference" or (name == "mkl" and cpu_vendor() == "GenuineIntel")


def active() -> str:
    """The BLAS under this process's MLX CPU backend: mkl / mkl-fast / openblas (preloaded by
    the re-exec), `preloaded` (someone else's LD_PRELOAD), `accelerate` (macOS) or `reference`."""
    if sys.platform == "darwin":
        return "accelerate"
    if os.environ.get(ACTIVE):
        return os.environ[ACTIVE]
    preload = os.environ.get("LD_PRELOAD", "")
    if "mkl_rt" in preload:
        return "mkl" if "STRICT" in os.environ.get("MKL_CBWR", "") else "mkl-fast"
    if "blas" in preload:
        return "preloaded"
    return "reference"


def reexec_with_blas(
    argv: list[str], module: str = "edgespec", report: Callable[[str], None] | None = None
) -> None:
    """On Linux, replace this process with `python -m MODULE *argv` preloading the BLAS that
    `plan()` picks (once), in safe-path mode (`safe_command`). `report` is handed plan's notes (a fallback) before that.

    No-op on macOS (MLX uses Accelerate/Metal), for EDGESPEC_BLAS=system, when already re-executed
    or already preloaded, when no optimised BLAS is installed, or when MLX is already imported
    (too late to swap).
    """
    if not sys.platform.startswith("linux"):
        return
    if os.environ.get(ACTIVE) or "mlx.core" in sys.modules:
        return
    preload = os.environ.get("LD_PRELOAD", "")
    if any(("mkl_rt" in p or "blas" in p) for p in preload.split(":") if p):
        return  # the user preloaded a BLAS themselves
    notes: list[str] = []
    chosen = plan(notes=notes)
    for note in notes:
        if report is not None:
            report(note)
    if chosen is None:
        return
    name, lib, extra = chosen
    env = dict(os.environ, **extra, **{ACTIVE: name})
    env["LD_PRELOAD"] = ":".join(filter(None, [lib, preload]))
    env.update(checkout_path(env.get("PYTHONPATH", "")))
    try:
        os.execve(sys.executable, safe_command(module, argv), env)
    except OSError:
        return  # keep going on the reference BLAS rather than fail


def checkout_path(pythonpath: str, cwd: Path | None = None) -> dict[str, str]:
    """{"PYTHONPATH": ...} naming the folder that holds this edgespec package when that folder is
    the working directory (`python -m edgespec` or pytest run in a source checkout, which may be
    what put it on the import path), else {}: the safe-path re-exec then imports the same code.

        checkout_path("", cwd=Path("/src/edgespec-repo"))  -> {"PYTHONPATH": "/src/edgespec-repo"}
    """
    holder = Path(__file__).resolve().parents[1]
    if holder != (cwd or Path.cwd()).resolve() or str(holder) in pythonpath.split(os.pathsep):
        return {}
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(holder), pythonpath]))}


# Python < 3.11 has no -P: this runs the module once the working directory (sys.path[0], "" under
# -c) is off the import path, before anything else is imported.
_SAFE_BOOT = (
    "import sys; del sys.path[0]; import runpy; "
    "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"
)


def safe_command(
    module: str, argv: list[str], version: tuple[int, ...] = tuple(sys.version_info[:2])
) -> list[str]:
    """`python -m MODULE *argv` without the working directory on the import path, so that a file
    named like a standard module where the command was started (a queue.py) cannot replace it.

        safe_command("edgespec", ["serve"], (3, 11))  -> [python, "-P", "-m", "edgespec", "serve"]
        safe_command("edgespec", ["serve"], (3, 10))  -> [python, "-c", _SAFE_BOOT, "edgespec", "serve"]
    """
    if version >= (3, 11):
        return [sys.executable, "-P", "-m", module, *argv]
    return [sys.executable, "-c", _SAFE_BOOT, module, *argv]
