"""Load a model for this backend, and a target with its draft as a pair that can speculate (the
same tokenizer, caches that can go back to an earlier position: the checks at the end).

Backend policy: edgespec/loading/folder.py (dequantized fp32 on the CPU backend, quantized on a
GPU). Resolving a spec to a folder: edgespec/loading/resolve.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model as mlx_load_model

from edgespec.architectures import architecture_of, head_apart
from edgespec.architectures.token_draft import input_embedding, load_draft
from edgespec.cache import check_trimmable as check_cache
from edgespec.cache import common_prefix
from edgespec.config import MTP_DRAFT
from edgespec.device import kind as backend_kind
from edgespec.errors import ConfigError, ModelLoadError, TokenizerMismatchError, one_line
from edgespec.families import family_of
from edgespec.loading import ProgressFn, report
from edgespec.loading.folder import (
    DTYPES,
    LoadedModel,
    cast_floats,
    context_window,
    dequantize_model,
    is_quantized,
    load_tokenizer,
    quantize_model,
    read_config,
)
from edgespec.loading.resolve import resolve_model
from edgespec.loading.specs import (
    Catalog,
    check_draft_available,
    check_mlx_lm,
    load_catalog,
    pair_specs,
)

if TYPE_CHECKING:
    from edgespec.distributed.group import Group


def _load_weights(
    path: Path, config: dict, embedding: nn.Module | None = None, target: nn.Module | None = None
) -> tuple[nn.Module, dict]:
    """Build the module from config and load its weights; any failure names the folder. Only
    the architecture the config names is imported (edgespec/architectures/)."""

    if not any(path.glob("*.safetensors")):
        raise ModelLoadError(f"{path} has no *.safetensors weights")
    try:
        kind = architecture_of(config)
        if kind == "token_draft":
            return load_draft(path, embedding)
        if kind == "eagle":
            from edgespec.architectures.eagle import load_eagle

            return load_eagle(path, target)
        if kind == "block":
            from edgespec.architectures.block_model import load_block

            return load_block(path, target)
        if kind == "dflash2":
            from edgespec.architectures.dflash2_model import load_dflash2

            return load_dflash2(path, target)
        if kind == "gemma4_assistant":  # Gemma 4's `-assistant` drafters read their target's states
            from edgespec.architectures.gemma4_assistant import load_assistant

            return load_assistant(path, config, target)
        return mlx_load_model(path)
    except ConfigError:  # already one line a user can act on (e.g. a draft for another target)
        raise
    except Exception as e:  # mlx / safetensors / mlx-lm raise many kinds, often multi-line
        raise ModelLoadError(f"cannot load weights from {path}: {_why(e)}") from None


def _why(e: Exception) -> str:
    """One line that names what is wrong: the key a KeyError lacks, the parameters a
    "Missing N parameters: / Received N parameters not in model:" message lists on its next
    lines, else the message's first line."""
    if isinstance(e, KeyError) and e.args:
        return f"no {e.args[0]!r} in its config.json or weights"
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return " ".join(lines)[:300]
    return one_line(e)


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
    target: the loaded target model, for a feature draft (edgespec.architectures.eagle: it uses the target's
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
    if backend_kind().dequantizes if dequantize is None else dequantize:
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
    if family_of(d).reads_features:
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


def _own_head(
    t: LoadedModel,
    pair_name: str | None,
    cat: Catalog,
    draft_bits: int | None,
    dtype: str | None,
    on_progress: ProgressFn | None,
) -> LoadedModel:
    """The draft "mtp": the target's own MTP head (edgespec/architectures/mtp.py), or, for a
    target whose head ships apart (a Gemma 4's `-assistant`), the pair's draft when it is one."""
    own = cat.pair(pair_name).draft if pair_name is not None else MTP_DRAFT
    if not head_apart(t.config) or own == MTP_DRAFT:
        from edgespec.loading.mtp_checkpoint import load_mtp_draft

        return load_mtp_draft(t, dtype)  # a Gemma 4 target without such a pair: one line why
    d = _load_draft(own, t, cat, draft_bits, dtype, on_progress)
    if not family_of(d).own_head:
        raise ConfigError(
            f"--method mtp: pair {pair_name!r} drafts with {own}, not the target's own head "
            "(a Gemma 4 -assistant); use --method draft or hybrid"
        )
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
    check_mlx_lm(pair_name, cat)
    if with_draft and draft_spec is not None:
        check_draft_available(draft_spec, pair_name, cat)
    if group is not None and group.size > 1:
        from edgespec.loading.shard import load_sharded

        t = load_sharded(
            target_spec, group, shard, on_progress=on_progress, catalog=cat, dtype=dtype
        )
    else:
        t = load_model(target_spec, on_progress=on_progress, catalog=cat, dtype=dtype)
    if not with_draft or draft_spec is None:
        return t, None
    if draft_spec == MTP_DRAFT:  # the target's own MTP head
        d = _own_head(t, pair_name, cat, draft_bits, dtype, on_progress)
    else:
        d = _load_draft(draft_spec, t, cat, draft_bits, dtype, on_progress)
    check_trimmable(t.model, t.name)
    if not family_of(d).reads_target_cache:  # a draft with a cache of its own
        check_trimmable(d.model, d.name)
    return t, d


# ------------------------------------------------------------------ whether a pair can speculate

PROBES = (
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces\tand\ttabs\nnew line",
    "def f(x):\n    return x ** 2  # 12345",
    "Émile a mangé 3 crêpes à Paris. 東京は大きい。 Привет! 🙂",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>",
)


def _id_to_token(tokenizer: Any) -> dict[int, str]:
    return {i: t for t, i in tokenizer.get_vocab().items()}


def check_tokenizers(target: Any, draft: Any, probes: tuple[str, ...] = PROBES) -> None:
    """Raise TokenizerMismatchError unless target and draft tokenize alike.

    target, draft: LoadedModel-like records (tokenizer, name). Two checks: (1) the same ids for every probe string; (2) the same token at every id of the
    shared vocabulary range (tables may be padded past the real vocabulary, so only
    min(len_t, len_d) ids are compared)."""
    tt, dt = target.tokenizer, draft.tokenizer
    if tt is dt:  # a draft without tokenizer files shares its target's (loading.folder)
        return
    who = f"target {target.name!r} and draft {draft.name!r}"
    for text in probes:
        a, b = tt.encode(text, add_special_tokens=False), dt.encode(text, add_special_tokens=False)
        if a != b:
            i = common_prefix(a, b)
            ta = tt.decode(a[i : i + 1]) if i < len(a) else "<end>"
            tb = dt.decode(b[i : i + 1]) if i < len(b) else "<end>"
            raise TokenizerMismatchError(
                f"{who} tokenize {text[:30]!r} differently: token {i} is {ta!r} (id {a[i] if i < len(a) else '-'}) "
                f"vs {tb!r} (id {b[i] if i < len(b) else '-'})"
            )
    va, vb = _id_to_token(tt), _id_to_token(dt)
    for i in range(min(len(va), len(vb))):
        if va.get(i) != vb.get(i):
            raise TokenizerMismatchError(
                f"{who} have different vocabularies: id {i} is {va.get(i)!r} vs {vb.get(i)!r}"
            )


def check_trimmable(model: nn.Module, name: str = "model") -> None:
    """Raise CacheNotTrimmableError if the model's prompt cache has layers that can be neither
    rewound nor restored (edgespec/rewind.py: attention, sliding-window and recurrent layers can)."""
    check_cache(make_prompt_cache(model), name)
