"""What a model spec names, and the refusals that need nothing but the file system and the
catalogue: no MLX, mlx-lm, transformers or download imports, so a command can refuse an unknown
model name before it imports its runtime (seconds). Resolving a spec to a folder:
edgespec/loading/resolve.py, which starts with `spec_kind`.
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Literal

from edgespec.config import MTP_DRAFT
from edgespec.errors import ConfigError, ModelLoadError, ModelNotFoundError
from edgespec.loading.catalog import Catalog, is_repo_id, load_catalog

SpecKind = Literal["folder", "gguf", "catalogue", "hf"]


def spec_kind(spec: str, catalog: Catalog | None = None) -> SpecKind:
    """What `spec` names, in resolve order: a local model folder, a local .gguf file, an available
    catalogue model or a Hugging Face repo id. Anything else raises the one-line
    ModelLoadError / ModelNotFoundError resolving it would (the catalogue is read only when the
    spec is no local path)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} has no config.json (not a model folder)")
        return "folder"
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return "gguf"
        raise ModelLoadError(f"{path} is a file but not a .gguf model (pass a model folder)")
    cat = catalog or load_catalog()
    if spec in cat.models:
        entry = cat.model(spec)
        if entry.local is not None and not entry.available:
            raise ModelNotFoundError(entry.missing())
        return "catalogue"
    if is_repo_id(spec):
        return "hf"
    raise ModelNotFoundError(
        f"model {spec!r} not found: not a folder, .gguf file, catalogue name or "
        "Hugging Face repo id"
    )


def pair_specs(
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


def check_draft_available(spec: str, pair_name: str | None, cat: Catalog) -> None:
    """A catalogue draft whose in-repo folder does not exist yet: say what to run instead."""
    if spec in cat.models and not cat.model(spec).available:
        entry = cat.model(spec)
        of = f" of pair {pair_name!r}" if pair_name else ""
        why = (
            entry.missing()
            if entry.research is not None
            else f"the draft {spec!r}{of} is not available yet ({entry.local} does not exist)"
        )
        raise ModelNotFoundError(f"{why}; run with --no-spec (or --method ngram), or pass --draft")


def _release(text: str) -> tuple[int, ...]:
    """The leading release numbers of a version string ('0.31.2.dev1' -> (0, 31, 2))."""
    return tuple(int(n) for n in re.findall(r"\d+", text.split("+")[0])[:3])


def check_mlx_lm(pair_name: str | None, cat: Catalog, have: str | None = None) -> None:
    """ConfigError, in one line, when the pair needs a newer mlx-lm than the installed one
    (`min_mlx_lm` in the catalogue: the release that added its architectures). Reads the
    installed version from the package metadata; imports nothing."""
    need = cat.pair(pair_name).min_mlx_lm if pair_name is not None else None
    if need is None:
        return
    if have is None:
        try:
            have = version("mlx-lm")
        except PackageNotFoundError:
            have = "none installed"
    if have == "none installed" or _release(have) < _release(need):
        raise ConfigError(
            f"pair {pair_name!r} needs mlx-lm >= {need}; you have {have} "
            f"(pip install -U 'mlx-lm>={need}')"
        )


def check_pair(
    target: str | None,
    draft: str | None,
    pair: str | None,
    *,
    with_draft: bool = True,
    catalog: Catalog | None = None,
) -> None:
    """Refuse, as `load_pair` would with the same arguments, a pair whose target or draft cannot
    be found: an unknown pair or model name, a folder without config.json, a file that is not a
    .gguf, a pair that needs a newer mlx-lm. Reads no weights and imports no runtime; call it
    before importing one."""
    cat = catalog or load_catalog()
    target_spec, draft_spec, pair_name = pair_specs(target, draft, pair, cat)
    check_mlx_lm(pair_name, cat)
    draft_spec = draft_spec if with_draft else None
    if draft_spec is not None:
        check_draft_available(draft_spec, pair_name, cat)
    spec_kind(target_spec, cat)
    if draft_spec is not None and draft_spec != MTP_DRAFT:
        spec_kind(draft_spec, cat)
