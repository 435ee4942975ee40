"""The CLI's OpenBLAS re-exec: right library, at most once, opt-out honoured."""

from __future__ import annotations

import sys

import pytest

from edgespec import blas


@pytest.fixture
def calls(monkeypatch):
    seen: list[tuple] = []
    monkeypatch.setattr(blas.os, "execve", lambda exe, argv, env: seen.append((exe, argv, env)))
    monkeypatch.setattr(blas, "openblas_path", lambda: "/opt/libopenblas.so")
    monkeypatch.setattr(blas.sys, "platform", "linux")
    monkeypatch.delitem(sys.modules, "mlx.core", raising=False)
    for var in ("LD_PRELOAD", "EDGESPEC_BLAS", blas._MARK):
        monkeypatch.delenv(var, raising=False)
    return seen


def test_reexec_preloads_openblas_and_keeps_arguments(calls):
    blas.reexec_with_openblas(["generate", "hi", "-k", "3"])
    ((exe, argv, env),) = calls
    assert argv[1:] == ["-m", "edgespec", "generate", "hi", "-k", "3"]
    assert env["LD_PRELOAD"] == "/opt/libopenblas.so" and env[blas._MARK] == "1"


def test_existing_preload_is_kept_after_openblas(calls, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/x/other.so")
    blas.reexec_with_openblas(["models"])
    assert calls[0][2]["LD_PRELOAD"] == "/opt/libopenblas.so:/x/other.so"


@pytest.mark.parametrize(
    "env", [{"EDGESPEC_BLAS": "system"}, {blas._MARK: "1"}, {"LD_PRELOAD": "/opt/libopenblas.so"}]
)
def test_no_reexec_when_opted_out_done_or_present(calls, monkeypatch, env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    blas.reexec_with_openblas(["models"])
    assert calls == []


def test_no_reexec_without_openblas(calls, monkeypatch):
    monkeypatch.setattr(blas, "openblas_path", lambda: None)
    blas.reexec_with_openblas(["models"])
    assert calls == []
