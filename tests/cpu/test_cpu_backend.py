"""The CPU backend object (edgespec/cpu/backend.py): the Engine runs twins of its models, so the
models it was given keep mlx-lm's classes and mlx-lm's modules keep their functions; a twin shares
the model's arrays and points a plain reference to a twinned module at its twin; each backend
keeps its own state."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import base

from edgespec.config import GenerationConfig, SpecConfig
from edgespec.cpu.backend import CpuBackend, Switches
from edgespec.cpu.blocks import CompiledBlock
from edgespec.cpu.leanops import LeanLinear
from edgespec.cpu.rope import TableRoPE
from edgespec.loading.load import load_model
from edgespec.runtime import Engine


def _classes(model: nn.Module) -> list[tuple[str, type]]:
    return [(name, type(m)) for name, m in model.named_modules()]


def _attention_functions() -> dict[str, object]:
    return {
        name: module.scaled_dot_product_attention
        for name, module in list(sys.modules.items())
        if name.startswith("mlx_lm.models.") and hasattr(module, "scaled_dot_product_attention")
    }


def test_an_engine_leaves_mlx_lms_model_and_modules_as_they_were(tiny_pair):
    target, draft = load_model(str(tiny_pair[0])), load_model(str(tiny_pair[1]))
    before = _classes(target.model), _classes(draft.model)
    functions = _attention_functions()
    assert all(f is base.scaled_dot_product_attention for f in functions.values())
    engine = Engine(target, draft)
    for spec in (SpecConfig(method="none"), SpecConfig(k=3, method="draft", adaptive=False)):
        list(engine.generate([1, 5, 9, 2, 7], GenerationConfig(max_tokens=6, spec=spec)))
    assert (_classes(target.model), _classes(draft.model)) == before
    assert _attention_functions() == functions  # no mlx-lm module's function rebound
    # what the Engine runs: twins with the optimised layers, over the very same arrays
    twin = engine._target.model
    assert twin is not target.model and engine.target.model is target.model
    kinds = {type(m) for _, m in twin.named_modules()}
    assert {LeanLinear, TableRoPE, CompiledBlock} <= kinds
    assert twin.model.embed_tokens.weight is target.model.model.embed_tokens.weight


def test_a_twin_points_plain_references_at_twins_and_backends_keep_their_own_state():
    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)
            object.__setattr__(self, "target", None)  # as an MTP head's: not a parameter

    target, head = nn.Sequential(nn.Linear(4, 4), nn.RoPE(4)), Head()
    object.__setattr__(head, "target", target)
    cpu = CpuBackend(Switches(lean_ops=True, table_rope=True))
    fast_target, fast_head = cpu.model(target), cpu.model(head)
    assert fast_head.target is fast_target and head.target is target
    assert type(fast_head.proj) is LeanLinear and type(head.proj) is nn.Linear
    assert cpu.model(target) is fast_target
    # nn.RoPE held under another key than `rope` keeps its class (module docstring of rope.py)
    assert type(fast_target.layers[1]) is nn.RoPE
    other = CpuBackend(Switches(table_rope=True))
    rope_a, rope_b = TableRoPE(4, tables=cpu.tables), TableRoPE(4, tables=other.tables)
    rope_a(mx.zeros((1, 1, 2, 4)))
    assert cpu.tables.tables and not other.tables.tables
    assert rope_b.tables is other.tables
    assert CpuBackend(Switches()).model(target) is target  # nothing switched on (a GPU)


ON_A_GPU = """
import sys
import mlx.core as mx
from edgespec.config import GenerationConfig, SpecConfig
from edgespec.runtime import Engine  # (mlx-lm makes its streams on the real device, at import)

# What mx.default_device() answers on Metal or CUDA; MLX itself goes on computing on the CPU.
mx.default_device = lambda: mx.Device(mx.DeviceType.gpu, 0)
engine = Engine.load(target=sys.argv[1], draft=sys.argv[2])
for spec in (SpecConfig(method="none"), SpecConfig(k=3, method="draft", adaptive=False)):
    list(engine.generate([1, 5, 9, 2, 7], GenerationConfig(max_tokens=6, spec=spec)))
print(type(engine.backend).__name__, engine._target.model is engine.target.model)
print(" ".join(sorted(m for m in sys.modules if m.startswith("edgespec.cpu"))) or "none")
"""


def test_a_gpu_process_imports_no_cpu_module(tiny_pair):
    """The backend is chosen by the device: where MLX's default device is a GPU (faked here:
    the machine has none) the Engine runs the models as they are and no edgespec.cpu module is
    imported, loading and decoding alike."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    out = subprocess.run(
        [sys.executable, "-c", ON_A_GPU, str(tiny_pair[0]), str(tiny_pair[1])],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["Backend True", "none"]
