"""The mlx-lm floor of each pair (edgespec/loading/floors.py): every model type a catalogue pair
loads has the first mlx-lm release that maps it, the package's own floor covers them all, the
types agree with the layouts the pairs are published in, and a pair that needs a newer mlx-lm
is refused in one line before anything is fetched or imported."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edgespec.config import MTP_DRAFT
from edgespec.errors import ModelNotFoundError
from edgespec.loading.floors import MLX_LM_FLOORS, pair_floor, release
from edgespec.loading.specs import load_catalog, parse_catalog
from tests.helpers.cli import ROOT, mlx_lm_stopper, run_edgespec
from tests.helpers.hub_layouts import LAYOUTS, SMOLLM2_CONFIG


def _pyproject_floor() -> str:
    (floor,) = re.findall(r'^\s*"mlx-lm>=([\d.]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    return floor


def test_the_package_floor_covers_every_pair():
    cat = load_catalog()
    have = _pyproject_floor()
    for pair in cat.pairs.values():
        assert pair.model_types, f"{pair.name} lists no model types"
        floor = pair_floor(pair.model_types, pair.min_mlx_lm)
        assert floor is not None and release(floor[0]) <= release(have), (pair.name, floor)
    assert release(have) >= release(MLX_LM_FLOORS["gemma4_unified"].release) == (0, 32, 0)


def _layout_type(repo: str) -> str | None:
    """The mlx-lm model type of a hub repo's published layout (None: EdgeSpec's own code)."""
    if repo == "HuggingFaceTB/SmolLM2-135M-Instruct":  # the embedded target's repo
        return str(SMOLLM2_CONFIG["model_type"])
    layout = next((lay for pat, lay in LAYOUTS if re.fullmatch(pat, repo)), None)
    assert layout is not None, f"{repo} has no published layout"
    if layout == "mlx-qwen3-published":
        return "qwen3"
    if layout.startswith(("mlx:", "mtp:")):
        kind = layout.split(":", 1)[1]
        return "gemma4" if kind in ("gemma4_small", "gemma4_moe") else kind
    return None  # a DFlash / DFlash2 draft, a Gemma 4 assistant: EdgeSpec's own architectures


# Targets converted from a GGUF on PyPI (no hub repo): the type their converter writes
# (edgespec/loading/gguf_gemma3.py writes gemma3_text).
GGUF_TYPES = {"gemma3-270m": "gemma3_text"}


def test_the_catalogue_types_are_those_the_models_are_published_as():
    """The target's type is listed, and so is every other type the pair loads (a folder in the
    repository is EdgeSpec's own draft: model_type edgespec_*)."""
    cat = load_catalog()
    for pair in cat.pairs.values():
        repos = [cat.model(r).hf_repo if r in cat.models else r for r in (pair.target, pair.draft)]
        types = [_layout_type(r) if r and r != MTP_DRAFT else None for r in repos]
        if repos[0] is None:  # a GGUF from a PyPI wheel
            types[0] = GGUF_TYPES[pair.target]
        assert types[0] in pair.model_types, (pair.name, types)
        assert {t for t in types if t} <= set(pair.model_types), (pair.name, types)


def test_a_catalogue_type_without_a_floor_is_refused_when_read():
    raw = {"pairs": {"p": {"target": "a/b", "draft": "c/d", "model_types": ["qwen9"]}}}
    with pytest.raises(ModelNotFoundError, match="pair 'p' loads model_type 'qwen9', which has no"):
        parse_catalog(raw, ROOT)


def _old_mlx_lm(folder: Path, have: str) -> Path:
    """`mlx_lm_stopper` plus package metadata saying mlx-lm `have` is installed."""
    mlx_lm_stopper(folder)
    meta = folder / f"mlx_lm-{have}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: mlx-lm\nVersion: {have}\n")
    return folder


@pytest.mark.parametrize(
    "args",
    [
        ("pull", "--quiet", "gemma4-12b"),
        ("generate", "hi", "--pair", "gemma4-12b"),
        ("bench", "--quiet", "--pair", "gemma4-12b-assistant"),
    ],
)
def test_a_pair_needing_a_newer_mlx_lm_is_refused_before_any_fetch(tmp_path, args):
    """With mlx-lm 0.31.3 (which maps gemma4 but not gemma4_unified) the command says so in
    one line; mlx-lm is never imported and nothing reaches the cache."""
    home = tmp_path / "home"
    stop = _old_mlx_lm(tmp_path / "stop", "0.31.3")
    proc = run_edgespec(*args, timeout=120, path_first=stop, env={"EDGESPEC_HOME": str(home)})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert lines == [
        f"edgespec {args[0]}: error: pair '{args[-1]}' needs mlx-lm >= 0.32.0 (model_type "
        "gemma4_unified); you have 0.31.3 (pip install -U 'mlx-lm>=0.32.0')"
    ], proc.stderr
    assert not (home / "models").exists()
