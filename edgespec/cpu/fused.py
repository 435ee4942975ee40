"""The fused CPU attention kernel (attend.c): built once per machine with the system's C compiler,
loaded with ctypes, called between two MLX graphs like the NumPy softmax it replaces
(edgespec/cpu/attention.py decides which rows take it: those that see 1,024 keys or more).

MLX's CPU attention is three passes over a rows x keys score array, its products by a BLAS that
runs a few rows no faster than a full tile: a verify of 2 tokens against 8K keys costs about twice
a one-token step's attention. The kernel reads each key and value once for all the query rows of
a KV head, so the verify's extra rows cost little more than their arithmetic.

The library goes to EDGESPEC_KERNEL_DIR, else $XDG_CACHE_HOME/edgespec/kernels (~/.cache/...),
named by a hash of the source, the compiler and its flags and the CPU (it is built for this
CPU's vector units): later processes load it at once. Without a working compiler (CC, else cc),
`kernel()` is None and the callers keep MLX's products with NumPy's softmax; `problem()` says why.
`EDGESPEC_CPU_OPT=-fused_attention` turns the kernel off (backend.py, Switches).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import numpy as np

from edgespec.switches import KERNEL_DIR

SOURCE = Path(__file__).with_name("attend.c")
SYMBOL = "edgespec_attend"
DIMS = (16, 32, 48, 64, 80, 96, 112, 128, 256)  # the head sizes attend.c is built for
Attend = Callable[[mx.array, mx.array, mx.array, float, bool, "np.ndarray | None"], mx.array]
_problem: list[str] = []


def flags() -> list[str]:
    """The compiler flags: optimised for this CPU's vector units."""
    native = (
        "-mcpu=native" if platform.machine().lower() in ("arm64", "aarch64") else "-march=native"
    )
    return ["-O3", native, "-shared", "-fPIC", "-std=gnu11"]


def kernel_dir() -> Path:
    """Where built kernels are kept (module docstring)."""
    if os.environ.get(KERNEL_DIR):
        return Path(os.environ[KERNEL_DIR])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgespec" / "kernels"


def problem() -> str:
    """Why the kernel is not in use ("" when it is, or has not been asked for yet)."""
    return _problem[0] if _problem else ""


def build(directory: Path | None = None) -> Path:
    """The kernel library for this machine, compiled unless a copy with the same key is there.
    Raises OSError or subprocess.CalledProcessError (with the compiler's message) on failure."""
    from edgespec.blas import cpu_model  # (blas.py imports no MLX; cheap)

    compiler = os.environ.get("CC") or shutil.which("cc") or "cc"
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True)
    source = SOURCE.read_bytes()
    key = [compiler, version.stdout.splitlines()[0] if version.stdout else "", *flags()]
    key += [platform.machine(), cpu_model()]
    digest = hashlib.sha256(source + "\0".join(key).encode()).hexdigest()[:16]
    directory = directory or kernel_dir()
    target = directory / f"attend-{digest}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(suffix=".so", dir=directory)  # built aside, then moved in
    os.close(fd)
    try:
        subprocess.run(
            [compiler, *flags(), "-o", scratch, str(SOURCE)],
            capture_output=True,
            text=True,
            check=True,
        )
        os.replace(scratch, target)  # atomic: concurrent builders each install a whole file
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)
    return target


@functools.cache
def kernel() -> Attend | None:
    """`attend`, with the library built and loaded; None (and `problem()` set) when it cannot be."""
    try:
        return load(build())
    except subprocess.CalledProcessError as e:
        last = (e.stderr or "").strip().splitlines()
        _problem.append(f"the C compiler failed: {last[-1] if last else e}")
    except OSError as e:
        _problem.append(f"no C compiler to build it ({e})")
    return None


def load(library: Path) -> Attend:
    """`attend` over the kernel in `library` (a build of attend.c)."""
    fn = ctypes.CDLL(str(library))[SYMBOL]
    i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    fn.argtypes = [ptr, *[i64] * 3, ptr, *[i64] * 3, ptr, *[i64] * 3, ptr, *[i32] * 6]
    fn.argtypes += [ctypes.c_float, ptr, ptr, ptr, ptr]
    fn.restype = i32
    return functools.partial(attend, fn)


def _strides(a: np.ndarray) -> list[int]:
    return [s // a.itemsize for s in a.strides[:3]]


def attend(
    fn: Callable[..., int],
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    scale: float,
    causal: bool,
    allowed: np.ndarray | None = None,
) -> mx.array:
    """softmax(q k^T * scale) v for float32 queries [B, H, L, D] (the last L positions) against
    keys / values [B, G, S, D] (H a multiple of G; D one of DIMS), query token t
    seeing keys j <= S - L + t when `causal`, and only those with allowed[t, j] when `allowed`
    [L, S] is given. Evaluates its inputs (a graph break) and returns [B, H, L, D]."""
    mx.eval(queries, keys, values)
    q, k, v = (np.asarray(a) for a in (queries, keys, values))  # views of MLX's buffers
    q, k, v = (a if a.strides[-1] == a.itemsize else np.ascontiguousarray(a) for a in (q, k, v))
    b, h, length, d = q.shape
    g, s = k.shape[1], k.shape[2]
    first = s - length + 1 if causal else s
    limit = np.minimum(np.arange(first, first + length, dtype=np.int32), s)
    mask = None if allowed is None else np.ascontiguousarray(allowed, dtype=np.uint8)
    out = np.empty((b, h, length, d), np.float32)
    scratch = np.empty((h // g) * length * (s + 16 + 2 * d), np.float32)
    qs = np.empty((h // g) * length * d, np.float32)
    code = fn(
        q.ctypes.data, *_strides(q), k.ctypes.data, *_strides(k), v.ctypes.data, *_strides(v),
        out.ctypes.data, b, h, g, length, s, d, scale, limit.ctypes.data,
        None if mask is None else mask.ctypes.data, scratch.ctypes.data, qs.ctypes.data,
    )  # fmt: skip
    if code != 0:
        raise ValueError(f"the fused attention does not take shape {q.shape} x {k.shape}")
    return mx.array(out)


def takes(queries: mx.array, keys: mx.array) -> bool:
    """Whether `attend` takes these shapes and dtypes."""
    return (
        queries.dtype == keys.dtype == mx.float32
        and queries.shape[-1] in DIMS
        and queries.shape[1] % keys.shape[1] == 0
    )
