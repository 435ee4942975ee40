"""A model's twin: new module objects over the very same parameter arrays, some of another class.

The CPU backend (backend.py) runs its optimised layers in a twin instead of changing the model it
was given: mlx-lm's model object keeps its classes, its modules and its functions, so anything
else that holds it (the bench's mlx-lm peer, a debugger, the caller) sees mlx-lm's model. The
twin has the model's tree (same keys, same nesting, the same arrays, so no memory is copied) and
each module's plain attributes (sizes, flags), and `pick(key, module)` names the class a module's
twin takes (None: the module's own). A plain attribute that names a module of a model twinned
with the same memo (an MTP head's `target`) is pointed at that module's twin.

    twin(nn.Sequential(nn.Linear(2, 2)), lambda key, m: None, {})
        -> a new nn.Sequential whose new nn.Linear holds the same weight array
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.nn as nn

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
