"""Which backend the device MLX computes on takes (edgespec/backend.py): the one place that
imports edgespec.cpu, and only on MLX's CPU backend, so a Metal or CUDA process loads none of it.

    backend = for_device()        # an Engine's, once
    if kind().dequantizes: ...    # a decision made before any Engine exists (loading a model)
"""

from __future__ import annotations

from edgespec.backend import Backend, on_cpu

__all__ = ["for_device", "kind"]


def for_device() -> Backend:
    """The backend for the device MLX computes on: the CPU backend there (its rewrites as
    EDGESPEC_CPU_OPT says, read once), else `Backend`."""
    if not on_cpu():
        return Backend()
    from edgespec.cpu.backend import CpuBackend  # imported on the CPU only

    return CpuBackend()


def kind() -> type[Backend]:
    """The class `for_device` would build, for decisions made before an Engine exists (loading
    a model: `kind().dequantizes`). Imports edgespec.cpu on the CPU only."""
    if not on_cpu():
        return Backend
    from edgespec.cpu.backend import CpuBackend

    return CpuBackend
