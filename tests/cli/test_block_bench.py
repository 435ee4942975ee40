"""`block` and `block-tree` in the bench and the tree bench, on a tiny block draft: exact against
plain decoding, per-position acceptance in results.json and results.md, the rounds timed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgespec.bench.plan import BenchPlan
from edgespec.bench.records import aggregate
from edgespec.bench.report import write_report
from edgespec.bench.runner import check_methods
from edgespec.bench.tree import variants
from edgespec.errors import ConfigError
from edgespec.events import Round, fold_rounds, position_acceptance, position_counts
from edgespec.runtime import Engine
from tests.helpers.bench import _bench, check_schema
from tests.helpers.block_models import tiny_qwen3, write_dflash
from tests.helpers.cli import run_edgespec


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("block_bench")
    target = tiny_qwen3(root)
    return target, write_dflash(target, root / "dflash", block=4)


def _round(drafted: int, accepted: int, k: int = 0, nodes: int = 0) -> Round:
    return Round(0, drafted, accepted, k or drafted, 0.1, 0.2, nodes=nodes)


def test_position_counts_worked_example():
    rounds = [_round(3, 1), _round(2, 2)]
    assert position_counts(rounds) == ((2, 2, 0), (2, 1, 0))
    assert position_acceptance(*position_counts(rounds)) == (1.0, 0.5, None)
    tree = _round(24, 2, k=3, nodes=24)  # by depth: 3 deep, accepted 2, depth 3 rejected
    assert position_counts([tree]) == ((1, 1, 1), (1, 1, 0))
    totals = fold_rounds(iter(rounds))  # a generator is folded once
    assert (totals.tries, totals.passes) == ((2, 2, 0), (2, 1, 0)) and totals.rounds == 2


def test_bench_block_methods(paths, tmp_path):
    engine = Engine.load(str(paths[0]), str(paths[1]), draft_bits=0)
    plan = BenchPlan(
        methods=("plain", "block", "block-tree", "adaptive-block"),
        ks=(3,),
        max_tokens=12,
        warmup_tokens=3,
    )
    check_methods(engine, plan)
    result = _bench(engine, plan, ["qa"])
    plain = {r.prompt_id: r.token_ids for r in result.records if r.method == "plain"}
    for r in result.records:
        if r.method != "plain":
            assert r.mismatch is False and r.token_ids == plain[r.prompt_id]
            assert r.rounds > 0 and r.t_draft is not None and r.t_model_decode is not None
            assert r.position_tries[0] > 0
            # adaptive K, and the block tree's fallback (as --method block-tree runs), may
            # step plainly (K = 0)
            if r.method not in ("adaptive-block", "block-tree"):
                assert sum(r.position_tries) >= r.rounds - 1
    variants_ = aggregate(result.records)
    block = next(v for v in variants_ if v.method == "block").overall
    assert len(block.position_acceptance) == 3  # K = 3 positions
    files = write_report(result, variants_, tmp_path)
    doc = json.loads(files.json.read_text())
    check_schema(doc)
    by_label = {m["label"]: m["overall"] for m in doc["methods"]}
    assert len(by_label["block K=3 T=0"]["position_acceptance"]) == 3
    assert "## Acceptance per drafted position" in files.markdown.read_text()


def test_block_methods_need_a_block_draft(tiny_pair):
    engine = Engine.load(str(tiny_pair[0]), str(tiny_pair[1]), draft_bits=0)
    for method in ("block", "block-tree", "adaptive-block"):
        with pytest.raises(ConfigError, match="block draft"):
            check_methods(engine, BenchPlan(methods=("plain", method)))


def test_tree_bench_names_block_variants(paths, tmp_path):
    names = [v.name for v in variants(3, ["2,1"], block=True)]
    assert names == ["plain", "block", "block-tree 2,1", "adaptive", "adaptive-tree"]
    assert {v.spec.method for v in variants(3, ["2,1"], block=True) if v.spec} == {"block"}
    out = tmp_path / "tree.json"
    r = run_edgespec(
        "tree-bench",
        "--target",
        str(paths[0]),
        "--draft",
        str(paths[1]),
        "--depth",
        "3",
        "--trees",
        "2,1",
        "--limit",
        "1",
        "--max-tokens",
        "8",
        "--no-adaptive",
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    assert "block-tree 2,1" in r.stdout


def test_verify_command_maths_accepts_a_block_draft(paths):
    from edgespec.bench.unbiased import verify_pair
    from edgespec.config import SamplingConfig
    from edgespec.loading.load import load_pair

    t, d = load_pair(str(paths[0]), str(paths[1]))
    ids = [5, 9, 11, 40, 7, 3]
    report = verify_pair(t.model, d.model, ids, SamplingConfig(temperature=1.0), 2, 20000)
    assert report.p_value > 1e-3 and 0 < report.acceptance <= 1
    assert abs(report.acceptance - report.expected_acceptance) < 0.03
    with pytest.raises(ConfigError, match="two tokens"):
        verify_pair(t.model, d.model, [5], SamplingConfig(temperature=1.0), 2, 10)


def test_a_block_pair_runs_the_token_methods_on_its_token_draft(tiny_pair, tmp_path):
    """With a block draft and a token draft (--peer-draft) for one target, the bench runs the
    block methods on the block draft and the token-draft methods on the token draft, side by side
    in one run, and says so in results.json and results.md."""
    target, token_draft = tiny_pair
    block = write_dflash(target, tmp_path / "dflash", block=4)
    out = tmp_path / "out"
    args = ["bench", "--target", str(target), "--draft", str(block), "--draft-bits", "0"]
    args += ["--peer-draft", str(token_draft), "--methods", "plain,spec,block", "-k", "2"]
    args += ["--limit", "1", "--categories", "qa", "--max-tokens", "10", "--quiet"]
    proc = run_edgespec(*args, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "results.json").read_text())
    assert result["pair"]["token_methods_draft"] == str(token_draft)
    assert "token-draft methods" in (out / "results.md").read_text()
    runs = {r["method"]: r for r in result["runs"]}
    assert runs["spec"]["token_ids"] == runs["plain"]["token_ids"] == runs["block"]["token_ids"]
    # the token draft drafts token by token: its rounds differ from the block draft's
    assert runs["spec"]["accepted_hist"] != runs["block"]["accepted_hist"] or (
        runs["spec"]["accepted"] != runs["block"]["accepted"]
    )
