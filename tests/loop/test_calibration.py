"""Warm-up and cost calibration (edgespec.calibration, Engine.warm_up): the shapes are run, the
costs saved per key and reused, a changed key starts over, and adaptive K starts from them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from edgespec.calibration import Calibration, calibration_key, round_costs, tree_costs
from edgespec.config import GenerationConfig, SpecConfig
from edgespec.drafting.adaptive import AdaptiveK
from edgespec.events import Round, Token
from tests.helpers import PROMPT


def _tokens(engine, config: GenerationConfig) -> list[int]:
    return [
        e.id
        for e in engine.chat([{"role": "user", "content": PROMPT}], config)
        if isinstance(e, Token)
    ]


def test_round_costs_leave_out_compiles_and_catch_ups() -> None:
    rounds = [
        Round(0, 2, 2, 2, 5.0, 5.0),  # first K = 2: compiles
        Round(1, 2, 2, 2, 0.02, 0.1),
        Round(2, 0, 0, 0, 0.0, 3.0),  # first plain step: compiles
        Round(3, 0, 0, 0, 0.0, 0.05),
        Round(4, 2, 1, 2, 0.5, 0.3),  # after a plain step: its draft caught up first
        Round(5, 1, 1, 1, 0.01, 0.2, timed=False),
    ]
    assert round_costs(rounds) == ({"draft": 0.01}, {3: 0.2, 1: 0.05})


def test_tree_rounds_are_kept_apart_from_the_chains() -> None:
    """A tree's masked verify of L rows is not a chain's of L: the warm-up of a tree timed both,
    and the chain's seeds must not take the tree's (nor a tree's draft forward a chain step's)."""
    rounds = [
        Round(0, 2, 2, 2, 5.0, 5.0),  # chain: compiles
        Round(1, 2, 2, 2, 0.02, 0.1),
        Round(2, 6, 2, 3, 9.0, 9.0, nodes=6),  # first tree at (7, 3): compiles
        Round(3, 6, 2, 3, 0.375, 0.4, nodes=6),
        Round(4, 2, 2, 2, 0.04, 0.3),  # a chain after a tree: its draft counts
    ]
    assert round_costs(rounds) == ({"draft": 0.015}, {3: 0.2})
    assert tree_costs(rounds) == ({2: 0.125}, {7: 0.4})


def test_a_calibration_keeps_tree_costs_and_reads_files_from_before_them(tmp_path: Path) -> None:
    key = calibration_key("T + D", "cpu", {"mlx": "1"})
    cal = Calibration(key).add({"draft": 1.0}, {2: 1.0}, ({2: 0.5}, {9: 2.0}))
    cal.save(tmp_path / "c.json")
    again = Calibration.load(tmp_path / "c.json", key)
    assert again == cal and again.tree_medians() == ({2: 0.5}, {9: 2.0})
    old_file = {"key": key, "draft": {"draft": [1.0]}, "verify": {"2": [1.0]}}
    (tmp_path / "old.json").write_text(json.dumps(old_file))
    old = Calibration.load(tmp_path / "old.json", key)
    assert old is not None and old.medians() == ({"draft": 1.0}, {2: 1.0})
    assert old.tree_medians() == ({}, {})


def test_a_calibration_is_kept_per_key_and_keeps_the_latest_timings(tmp_path: Path) -> None:
    key = calibration_key("T + D", "cpu", {"mlx": "1"})
    cal = Calibration(key)
    for i in range(7):
        cal = cal.add({"draft": float(i)}, {2: 1.0})
    cal.save(tmp_path / "c.json")
    again = Calibration.load(tmp_path / "c.json", key)
    assert again is not None and again.draft == {"draft": [2.0, 3.0, 4.0, 5.0, 6.0]}
    assert again.medians() == ({"draft": 4.0}, {2: 1.0})
    other = calibration_key("T + D", "gpu", {"mlx": "1"})
    assert Calibration.load(tmp_path / "c.json", other) is None  # another backend: start over
    assert Calibration.load(tmp_path / "missing.json", key) is None


def test_warm_up_runs_every_verify_length_and_leaves_generation_unchanged(
    engine, tiny_models, tmp_path: Path
) -> None:
    from edgespec.runtime import Engine

    config = GenerationConfig(
        spec=SpecConfig(k=2, k_max=4, adaptive=True, method="draft"), max_tokens=24
    )
    cal = engine.warm_up(config, tmp_path)
    assert engine.cached_tokens() == ([], [])
    # Every verify length 2..k_max + 1, each timed after its compile, and the draft's cost.
    assert {2, 3, 4, 5} <= set(cal.verify) and set(cal.draft) == {"draft"}
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    fresh = Engine(*tiny_models)
    assert _tokens(engine, config) == _tokens(fresh, config)  # exactness: same answer
    fresh.warm_up(config, tmp_path)  # the same key: one more timing per cost, same file
    assert fresh.calibration is not None
    assert all(len(ts) == 2 for ts in fresh.calibration.verify.values() if ts)
    assert list(tmp_path.glob("*.json")) == files


def test_adaptive_requests_start_from_the_calibration(engine, monkeypatch) -> None:
    seeds: list[tuple] = []
    monkeypatch.setattr(AdaptiveK, "seed", lambda self, d, v: seeds.append((d, v)))
    config = GenerationConfig(spec=SpecConfig(k=2, adaptive=True, method="draft"), max_tokens=8)
    _tokens(engine, config)
    assert seeds == []  # no warm-up, nothing to start from
    engine.calibration = Calibration({}, {"draft": [0.1, 0.3, 0.2]}, {3: [0.5]})
    _tokens(engine, config)
    assert seeds == [({"draft": 0.2}, {3: 0.5})]


def test_a_tree_warm_up_times_the_chains_and_its_trees_and_seeds_the_tree_policy(
    engine, tiny_models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--tree` warms up its chains, a plain step and its tree (trees/build.py warm_shapes), so
    a request prices the tree before its first tree round (AdaptiveTree.seed), and answers as
    an engine that did not warm up."""
    from edgespec.runtime import Engine
    from edgespec.trees.policy import AdaptiveTree

    config = GenerationConfig(
        spec=SpecConfig(k=2, k_max=3, adaptive=True, method="draft", tree="2,2"), max_tokens=24
    )
    cal = engine.warm_up(config, tmp_path)
    assert {1, 2, 3, 4} <= set(cal.verify) and set(cal.draft) == {"tree"}  # the tree loop's
    assert set(cal.tree_verify) == {5} and set(cal.tree_draft) == {2}  # 4 nodes, 2 deep
    seeds: list[tuple] = []
    monkeypatch.setattr(AdaptiveTree, "seed", lambda self, *costs: seeds.append(costs))
    assert _tokens(engine, config) == _tokens(Engine(*tiny_models), config)
    assert seeds == [(*cal.medians(), *cal.tree_medians())]


def test_warm_up_generates_again_when_an_answer_stops_before_the_cycle_ends(
    engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    generate = engine.generate

    def first_stops_early(prompt, config, **kwargs):  # noqa: ANN001, ANN202
        calls.append(len(calls))
        short = dataclasses.replace(config, max_tokens=4) if len(calls) == 1 else config
        return generate(prompt, short, **kwargs)

    monkeypatch.setattr(engine, "generate", first_stops_early)
    config = GenerationConfig(spec=SpecConfig(k=2, k_max=3, adaptive=True, method="draft"))
    cal = engine.warm_up(config, tmp_path)
    assert len(calls) == 2 and {2, 3, 4} <= set(cal.verify)


def test_a_saved_calibration_seeds_an_engine_that_did_not_warm_up(
    engine, tiny_models, tmp_path: Path
) -> None:
    """`edgespec generate` runs no warm-up: it starts from the calibration the chat, the server
    or the bench saved for this machine and pair (Engine.use_saved_calibration), or from none."""
    from edgespec.runtime import Engine

    fresh = Engine(*tiny_models)
    assert fresh.use_saved_calibration(tmp_path) is None and fresh.calibration is None
    config = GenerationConfig(spec=SpecConfig(k=2, k_max=3, adaptive=True, method="draft"))
    saved = engine.warm_up(config, tmp_path)
    assert fresh.use_saved_calibration(tmp_path) == saved == fresh.calibration
    assert 1 in saved.medians()[1]  # a plain step priced: adaptive K runs no price check


def test_the_bench_calibrates_the_engines_its_adaptive_methods_run_on(
    engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bench times what the chat and the server run: adaptive K and the tree policies from a
    calibration (a tree's warm-up times its trees). Fixed K and plain decoding need none."""
    from edgespec.bench.plan import BENCH_TREE, BenchPlan
    from edgespec.bench.runner import calibrate

    calls: list[SpecConfig] = []
    monkeypatch.setattr(engine, "warm_up", lambda config: calls.append(config.spec))
    calibrate(engine, BenchPlan(methods=("plain", "spec", "hybrid")))
    assert calls == []
    calibrate(engine, BenchPlan(methods=("plain", "adaptive-hybrid", "adaptive")))
    assert [(s.method, s.adaptive) for s in calls] == [("hybrid", True)]  # once per engine
    calls.clear()
    calibrate(engine, BenchPlan(methods=("adaptive", "tree", "adaptive-tree", "adaptive-hybrid")))
    assert [(s.method, s.tree) for s in calls] == [("draft", ""), ("draft", BENCH_TREE)]
