"""The CPU backend: one object, built once per Engine, that owns EdgeSpec's optimised forwards on
MLX's CPU backend. A GPU takes none of them (every switch is off there).

    cpu = CpuBackend()                    # the switches read from the environment, once
    fast = cpu.model(loaded.model)        # the twin that runs the optimised layers
    state = KVState(fast, "target", cpu.new_cache)
    warp(logits, sampling, cpu.softmax)   # the sampling softmax (None: MLX's own)

`model(m)` returns m's twin (`twin`, at the end): new module objects over the same parameter
arrays, with row padding when asked (rowpad.py, imported only then), rotary tables (rope.py), lean Linear / RMSNorm
(leanops.py), compiled llama blocks (blocks.py) and attention modules that take the grouped path
for marked caches (attention.py). The model it was given is left as it is: its classes, its
modules, mlx-lm's functions. So the bench's mlx-lm peer, which runs `loaded.model`, runs mlx-lm's
own code by construction, and each twin's outputs keep the model's bits (tests/cpu/test_rope.py,
test_leanops.py, test_blocks.py compare a twin with its model). The state the optimised layers
keep (rotary tables, the rows and the causal mask of the latest forward, the compiled traces)
belongs to this object and its twins, never to a module of EdgeSpec or mlx-lm.

Switches: edgespec/cpu/__init__.py (`EDGESPEC_CPU_OPT=0` turns everything off); the BLAS preload
is edgespec/cpu/blas.py. The decoding core (loop, cache, drafting, sampling) never imports this
package: the Engine (edgespec/runtime.py) hands it these pieces.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import base
from mlx_lm.models.cache import make_prompt_cache

from edgespec.cpu import attention, blas, blocks, cpu_switch, fastexp, leanops, on_cpu, rope
from edgespec.rewind import rewindable

__all__ = ["CpuBackend", "Switches", "draft_pairs", "on_cpu"]


def draft_pairs() -> bool:
    """Whether draft steps run two positions instead of one (drafting/token.py ModelDrafter): on
    the CPU backend under Intel MKL (whose one-row products run on one thread; OpenBLAS's two-row
    ones are the slower), or everywhere on the CPU with EDGESPEC_DRAFT_PAIRS=1."""
    if not cpu_switch("EDGESPEC_DRAFT_PAIRS"):
        return False
    return os.environ.get("EDGESPEC_DRAFT_PAIRS") == "1" or blas.active() in ("mkl", "mkl-fast")


@dataclasses.dataclass(frozen=True)
class Switches:
    """Which rewrites a backend applies (all off: a GPU, or EDGESPEC_CPU_OPT=0)."""

    grouped_attention: bool = False
    numpy_softmax: bool = False
    fused_attention: bool = False  # asked for; fused.kernel() says whether it built
    table_rope: bool = False
    lean_ops: bool = False
    compiled_blocks: bool = False
    fast_exp: bool = False
    draft_pairs: bool = False
    pad_rows: bool = False  # opt-in (EDGESPEC_PAD_ROWS=1), not recorded by the bench

    @classmethod
    def from_environment(cls) -> Switches:
        """The switches in force in this process (edgespec/cpu/__init__.py)."""
        return cls(
            grouped_attention=attention.enabled(),
            numpy_softmax=attention.enabled() and attention.numpy_enabled(),
            fused_attention=attention.enabled()
            and attention.numpy_enabled()
            and attention.fused_enabled(),
            table_rope=rope.enabled(),
            lean_ops=leanops.enabled(),
            compiled_blocks=blocks.enabled(),
            fast_exp=fastexp.enabled(),
            draft_pairs=draft_pairs(),
            pad_rows=cpu_switch("EDGESPEC_PAD_ROWS") and blas.pads_single_rows(),
        )

    def recorded(self) -> dict[str, bool]:
        """What results.json records (`environment.cpu_rewrites`); the fused attention counts as
        on once its kernel is built (here, when not built yet: before a bench's first timing)."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "pad_rows"}
        if self.fused_attention:
            from edgespec.cpu import fused

            out["fused_attention"] = fused.kernel() is not None
        return out

    def rewrite_models(self) -> bool:
        """Whether any of them changes how a model runs (else `model` returns it as it is)."""
        s = self
        return s.grouped_attention or s.table_rope or s.lean_ops or s.compiled_blocks or s.pad_rows


class CpuBackend:
    """EdgeSpec's optimised forwards for MLX's CPU backend (module docstring). Not thread-safe,
    like the Engine that holds it."""

    def __init__(self, switches: Switches | None = None):
        self.switches = switches if switches is not None else Switches.from_environment()
        self.tables = rope.Tables()
        self.masks = attention.Masks()
        original = getattr(base, attention.NAME)
        self._original = original
        self._rows = attention.numpy_softmax if self.switches.numpy_softmax else None
        fused = self.switches.fused_attention
        self._sdpa = attention.grouped_sdpa(original, self.masks, self._rows, fused)
        # the draft-tree forward's attention under a mask, with this backend's softmax
        self.masked_attention = functools.partial(
            attention.masked_attention, rows=self._rows, fused=fused
        )
        self._attending: dict[type, type | None] = {}
        self._twins: Memo = {}
        self.softmax: Callable[[mx.array, float], mx.array] | None = (
            fastexp.make_softmax() if self.switches.fast_exp else None
        )
        self._rowpad: Any = None  # edgespec.cpu.rowpad, when its opt-in switch is on
        if self.switches.pad_rows:
            from edgespec.cpu import rowpad

            self._rowpad = rowpad

    @property
    def draft_pairs(self) -> bool:
        return self.switches.draft_pairs

    def model(self, model: Any) -> Any:
        """`model`'s twin with the optimised layers switched on (the same twin for the same model;
        `model` itself where none applies). Twins made by one backend share their modules: an MTP
        head's or a feature draft's reference to its target points at the target's twin when the
        target was twinned first."""
        if not isinstance(model, nn.Module) or not self.switches.rewrite_models():
            return model
        found = self._twins.get(id(model))
        if found is not None and found[0] is model:
            return found[1]
        made = twin(model, self._pick, self._twins)
        for _, module in made.named_modules():
            self._finish(module)
        return made

    def new_cache(self, model: Any) -> list[Any]:
        """make_prompt_cache(model) with rewindable window layers (edgespec/rewind.py), marked so
        that a twin's short multi-token forwards on it (verifies, catch-ups) take grouped
        attention when that is switched on."""
        cache = rewindable(make_prompt_cache(model))
        if self.switches.grouped_attention:
            attention.mark(cache)
        return cache

    # The draft-tree forward's pieces (the Engine hands them to edgespec/trees/forward.py): a
    # compiled llama block's parts around the attention (and `masked_attention`, set in __init__).
    block_parts = staticmethod(blocks.parts)

    def _pick(self, key: str, module: nn.Module) -> type | None:
        """The class `module`'s twin takes (None: its own)."""
        s = self.switches
        return (
            (s.pad_rows and self._rowpad.twin_class(module))
            or (s.table_rope and rope.twin_class(key, module))
            or (s.lean_ops and leanops.twin_class(module))
            or (s.compiled_blocks and blocks.twin_class(module))
            or (s.grouped_attention and self._attending_class(type(module)))
            or None
        )

    def _attending_class(self, cls: type) -> type | None:
        if cls not in self._attending:
            self._attending[cls] = attention.attending_class(cls, self._original, self._sdpa)
        return self._attending[cls]

    def _finish(self, module: nn.Module) -> None:
        """Hand a twin's optimised modules this backend's state."""
        if isinstance(module, rope.TableRoPE):
            module.tables = self.tables
        elif isinstance(module, blocks.CompiledBlock):
            module.attend = self._sdpa if self.switches.grouped_attention else self._original
        if self.switches.pad_rows:
            self._rowpad.pad_head(module)


# ------------------------------------------------------------------ twins
# A model's twin: new module objects over the very same parameter arrays, some of another class.
#
# The backend runs its optimised layers in a twin instead of changing the model it
# was given: mlx-lm's model object keeps its classes, its modules and its functions, so anything
# else that holds it (the bench's mlx-lm peer, a debugger, the caller) sees mlx-lm's model. The
# twin has the model's tree (same keys, same nesting, the same arrays, so no memory is copied) and
# each module's plain attributes (sizes, flags), and `pick(key, module)` names the class a module's
# twin takes (None: the module's own). A plain attribute that names a module of a model twinned
# with the same memo (an MTP head's `target`) is pointed at that module's twin.
#
#     twin(nn.Sequential(nn.Linear(2, 2)), lambda key, m: None, {})
#         -> a new nn.Sequential whose new nn.Linear holds the same weight array

Pick = Callable[[str, nn.Module], "type | None"]
Memo = dict[int, tuple[nn.Module, nn.Module]]  # id(module) -> (module, its twin)


def twin(model: nn.Module, pick: Pick, memo: Memo) -> nn.Module:
    """The twin of `model` (module docstring). `memo` maps the modules twinned so far to their
    twins; a module met again (shared, or twinned by an earlier call) keeps its first twin."""
    made: list[tuple[nn.Module, nn.Module]] = []
    out = _module("", model, pick, memo, made)
    for original, copy in made:
        for name, value in original.__dict__.items():
            found = memo.get(id(value)) if isinstance(value, nn.Module) else None
            if found is not None and found[0] is value:
                copy.__dict__[name] = found[1]
    return out


def _module(key: str, module: nn.Module, pick: Pick, memo: Memo, made: list) -> nn.Module:
    found = memo.get(id(module))
    if found is not None and found[0] is module:
        return found[1]
    cls: Any = pick(key, module) or type(module)
    copy = cls.__new__(cls)
    copy.__dict__.update(module.__dict__)
    copy.__dict__["_no_grad"] = set(module.__dict__.get("_no_grad", ()))
    memo[id(module)] = (module, copy)
    made.append((module, copy))
    for name, value in module.items():
        dict.__setitem__(copy, name, _value(name, value, pick, memo, made))
    return copy


def _value(key: str, value: Any, pick: Pick, memo: Memo, made: list) -> Any:
    """A child's twin: modules twinned, containers rebuilt, arrays and the rest shared."""
    if isinstance(value, nn.Module):
        return _module(key, value, pick, memo, made)
    if isinstance(value, list):
        return [_value(key, v, pick, memo, made) for v in value]
    if isinstance(value, tuple):
        return tuple(_value(key, v, pick, memo, made) for v in value)
    if isinstance(value, dict):
        return {k: _value(k, v, pick, memo, made) for k, v in value.items()}
    return value
