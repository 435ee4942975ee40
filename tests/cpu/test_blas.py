"""The BLAS re-exec: right library and settings, at most once, choices and opt-out honoured; and
the reason MKL's exact mode is the default (a one-token forward and an L-token forward agree
bit for bit under it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from edgespec import blas

MKL = "/opt/lib/libmkl_rt.so.3"
OPENBLAS = "/opt/libopenblas.so"


@pytest.fixture
def calls(monkeypatch):
    seen: list[tuple] = []
    monkeypatch.setattr(blas.os, "execve", lambda exe, argv, env: seen.append((exe, argv, env)))
    monkeypatch.setattr(blas, "openblas_path", lambda: OPENBLAS)
    monkeypatch.setattr(blas, "mkl_path", lambda: MKL)
    monkeypatch.setattr(blas.sys, "platform", "linux")
    monkeypatch.delitem(sys.modules, "mlx.core", raising=False)
    for var in (
        "LD_PRELOAD",
        "EDGESPEC_BLAS",
        blas.ACTIVE,
        "MKL_CBWR",
        "MKL_THREADING_LAYER",
        "OPENBLAS_CORETYPE",
    ):
        monkeypatch.delenv(var, raising=False)
    return seen


def test_reexec_prefers_mkl_in_exact_mode_and_keeps_arguments(calls):
    blas.reexec_with_blas(["generate", "hi", "-k", "3"])
    ((exe, argv, env),) = calls
    assert argv[1:] == ["-P", "-m", "edgespec", "generate", "hi", "-k", "3"]  # safe-path mode
    assert env["LD_PRELOAD"] == MKL
    assert env["MKL_CBWR"] == "AUTO,STRICT" and env[blas.ACTIVE] == "mkl"


def test_mkl_fast_drops_the_reproducibility_setting(calls, monkeypatch):
    monkeypatch.setenv("EDGESPEC_BLAS", "mkl-fast")
    blas.reexec_with_blas(["models"])
    env = calls[0][2]
    assert env["LD_PRELOAD"] == MKL and "MKL_CBWR" not in env and env[blas.ACTIVE] == "mkl-fast"


def test_openblas_when_asked_or_when_mkl_is_missing(calls, monkeypatch, capsys):
    monkeypatch.setenv("EDGESPEC_BLAS", "openblas")
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")  # a kernel set pinned by the user: kept
    blas.reexec_with_blas(["models"])
    assert calls[-1][2]["LD_PRELOAD"] == OPENBLAS and calls[-1][2][blas.ACTIVE] == "openblas"
    assert calls[-1][2]["OPENBLAS_CORETYPE"] == "Haswell"
    monkeypatch.setattr(blas, "mkl_path", lambda: None)
    monkeypatch.setenv("EDGESPEC_BLAS", "auto")
    notes: list[str] = []
    blas.reexec_with_blas(["models"], report=notes.append)
    assert calls[-1][2]["LD_PRELOAD"] == OPENBLAS
    assert notes == []  # auto falls back silently
    monkeypatch.setenv("EDGESPEC_BLAS", "mkl")
    blas.reexec_with_blas(["models"], report=notes.append)
    assert calls[-1][2]["LD_PRELOAD"] == OPENBLAS
    assert len(notes) == 1 and "\n" not in notes[0] and "MKL is not installed" in notes[0]
    assert capsys.readouterr().err == ""  # the library never prints: the caller reports


@pytest.mark.skipif(blas.openblas_path() is None, reason="OpenBLAS is not installed")
def test_openblas_reports_its_kernels():
    """The installed OpenBLAS answers openblas_core, and OPENBLAS_CORETYPE steers it (in a
    subprocess: the library reads the variable when it loads); a process running on it reports
    the set in use (`kernels`, which the bench records)."""
    lib = blas.openblas_path()
    assert lib is not None and blas.openblas_core(lib) != ""
    code = f"from edgespec import blas; print(blas.openblas_core({lib!r}))"
    env = {**os.environ, "OPENBLAS_CORETYPE": "Sandybridge"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "Sandybridge", out.stderr
    assert blas.openblas_core("/nonexistent/libblas.so.3") == ""
    env.update({"LD_PRELOAD": lib, blas.ACTIVE: "openblas"})
    code = "from edgespec import blas; import mlx.core; print(blas.kernels())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "Sandybridge", out.stderr


def test_an_unknown_choice_is_one_line_and_auto(calls, monkeypatch, capsys):
    monkeypatch.setenv("EDGESPEC_BLAS", "atlas")
    notes: list[str] = []
    blas.reexec_with_blas(["models"], report=notes.append)
    assert calls[0][2]["LD_PRELOAD"] == MKL
    assert len(notes) == 1 and "\n" not in notes[0] and "'atlas'" in notes[0]
    assert capsys.readouterr().err == ""  # the library never prints: the caller reports


def test_existing_preload_is_kept_after_the_blas(calls, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/x/other.so")
    blas.reexec_with_blas(["models"])
    assert calls[0][2]["LD_PRELOAD"] == f"{MKL}:/x/other.so"


@pytest.mark.parametrize(
    "env",
    [
        {"EDGESPEC_BLAS": "system"},
        {blas.ACTIVE: "mkl"},
        {"LD_PRELOAD": OPENBLAS},
        {"LD_PRELOAD": "/somewhere/libmkl_rt.so.2"},
    ],
)
def test_no_reexec_when_opted_out_done_or_present(calls, monkeypatch, env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    blas.reexec_with_blas(["models"])
    assert calls == []


def test_no_reexec_without_an_optimised_blas(calls, monkeypatch):
    monkeypatch.setattr(blas, "openblas_path", lambda: None)
    monkeypatch.setattr(blas, "mkl_path", lambda: None)
    blas.reexec_with_blas(["models"])
    assert calls == []


BITS = """
import mlx.core as mx, numpy as np
from mlx_lm.models import llama
from edgespec.cache import KVState
from edgespec.cpu.backend import CpuBackend
from tests.helpers.tiny import llama_config, random_llama_weights
import os
config = llama_config(vocab_size=4096, layers=2, hidden=int(os.environ["BITS_HIDDEN"]))
model = llama.Model(llama.ModelArgs.from_dict(config))
model.load_weights([(k, mx.array(v)) for k, v in random_llama_weights(config, seed=3).items()])
from edgespec.cpu import attention
attention.FROM_KEYS = 134  # the rows below see 131..138 keys: NumPy from the 4th on
cpu = CpuBackend()
st = KVState(cpu.model(model), new_cache=cpu.new_cache)  # as the Engine builds it
prompt = list(range(1, 132)); st.prefill(prompt)  # rows at 131..138 keys
toks = [5, 77, 123, 99, 42, 7, 8, 9]
full = np.array(st.forward(mx.array(toks, dtype=mx.int32))); st.rewind(prompt, len(prompt) - 1)
one = np.stack([np.array(st.forward(mx.array([t], dtype=mx.int32)))[0] for t in toks])
print("identical" if np.array_equal(full, one) else "differs")
"""


def _bits(mode: str, numpy_softmax: str = "1", hidden: int = 576) -> str:
    """Run BITS in a subprocess under EDGESPEC_BLAS=mode (the BLAS is fixed at process start), on
    a model `hidden` wide (4 heads: 576 makes heads of 144, which the fused kernel does not take,
    256 heads of 64, which it does)."""
    env = {k: v for k, v in os.environ.items() if k not in (blas.ACTIVE, "LD_PRELOAD")}
    env["EDGESPEC_CPU_OPT"] = "1" if numpy_softmax == "1" else "-numpy_softmax"
    env["BITS_HIDDEN"] = str(hidden)
    chosen = blas.plan(mode)
    if chosen is not None:
        env.update(chosen[2], LD_PRELOAD=chosen[1])
    out = subprocess.run(
        [sys.executable, "-c", BITS], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(blas.mkl_path() is None, reason="the mkl wheel is not installed")
def test_mkl_exact_mode_makes_an_l_token_forward_equal_l_one_token_forwards_on_intel():
    """Why `mkl` (strict CNR) is the default on Intel: the verify forward's rows carry the same
    bits as plain decoding's one-token forwards. MKL ignores strict CNR on other CPUs (measured on
    an AMD EPYC: rows differ in the 5th digit), and rows_exact says so."""
    got = _bits("mkl")
    if blas.cpu_vendor() == "GenuineIntel":
        assert got == "identical" and blas.rows_exact("mkl")
    else:
        assert not blas.rows_exact("mkl")  # the claim is not made where it does not hold


@pytest.mark.parametrize("numpy_softmax,hidden", [("1", 576), ("0", 576), ("1", 256)])
def test_the_reference_blas_is_row_exact(numpy_softmax, hidden):
    """The unoptimised BLAS (EDGESPEC_BLAS=system) computes each row alike on any CPU, with the
    attention's softmax in NumPy for the rows that see FROM_KEYS keys (edgespec/cpu/attention.py)
    or in MLX, or those rows in the fused kernel (heads of 64)."""
    got = _bits("system", numpy_softmax, hidden)
    assert got == "identical" and blas.rows_exact("reference")


def test_cpu_model_reads_the_first_processor_block(monkeypatch, tmp_path):
    """results.json's `cpu`: the name plus family/model (two "AMD EPYC" CPUs of different
    generations measured different speedups), from the first processor only."""
    info = tmp_path / "cpuinfo"
    block = "processor\t: {n}\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: {m}\n"
    info.write_text(
        block.format(n=0, m=2) + "model name\t: AMD EPYC\n\n" + block.format(n=1, m=9) + "\n"
    )
    real_path = blas.Path
    monkeypatch.setattr(blas.sys, "platform", "linux")
    monkeypatch.setattr(blas, "Path", lambda p: info if p == "/proc/cpuinfo" else real_path(p))
    assert blas.cpu_model() == "AMD EPYC (family 26, model 2)"
    info.write_text("processor\t: 0\nBogoMIPS\t: 50.00\n")  # e.g. an ARM board: no name
    assert blas.cpu_model() == ""
    monkeypatch.setattr(blas, "Path", lambda p: tmp_path / "missing")
    assert blas.cpu_model() == ""


def test_processes_side_by_side_share_the_cores_unless_the_user_set_a_count(monkeypatch):
    monkeypatch.setattr(blas.os, "cpu_count", lambda: 8)
    env = {"OMP_NUM_THREADS": "3"}
    assert blas.share_cores(1, env) is None and env == {"OMP_NUM_THREADS": "3"}
    assert blas.share_cores(3, env) == "2"
    assert env == {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2"}
    assert blas.share_cores(16, {}) == "1"  # at least one thread each


def test_xdist_worker_counts_are_read_from_every_spelling(monkeypatch):
    from tests.plugins.pytest_blas import xdist_workers

    monkeypatch.setitem(sys.modules, "psutil", None)  # counted as xdist does without psutil
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert [xdist_workers(a) for a in (["-n", "4"], ["-n4"], ["--numprocesses=4"])] == [4, 4, 4]
    assert xdist_workers(["--numprocesses", "auto"]) == xdist_workers(["-nlogical"]) == 6
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    assert xdist_workers(["-n", "auto"]) == 3 and xdist_workers(["-n", "5"]) == 5
    assert xdist_workers(["-ra", "-m", "not slow", "tests/loop"]) == 0
    assert xdist_workers(["-n", "0"]) == 0 and xdist_workers(["-n"]) == 0


def test_xdist_workers_inherit_their_share_of_the_cores(tmp_path):
    """The plugin, as pytest loads it, under `-n 2`: each worker sees cores // 2 BLAS threads."""
    pytest.importorskip("xdist")
    (tmp_path / "test_env.py").write_text(
        "import os\n\ndef test_env():\n"
        f"    open({str(tmp_path / 'seen')!r} + os.environ['PYTEST_XDIST_WORKER'], 'w')"
        ".write(os.environ.get('MKL_NUM_THREADS', '-'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in blas.THREAD_VARIABLES}
    env.pop("PYTEST_ADDOPTS", None)
    argv = ["-p", "tests.plugins.pytest_blas", "-p", "no:cacheprovider", "-q", "-n", "2"]
    r = subprocess.run(
        [sys.executable, "-m", "pytest", *argv, str(tmp_path / "test_env.py")],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    seen = {p.read_text() for p in tmp_path.glob("seen*")}
    assert seen == {str(max(1, (os.cpu_count() or 1) // 2))}
