"""Load a target sharded over a group with mlx-lm's own machinery (what `sharded_load` does, from
a local folder: the model built lazily, `model.shard(group)` for tensor parallelism or
`model.model.pipeline(group)` for pipeline parallelism, then only this rank's weights read).

Tensor parallel (mlx-lm's `shard`: llama, qwen2, qwen3, qwen3_5, deepseek, gpt_oss and more):
each attention's q/k/v projections and the MLP's gate/up keep 1/N of their output rows, o_proj
and down_proj 1/N of their input columns and end in an all_sum, so every layer costs two
all-reduces and every rank ends with the same hidden state; the embedding, final norm and
output head stay whole on every rank. Heads are split between ranks, so the query and KV head
counts must both divide by N (SmolLM2-135M: 9 and 3, so N = 3, not 2).
Pipeline parallel (`model.model.pipeline`: deepseek_v41, ministral3, qwen3_5, ... in mlx-lm 0.32):
rank r holds a contiguous run of layers, hidden states pass rank to rank, and a final
all_gather gives every rank the last rank's output.

The backend policy is loading/folder.py's: on MLX's CPU backend quantized layers are dequantized to fp32
(lazily, before the split, so that a rank never materialises more than its share), on a GPU
weights stay as stored. EdgeSpec's CPU rewrites then apply as on a whole model where they are
exact: grouped attention and rotary tables work per local head, compiled llama blocks trace the
sharded block with its all-reduces inside (same bits as the block uncompiled, measured), and
lean Linear / row padding (applied by the Engine, edgespec/cpu/backend.py) leave the sharded layers alone (they only replace exact nn.Linear).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map
from mlx_lm.utils import load_model as mlx_load_model

from edgespec.device import kind as backend_kind
from edgespec.distributed.group import Group
from edgespec.errors import GroupError, ModelLoadError, one_line
from edgespec.loading import ProgressFn, report
from edgespec.loading.folder import (
    DTYPES,
    LoadedModel,
    cast_floats,
    context_window,
    dense_twin,
    load_tokenizer,
)
from edgespec.loading.resolve import resolve_model
from edgespec.loading.specs import Catalog

MODES = ("tensor", "pipeline")


def _mlx_lm() -> str:
    try:
        return f"mlx-lm {version('mlx-lm')}"
    except PackageNotFoundError:
        return "mlx-lm"


def supports(model: nn.Module) -> dict[str, bool]:
    """Which kinds of sharding mlx-lm implements for this model: {"tensor": ..., "pipeline": ...}."""
    inner = getattr(model, "model", None)
    return {"tensor": hasattr(model, "shard"), "pipeline": hasattr(inner, "pipeline")}


def _text_config(config: dict) -> dict:
    return config.get("text_config") or config


def divisible_sizes(config: dict, limit: int = 16) -> list[int]:
    """Group sizes 2..limit that divide the query heads, the KV heads and the MLP width."""
    c = _text_config(config)
    dims = [c.get("num_attention_heads"), c.get("num_key_value_heads"), c.get("intermediate_size")]
    known = [int(d) for d in dims if isinstance(d, int) and d > 0]
    return [n for n in range(2, limit + 1) if all(d % n == 0 for d in known)]


def check_shardable(config: dict, name: str, kinds: dict[str, bool], mode: str, size: int) -> None:
    """Raise GroupError (one line) unless `mode` can split this model over `size` ranks."""
    model_type = _text_config(config).get("model_type") or config.get("model_type", "?")
    if not any(kinds.values()):
        raise GroupError(
            f"{name} ({model_type}) cannot be sharded: {_mlx_lm()} implements neither tensor nor "
            "pipeline parallelism for it; run it on one machine"
        )
    if not kinds[mode]:
        other = next(k for k, ok in kinds.items() if ok)
        raise GroupError(
            f"{name} ({model_type}) has no {mode} parallelism in {_mlx_lm()}; use --shard {other}"
        )
    c = _text_config(config)
    if mode == "tensor":
        heads, kv = (
            c.get("num_attention_heads"),
            c.get("num_key_value_heads") or c.get("num_attention_heads"),
        )
        if size not in divisible_sizes(config, max(size, 2)):
            fits = ", ".join(str(n) for n in divisible_sizes(config)[:6]) or "none"
            raise GroupError(
                f"{name} has {heads} attention heads, {kv} KV heads and an MLP of "
                f"{c.get('intermediate_size')}: tensor parallelism needs all three divisible by "
                f"the group size {size} (sizes that fit: {fits})"
            )
    layers = c.get("num_hidden_layers")
    if mode == "pipeline" and isinstance(layers, int) and layers < size:
        raise GroupError(f"{name} has {layers} layers, fewer than the {size} pipeline stages")


def _dense_lazily(model: nn.Module) -> None:
    """weights.dequantize_model without its final eval: the fp32 weights stay lazy until sharded."""
    model.update_modules(tree_map(dense_twin, model.leaf_modules(), is_leaf=nn.Module.is_module))
    halfs = (mx.float16, mx.bfloat16)
    model.update(
        tree_map(lambda a: a.astype(mx.float32) if a.dtype in halfs else a, model.parameters())
    )


def shard_model(path: Path, group: Group, mode: str, *, dequantize: bool) -> tuple[nn.Module, dict]:
    """Build `path`'s model lazily, split it over `group` and read this rank's weights."""
    if mode not in MODES:
        raise GroupError(f"unknown --shard {mode!r}; choose tensor or pipeline")
    try:
        model, config = mlx_load_model(path, lazy=True, strict=False)
    except Exception as exc:  # mlx-lm / safetensors raise many kinds
        raise ModelLoadError(f"cannot load weights from {path}: {one_line(exc)}") from None
    check_shardable(config, path.name, supports(model), mode, group.size)
    if dequantize:
        _dense_lazily(model)
    try:
        if mode == "tensor":
            model.shard(group.group)  # type: ignore[operator]
        else:
            model.model.pipeline(group.group)  # type: ignore[union-attr,operator]
        mx.eval(model.parameters())
    except (ValueError, RuntimeError) as exc:
        raise GroupError(
            f"cannot shard {path.name} over {group.size} ranks: {one_line(exc)}"
        ) from None
    return model, config


def load_sharded(
    spec: str,
    group: Group,
    mode: str = "tensor",
    *,
    on_progress: ProgressFn | None = None,
    catalog: Catalog | None = None,
    dtype: str | None = None,
) -> LoadedModel:
    """load.load_model for a target split over `group` (size > 1): the same resolution, backend
    policy, dtype and context window, the weights of this rank's shard only. Every rank must call
    it (the load ends on a barrier)."""
    path = resolve_model(spec, on_progress=on_progress, catalog=catalog)
    report(on_progress, f"loading {spec} ({mode} parallel, rank {group.rank}/{group.size})")
    model, config = shard_model(path, group, mode, dequantize=backend_kind().dequantizes)
    tokenizer = load_tokenizer(path, config, None)
    if dtype in DTYPES:
        cast_floats(model, dtype)
    group.barrier()
    report(on_progress, f"loaded {spec}", 1.0)
    return LoadedModel(model, tokenizer, spec, path, context_window(config), config)


def describe(model: Any) -> dict[str, Any]:
    """What this rank holds, for results.json: {"heads": local query heads of layer 0, ...}."""
    layers = getattr(model, "layers", [])
    first = next((layer for layer in layers if layer is not None), None)
    attn = getattr(first, "self_attn", None)
    return {
        "layers": sum(1 for layer in layers if layer is not None),
        "heads": getattr(attn, "n_heads", None),
        "kv_heads": getattr(attn, "n_kv_heads", None),
    }
