"""The CPU backend: one object, built once per Engine on MLX's CPU backend (edgespec/backend.py
`for_device`), that owns EdgeSpec's optimised forwards there.

    cpu = CpuBackend()                    # the switches read from EDGESPEC_CPU_OPT, once
    fast = cpu.model(loaded.model)        # the twin that runs the optimised layers
    state = KVState(fast, "target", cpu.new_cache)
    warp(logits, sampling, cpu.softmax)   # the sampling softmax

`model(m)` returns m's twin (`twin`, at the end): new module objects over the same parameter
arrays, with rotary tables (rope.py), lean Linear / RMSNorm (leanops.py), compiled llama blocks
(blocks.py) and attention modules built with the grouped attention (heads.py, attention.py). The
model it was given is left as it is: its classes, its modules, mlx-lm's functions. So the
bench's mlx-lm peer, which runs `loaded.model`, runs mlx-lm's own code by construction, and each
twin's outputs keep the model's bits (tests/cpu/test_rope.py, test_leanops.py, test_blocks.py
compare a twin with its model). The state the optimised layers keep (rotary tables, the causal
mask of the latest forward, the compiled traces) belongs to this object and its twins, never to
a module of EdgeSpec or mlx-lm.

Switches (`Switches.from_environment`): every rewrite is on unless EDGESPEC_CPU_OPT says
otherwise: `0` turns them all off, a comma list of `-name` / `+name` turns single ones off / on
(`EDGESPEC_CPU_OPT=-fused_attention,-numpy_softmax`; `+draft_pairs` steps in pairs under any
BLAS). The decoding core (loop, cache, drafting, sampling) never imports this package: the Engine
hands it these pieces.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import scaled_dot_product_attention

from edgespec.backend import Backend
from edgespec.blas import active as active_blas
from edgespec.cpu import attention, blocks, fastexp, heads, leanops, rope
from edgespec.cpu.pairs import PairedSteps
from edgespec.drafting.token import DraftSteps
from edgespec.errors import ConfigError
from edgespec.switches import CPU_OPT

__all__ = ["CpuBackend", "Switches"]


@dataclasses.dataclass(frozen=True)
class Switches:
    """Which rewrites a backend applies (all off: EDGESPEC_CPU_OPT=0)."""

    grouped_attention: bool = False
    numpy_softmax: bool = False  # rides on the grouped path
    fused_attention: bool = False  # asked for (rides on NumPy's softmax); fused.kernel() builds
    table_rope: bool = False
    lean_ops: bool = False
    compiled_blocks: bool = False  # where MLX can compile (fastexp.compiler_works)
    fast_exp: bool = False  # where MLX can compile
    draft_pairs: bool = False  # on under MKL (pairs.py)

    @classmethod
    def from_environment(cls, value: str | None = None) -> Switches:
        """The switches EDGESPEC_CPU_OPT (or `value`) asks for (module docstring); ConfigError
        for a name that is not a rewrite's.

            Switches.from_environment("-fused_attention").fused_attention -> False
        """
        value = (os.environ.get(CPU_OPT, "") if value is None else value).strip()
        names = [f.name for f in dataclasses.fields(cls)]
        asked = dict.fromkeys(names, value != "0")
        asked["draft_pairs"] = value != "0" and active_blas() in ("mkl", "mkl-fast")
        for item in filter(None, (v.strip() for v in value.split(","))):
            if item in ("0", "1"):
                continue
            if item[:1] not in "+-" or item[1:] not in asked:
                raise ConfigError(
                    f"{CPU_OPT}={value!r}: each entry is 0, 1, or +name / -name with a name "
                    f"from {', '.join(names)}"
                )
            asked[item[1:]] = item[0] == "+"
        compiles = (
            fastexp.compiler_works() if asked["compiled_blocks"] or asked["fast_exp"] else False
        )
        grouped = asked["grouped_attention"]
        return cls(
            grouped_attention=grouped,
            numpy_softmax=grouped and asked["numpy_softmax"],
            fused_attention=grouped and asked["numpy_softmax"] and asked["fused_attention"],
            table_rope=asked["table_rope"],
            lean_ops=asked["lean_ops"],
            compiled_blocks=asked["compiled_blocks"] and compiles,
            fast_exp=asked["fast_exp"] and compiles,
            draft_pairs=asked["draft_pairs"],
        )

    def recorded(self) -> dict[str, bool]:
        """What results.json records (`environment.cpu_rewrites`); the fused attention counts as
        on once its kernel is built (here, when not built yet: before a bench's first timing)."""
        out = dataclasses.asdict(self)
        if self.fused_attention:
            from edgespec.cpu import fused

            out["fused_attention"] = fused.kernel() is not None
        return out

    def rewrite_models(self) -> bool:
        """Whether any of them changes how a model runs (else `model` returns it as it is)."""
        s = self
        return s.grouped_attention or s.table_rope or s.lean_ops or s.compiled_blocks


class CpuBackend(Backend):
    """EdgeSpec's optimised forwards for MLX's CPU backend (module docstring). Not thread-safe,
    like the Engine that holds it."""

    name = "cpu"
    dequantizes = True
    compiles_per_shape = False
    batches_plain_first = True

    def __init__(self, switches: Switches | None = None):
        self.switches = switches if switches is not None else Switches.from_environment()
        s = self.switches
        self.tables = rope.Tables()
        self.masks = attention.Masks()
        rows = attention.numpy_softmax if s.numpy_softmax else None
        original = scaled_dot_product_attention
        # the attention the twins are built with (heads.py, blocks.py)
        self.attend = (
            attention.grouped_sdpa(original, self.masks, rows, s.fused_attention)
            if s.grouped_attention
            else original
        )
        # the draft-tree forward's attention under a mask, with this backend's softmax
        self.masked_attention: Callable[..., mx.array] = (
            functools.partial(attention.masked_attention, rows=rows, fused=s.fused_attention)
            if s.grouped_attention
            else _mlx_masked
        )
        self._attending: dict[type, type | None] = {}
        self._twins: Memo = {}
        self.softmax = fastexp.make_softmax() if s.fast_exp else None
        self.draft_steps: DraftSteps = PairedSteps() if s.draft_pairs else DraftSteps()

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

    def kernels(self) -> Any:
        """The draft-tree (and packed) forward's pieces: this backend's attention under a mask
        and a compiled llama block's parts around the attention."""
        from edgespec.trees.forward import Kernels

        return Kernels(self.masked_attention, blocks.parts)

    def recorded(self) -> dict[str, bool]:
        return self.switches.recorded()

    def _pick(self, key: str, module: nn.Module) -> type | None:
        """The class `module`'s twin takes (None: its own)."""
        s = self.switches
        return (
            (s.table_rope and rope.twin_class(key, module))
            or (s.lean_ops and leanops.twin_class(module))
            or (s.compiled_blocks and blocks.twin_class(module))
            or (s.grouped_attention and heads.twin_class(module, self._attending))
            or None
        )

    def _finish(self, module: nn.Module) -> None:
        """Hand a twin's optimised modules this backend's state and attention."""
        if isinstance(module, rope.TableRoPE):
            module.tables = self.tables
        elif isinstance(module, blocks.CompiledBlock | heads.GroupedAttention):
            module.attend = self.attend


def _mlx_masked(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, allowed: mx.array, cache: Any
) -> mx.array:
    """MLX's attention under a mask (grouped attention switched off)."""
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=allowed)


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
