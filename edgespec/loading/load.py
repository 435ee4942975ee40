"""Load a model for this backend, and a target with its draft as a pair that can speculate.

Backend policy: edgespec/loading/weights.py (dequantized fp32 on the CPU backend, quantized on a
GPU). Resolving a spec to a folder: edgespec/loading/resolve.py.
"""

from __future__ import annotations

from pathlib import Path

import mlx.nn as nn
from mlx_lm.utils import load_model as mlx_load_model

from edgespec.architectures.gemma4_assistant import Gemma4Assistant, is_assistant, load_assistant
from edgespec.config import MTP_DRAFT
from edgespec.cpu.switch import on_cpu
from edgespec.distributed.group import Group
from edgespec.drafting.block import is_block, load_block
from edgespec.drafting.draft_model import MODEL_TYPE, input_embedding, load_draft
from edgespec.drafting.eagle import EagleModel, is_eagle, load_eagle
from edgespec.errors import ConfigError, ModelLoadError, one_line
from edgespec.loading.catalog import Catalog, load_catalog
from edgespec.loading.checks import check_tokenizers, check_trimmable
from edgespec.loading.folder import LoadedModel, context_window, load_tokenizer, read_config
from edgespec.loading.mtp import load_mtp_draft
from edgespec.loading.progress import ProgressFn, report
from edgespec.loading.resolve import resolve_model
from edgespec.loading.shard import load_sharded
from edgespec.loading.specs import check_draft_available, pair_specs
from edgespec.loading.weights import (
    DTYPES,
    cast_floats,
    dequantize_model,
    is_quantized,
    quantize_model,
)


def _load_weights(
    path: Path, config: dict, embedding: nn.Module | None = None, target: nn.Module | None = None
) -> tuple[nn.Module, dict]:
    """Build the module from config and load its weights; any failure names the folder."""

    if not any(path.glob("*.safetensors")):
        raise ModelLoadError(f"{path} has no *.safetensors weights")
    try:
        if config.get("model_type") == MODEL_TYPE:
            return load_draft(path, embedding)
        if is_eagle(config):
            return load_eagle(path, target)
        if is_block(config):
            return load_block(path, target)
        if is_assistant(config):  # Gemma 4's `-assistant` drafters read their target's states
            return load_assistant(path, config, target)
        return mlx_load_model(path)
    except ConfigError:  # already one line a user can act on (e.g. a draft for another target)
        raise
    except Exception as e:  # mlx / safetensors / mlx-lm raise many kinds, often multi-line
        raise ModelLoadError(f"cannot load weights from {path}: {one_line(e)}") from None


def load_model(
    spec: str,
    *,
    quantize_bits: int | None = None,
    on_progress: ProgressFn | None = None,
    dequantize: bool | None = None,
    tokenizer_fallback: Path | LoadedModel | None = None,
    catalog: Catalog | None = None,
    embedding: nn.Module | None = None,
    target: nn.Module | None = None,
    dtype: str | None = None,
) -> LoadedModel:
    """Resolve and load one model for this backend.

    embedding: the target's input embedding, for an EdgeSpec draft that shares it.
    target: the loaded target model, for a feature draft (edgespec.drafting.eagle: it uses the target's
    embedding and output head).
    quantize_bits: quantize an unquantized model to this many bits (GPU only; ignored when the
    model is dequantized for the CPU). dequantize: None = on the CPU backend only.
    tokenizer_fallback: if `spec` ships no tokenizer, the folder whose tokenizer to load, or the
    loaded model whose tokenizer to share (a draft shares its target's).
    dtype: the float parameters' dtype after loading (a `DTYPES` name). None or "auto": float32 on
    the CPU backend (dequantized), as stored on a GPU backend.
    """
    if dtype not in (None, "auto", *DTYPES):
        raise ConfigError(f"unknown dtype {dtype!r}; choose from auto, {', '.join(DTYPES)}")
    path = resolve_model(spec, on_progress=on_progress, catalog=catalog)
    report(on_progress, f"loading {spec}")
    config = read_config(path)
    model, config = _load_weights(path, config, embedding, target)
    tokenizer = load_tokenizer(path, config, tokenizer_fallback)
    if on_cpu() if dequantize is None else dequantize:
        dequantize_model(model)
    elif quantize_bits and not is_quantized(model):
        quantize_model(model, quantize_bits)
    if dtype in DTYPES:
        cast_floats(model, dtype)
    report(on_progress, f"loaded {spec}", 1.0)
    return LoadedModel(model, tokenizer, spec, path, context_window(config), config)


def peer_draft_spec(
    target: str | None, draft: str | None, pair: str | None, catalog: Catalog | None = None
) -> str | None:
    """The token draft a peer should use for the pair these arguments name: the pair's
    `token_draft` when its own draft is used (no --draft given), else None."""
    cat = catalog or load_catalog()
    _, _, pair_name = pair_specs(target, draft, pair, cat)
    if draft is not None or pair_name is None:
        return None
    return cat.pair(pair_name).token_draft


def load_token_draft(
    spec: str, target: LoadedModel, *, draft_bits: int | None = 4, dtype: str | None = None
) -> LoadedModel:
    """Load a token draft for `target` (for a peer such as mlx-lm when the pair's own draft is a
    feature draft), checked like any draft: same tokenizer, trimmable cache, not a feature draft."""

    cat = load_catalog()
    check_draft_available(spec, None, cat)
    d = _load_draft(spec, target, cat, draft_bits, dtype)
    if isinstance(d.model, EagleModel):
        raise ConfigError(f"{spec} is a feature draft; a peer needs a token draft")
    check_trimmable(d.model, d.name)
    return d


def _load_draft(
    spec: str,
    t: LoadedModel,
    cat: Catalog,
    draft_bits: int | None,
    dtype: str | None,
    on_progress: ProgressFn | None = None,
) -> LoadedModel:
    """Load draft `spec` for the loaded target `t` (its embedding, its tokenizer as a fallback,
    its model for a feature draft) and check that the two share a tokenizer."""
    d = load_model(
        spec,
        quantize_bits=draft_bits or None,
        on_progress=on_progress,
        tokenizer_fallback=t,
        catalog=cat,
        embedding=input_embedding(t.model),
        target=t.model,
        dtype=dtype,
    )
    report(on_progress, "checking the pair")
    check_tokenizers(t, d)
    return d


def load_pair(
    target: str | None = None,
    draft: str | None = None,
    pair: str | None = None,
    *,
    draft_bits: int | None = 4,
    on_progress: ProgressFn | None = None,
    with_draft: bool = True,
    catalog: Catalog | None = None,
    dtype: str | None = None,
    group: Group | None = None,
    shard: str = "tensor",
) -> tuple[LoadedModel, LoadedModel | None]:
    """Load a target and (unless with_draft=False or none is named) its draft, then check that
    they can speculate: same tokenizer, trimmable caches. All None -> the catalogue's default pair.

    A draft without its own tokenizer files borrows the target's; the draft "mtp" is the
    target's own MTP head (a Qwen3.5 checkpoint's `mtp.*` weights). draft_bits: quantize an
    unquantized draft at load on GPU backends (None or 0 = leave it). dtype: both models' float
    parameters (see `load_model`). group: a group of more than one rank splits the target over
    it, `shard` "tensor" or "pipeline" parallel (loading/shard.py); the draft stays whole on
    every rank."""
    cat = catalog or load_catalog()
    target_spec, draft_spec, pair_name = pair_specs(target, draft, pair, cat)
    if with_draft and draft_spec is not None:
        check_draft_available(draft_spec, pair_name, cat)
    if group is not None and group.size > 1:
        t = load_sharded(
            target_spec, group, shard, on_progress=on_progress, catalog=cat, dtype=dtype
        )
    else:
        t = load_model(target_spec, on_progress=on_progress, catalog=cat, dtype=dtype)
    if not with_draft or draft_spec is None:
        return t, None
    if draft_spec == MTP_DRAFT:  # the target's own MTP head (edgespec/drafting/mtp.py)
        d = load_mtp_draft(t, dtype)
    else:
        d = _load_draft(draft_spec, t, cat, draft_bits, dtype, on_progress)
    check_trimmable(t.model, t.name)
    if not isinstance(d.model, Gemma4Assistant):  # an assistant has no cache: it reads the target's
        check_trimmable(d.model, d.name)
    return t, d
