"""Resolve a model spec to a folder, load it for this backend, and check that a pair can speculate.

A spec is, in this order: a local folder, a local *.gguf file (converted once into the cache, keyed
by its hash), a catalogue model name (pulled if needed), or a Hugging Face repo id (hub cache via
snapshot_download; HF_HUB_OFFLINE respected).

Backend policy (FACTS.md): 4-bit matmuls are the fast path on Metal/CUDA but a naive, slow kernel
on the CPU backend, and fp16/bf16 compute on CPU is slow too. So on a GPU quantized weights stay
quantized (and an unquantized draft is quantized to `draft_bits`); on the CPU every quantized layer
is dequantized and every float weight cast to fp32 at load time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map

from edgespec.cpu.blas import pads_single_rows
from edgespec.cpu.rowpad import pad_single_rows
from edgespec.drafting.draft_model import input_embedding
from edgespec.errors import (
    CacheNotTrimmableError,
    ConfigError,
    DownloadError,
    ModelLoadError,
    ModelNotFoundError,
    TokenizerMismatchError,
)
from edgespec.loading import paths
from edgespec.loading.catalog import Catalog, is_repo_id, load_catalog

if TYPE_CHECKING:
    from edgespec.distributed.group import Group

ProgressFn = Callable[[str, "float | None"], None]
DEFAULT_CONTEXT = 2048
_HF_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken", "LICENSE*"]
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
PROBES = (
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces\tand\ttabs\nnew line",
    "def f(x):\n    return x ** 2  # 12345",
    "Émile a mangé 3 crêpes à Paris. 東京は大きい。 Привет! 🙂",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>",
)


@dataclass
class LoadedModel:
    """A model ready to run: weights, tokenizer, where it came from and its context window."""

    model: nn.Module
    tokenizer: Any  # mlx_lm.tokenizer_utils.TokenizerWrapper
    name: str
    path: Path
    context_window: int
    config: dict


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:300]


def _report(on_progress: ProgressFn | None, stage: str, fraction: float | None = None) -> None:
    if on_progress is not None:
        on_progress(stage, fraction)


# ----------------------------------------------------------------------------- resolving


def resolve_model(
    spec: str, *, on_progress: ProgressFn | None = None, catalog: Catalog | None = None
) -> Path:
    """Turn a spec into a local model folder (downloading / converting once if needed)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} has no config.json (not a model folder)")
        return path
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return _resolve_gguf(path, on_progress)
        raise ModelLoadError(f"{path} is a file but not a .gguf model (pass a model folder)")
    cat = catalog or load_catalog()
    if spec in cat.models:
        return _resolve_catalogue(spec, cat, on_progress)
    if is_repo_id(spec):
        return _resolve_hf(spec, on_progress)
    raise ModelNotFoundError(
        f"model {spec!r} not found: not a folder, .gguf file, catalogue name or Hugging Face repo id"
    )


def _resolve_gguf(path: Path, on_progress: ProgressFn | None) -> Path:
    from edgespec.loading.gguf import convert_gguf, sha256_file

    _report(on_progress, f"hashing {path.name}")
    digest = sha256_file(path)
    out = paths.gguf_cache_dir(digest)
    if not (out / "config.json").is_file():
        _report(on_progress, f"converting {path.name} to MLX (once)")
        try:
            convert_gguf(path, out, sha256=digest)
        except OSError as e:
            raise ModelLoadError(f"cannot convert {path}: {e.strerror or e}") from None
    return out


def _resolve_catalogue(name: str, cat: Catalog, on_progress: ProgressFn | None) -> Path:
    from edgespec.loading.pull import pull

    entry = cat.model(name)
    if entry.local is not None:
        if not entry.available:
            raise ModelNotFoundError(
                f"catalogue model {name!r} is not available yet ({entry.local} has no config.json)"
            )
        return entry.local
    return pull(name, on_progress=on_progress, catalog=cat)


def _resolve_hf(repo: str, on_progress: ProgressFn | None) -> Path:
    """snapshot_download from the hub cache or the network; errors become one-line typed errors."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import is_offline_mode
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError

    _report(on_progress, f"fetching {repo} from Hugging Face")
    offline = is_offline_mode()
    try:
        return Path(snapshot_download(repo, allow_patterns=_HF_PATTERNS))
    except RepositoryNotFoundError:
        raise ModelNotFoundError(
            f"Hugging Face repo {repo!r} does not exist (or is private)"
        ) from None
    except LocalEntryNotFoundError as e:
        if offline:
            raise ModelNotFoundError(
                f"{repo} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set"
            ) from None
        raise DownloadError(f"cannot download {repo} from Hugging Face: {_one_line(e)}") from None
    except KeyboardInterrupt:
        raise DownloadError(f"download of {repo} interrupted") from None
    except Exception as e:  # network, disk, permission
        raise DownloadError(f"cannot download {repo} from Hugging Face: {_one_line(e)}") from None


# ----------------------------------------------------------------------------- backend policy


def _dense(m: nn.Module) -> nn.Module:
    """A float32 dense twin of a quantized layer (other modules returned unchanged)."""
    if not isinstance(m, nn.QuantizedLinear | nn.QuantizedEmbedding):
        return m
    biases = m.get("biases")
    # fp16 arithmetic is slow on the CPU: dequantize with fp32 scales/biases (3x faster)
    w = mx.dequantize(
        m.weight,
        m.scales.astype(mx.float32),
        None if biases is None else biases.astype(mx.float32),
        group_size=m.group_size,
        bits=m.bits,
        mode=getattr(m, "mode", "affine"),
    ).astype(mx.float32)
    if isinstance(m, nn.QuantizedEmbedding):
        out: nn.Module = nn.Embedding(w.shape[0], w.shape[1])
    else:
        out = nn.Linear(w.shape[1], w.shape[0], bias="bias" in m)
        if "bias" in m:
            out.bias = m.bias.astype(mx.float32)
    out.weight = w
    return out


def dequantize_model(model: nn.Module) -> nn.Module:
    """In place: every QuantizedLinear / QuantizedEmbedding -> fp32 dense; fp16/bf16 -> fp32."""
    leaves = tree_map(_dense, model.leaf_modules(), is_leaf=nn.Module.is_module)
    model.update_modules(leaves)
    halfs = (mx.float16, mx.bfloat16)
    model.update(
        tree_map(lambda a: a.astype(mx.float32) if a.dtype in halfs else a, model.parameters())
    )
    mx.eval(model.parameters())
    return model


def is_quantized(model: nn.Module) -> bool:
    return any(
        isinstance(m, nn.QuantizedLinear | nn.QuantizedEmbedding) for _, m in model.named_modules()
    )


def quantize_model(model: nn.Module, bits: int) -> nn.Module:
    """In place: quantize every Linear/Embedding whose input size divides a group size (64, else
    32); layers that divide neither stay dense (nn.quantize needs divisibility)."""

    def group_for(m: nn.Module) -> int | None:
        if not hasattr(m, "to_quantized") or isinstance(
            m, nn.QuantizedLinear | nn.QuantizedEmbedding
        ):
            return None
        dims = m.weight.shape[-1]
        return next((g for g in (64, 32) if dims % g == 0), None)

    def predicate(_path: str, m: nn.Module) -> bool | dict:
        g = group_for(m)
        return False if g is None else {"group_size": g, "bits": bits}

    nn.quantize(model, group_size=64, bits=bits, class_predicate=predicate)
    mx.eval(model.parameters())
    return model


DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def cast_floats(model: nn.Module, dtype: str) -> nn.Module:
    """In place: every floating-point parameter (norms, dense weights, quantization scales and
    biases) to `dtype`; packed integer weights stay as they are."""
    to = DTYPES[dtype]
    model.update(
        tree_map(
            lambda a: a.astype(to) if mx.issubdtype(a.dtype, mx.floating) else a,
            model.parameters(),
        )
    )
    mx.eval(model.parameters())
    return model


def on_cpu() -> bool:
    """True when MLX computes on the CPU backend (no Metal / CUDA device is the default)."""
    return mx.default_device().type == mx.DeviceType.cpu


# ----------------------------------------------------------------------------- loading


def _read_config(path: Path) -> dict:
    try:
        return json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"{path} has no config.json (not a model folder)") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path / 'config.json'} is not valid JSON: {_one_line(e)}") from None


def _load_weights(
    path: Path, config: dict, embedding: nn.Module | None = None, target: nn.Module | None = None
) -> tuple[nn.Module, dict]:
    """Build the module from config and load its weights; any failure names the folder."""
    from mlx_lm.utils import load_model as mlx_load_model

    from edgespec.drafting.draft_model import MODEL_TYPE, load_draft
    from edgespec.drafting.eagle import is_eagle, load_eagle

    if not any(path.glob("*.safetensors")):
        raise ModelLoadError(f"{path} has no *.safetensors weights")
    try:
        if config.get("model_type") == MODEL_TYPE:
            return load_draft(path, embedding)
        if is_eagle(config):
            return load_eagle(path, target)
        return mlx_load_model(path)
    except Exception as e:  # mlx / safetensors / mlx-lm raise many kinds, often multi-line
        raise ModelLoadError(f"cannot load weights from {path}: {_one_line(e)}") from None


def _load_tokenizer(path: Path, config: dict, fallback: Path | None) -> Any:
    from mlx_lm.utils import load_tokenizer

    source = path if any((path / f).is_file() for f in _TOKENIZER_FILES) else fallback
    if source is None:
        raise ModelLoadError(f"{path} has no tokenizer (tokenizer.json / tokenizer_config.json)")
    try:
        return load_tokenizer(source, eos_token_ids=config.get("eos_token_id"))
    except Exception as e:
        raise ModelLoadError(f"cannot load the tokenizer of {source}: {_one_line(e)}") from None


def load_model(
    spec: str,
    *,
    quantize_bits: int | None = None,
    on_progress: ProgressFn | None = None,
    dequantize: bool | None = None,
    tokenizer_fallback: Path | None = None,
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
    tokenizer_fallback: folder whose tokenizer to use if `spec` ships none (e.g. a draft).
    dtype: the float parameters' dtype after loading (a `DTYPES` name). None or "auto": float32 on
    the CPU backend (dequantized), as stored on a GPU backend.
    """
    if dtype not in (None, "auto", *DTYPES):
        raise ConfigError(f"unknown dtype {dtype!r}; choose from auto, {', '.join(DTYPES)}")
    path = resolve_model(spec, on_progress=on_progress, catalog=catalog)
    _report(on_progress, f"loading {spec}")
    config = _read_config(path)
    model, config = _load_weights(path, config, embedding, target)
    tokenizer = _load_tokenizer(path, config, tokenizer_fallback)
    if on_cpu() if dequantize is None else dequantize:
        dequantize_model(model)
    elif quantize_bits and not is_quantized(model):
        quantize_model(model, quantize_bits)
    if dtype in DTYPES:
        cast_floats(model, dtype)
    if on_cpu() and pads_single_rows():
        pad_single_rows(model)
    context = config.get("max_position_embeddings") or config.get("text_config", {}).get(
        "max_position_embeddings"
    )
    _report(on_progress, f"loaded {spec}", 1.0)
    return LoadedModel(model, tokenizer, spec, path, int(context or DEFAULT_CONTEXT), config)


# ----------------------------------------------------------------------------- pair checks


def _id_to_token(tokenizer: Any) -> dict[int, str]:
    return {i: t for t, i in tokenizer.get_vocab().items()}


def _first_difference(a: list[int], b: list[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def check_tokenizers(
    target: LoadedModel, draft: LoadedModel, probes: tuple[str, ...] = PROBES
) -> None:
    """Raise TokenizerMismatchError unless target and draft tokenize alike.

    Two checks: (1) the same ids for every probe string; (2) the same token at every id of the
    shared vocabulary range (tables may be padded past the real vocabulary, so only
    min(len_t, len_d) ids are compared)."""
    tt, dt = target.tokenizer, draft.tokenizer
    who = f"target {target.name!r} and draft {draft.name!r}"
    for text in probes:
        a, b = tt.encode(text, add_special_tokens=False), dt.encode(text, add_special_tokens=False)
        if a != b:
            i = _first_difference(a, b)
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
    """Raise CacheNotTrimmableError if the model's prompt caches cannot be rewound (SSM/hybrid)."""
    from mlx_lm.models.cache import make_prompt_cache

    bad = sorted({type(c).__name__ for c in make_prompt_cache(model) if not c.is_trimmable()})
    if bad:
        raise CacheNotTrimmableError(
            f"{name} uses caches that cannot be rewound ({', '.join(bad)}); "
            "speculative decoding needs trimmable KV caches (run with --no-spec)"
        )


def _pair_specs(
    target: str | None, draft: str | None, pair: str | None, cat: Catalog
) -> tuple[str, str | None, str | None]:
    """(target spec, draft spec or None, pair name or None): explicit models override the pair.

    A pair name given as the target (`--target smollm2-135m`) means that pair."""
    if pair is None and target in cat.pairs and target not in cat.models:
        pair, target = target, None
    base = cat.pair(pair) if (pair is not None or target is None) else None
    target_spec = target or base.target  # type: ignore[union-attr]
    draft_spec = draft or (base.draft if base is not None else None)
    return target_spec, draft_spec, base.name if base is not None else None


def _check_draft_available(spec: str, pair_name: str | None, cat: Catalog) -> None:
    if spec in cat.models and not cat.model(spec).available:
        where = cat.model(spec).local
        of = f" of pair {pair_name!r}" if pair_name else ""
        raise ModelNotFoundError(
            f"the draft {spec!r}{of} is not available yet ({where} does not exist); "
            "run with --no-spec (or --method ngram), or pass --draft"
        )


def peer_draft_spec(
    target: str | None, draft: str | None, pair: str | None, catalog: Catalog | None = None
) -> str | None:
    """The token draft a peer should use for the pair these arguments name: the pair's
    `token_draft` when its own draft is used (no --draft given), else None."""
    cat = catalog or load_catalog()
    _, _, pair_name = _pair_specs(target, draft, pair, cat)
    if draft is not None or pair_name is None:
        return None
    return cat.pair(pair_name).token_draft


def load_token_draft(
    spec: str, target: LoadedModel, *, draft_bits: int | None = 4, dtype: str | None = None
) -> LoadedModel:
    """Load a token draft for `target` (for a peer such as mlx-lm when the pair's own draft is a
    feature draft), checked like any draft: same tokenizer, trimmable cache, not a feature draft."""
    from edgespec.drafting.eagle import EagleModel

    cat = load_catalog()
    _check_draft_available(spec, None, cat)
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
        tokenizer_fallback=t.path,
        catalog=cat,
        embedding=input_embedding(t.model),
        target=t.model,
        dtype=dtype,
    )
    _report(on_progress, "checking the pair")
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

    A draft without its own tokenizer files borrows the target's. draft_bits: quantize an
    unquantized draft at load on GPU backends (None or 0 = leave it). dtype: both models' float
    parameters (see `load_model`). group: a group of more than one rank splits the target over
    it, `shard` "tensor" or "pipeline" parallel (edgespec.distributed.shard); the draft stays
    whole on every rank."""
    cat = catalog or load_catalog()
    target_spec, draft_spec, pair_name = _pair_specs(target, draft, pair, cat)
    if with_draft and draft_spec is not None:
        _check_draft_available(draft_spec, pair_name, cat)
    if group is not None and group.size > 1:
        from edgespec.distributed.shard import load_sharded

        t = load_sharded(
            target_spec, group, shard, on_progress=on_progress, catalog=cat, dtype=dtype
        )
    else:
        t = load_model(target_spec, on_progress=on_progress, catalog=cat, dtype=dtype)
    if not with_draft or draft_spec is None:
        return t, None
    d = _load_draft(draft_spec, t, cat, draft_bits, dtype, on_progress)
    check_trimmable(t.model, t.name)
    check_trimmable(d.model, d.name)
    return t, d
