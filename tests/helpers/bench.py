"""The bench's shared checks: results.json's schema, and one greedy-compared bench run on an
Engine (the bench, block and MTP bench tests)."""

from __future__ import annotations

from dataclasses import fields

from edgespec.bench.plan import BenchPlan
from edgespec.bench.prompts import load_prompts
from edgespec.bench.records import RunRecord, Summary
from edgespec.bench.runner import BenchResult


def check_schema(doc: dict) -> None:
    """results.json as documented: top-level keys, per-method overall + categories summaries."""
    assert doc["schema_version"] == 1
    assert isinstance(doc["complete"], bool)
    for key in ("created", "environment", "pair", "settings", "methods", "mismatches", "runs"):
        assert key in doc
    summary_keys = {f.name for f in fields(Summary)}
    assert {"tokens_per_s", "speedup_vs_plain", "tau", "alpha", "mismatches"} <= summary_keys
    for m in doc["methods"]:
        assert {"method", "k", "temp", "label", "overall", "categories"} <= set(m)
        for s in [m["overall"], *m["categories"].values()]:
            assert set(s) == summary_keys
            assert s["tokens_per_s"] is None or s["tokens_per_s"] > 0
    run_keys = {f.name for f in fields(RunRecord)} | {"tokens_per_s"}
    assert all(set(r) == run_keys for r in doc["runs"])


def _bench(engine, plan: BenchPlan, categories: list[str]) -> BenchResult:
    from edgespec.bench.greedy import compare_greedy
    from edgespec.bench.prompts import encode_prompts
    from edgespec.bench.runner import iter_bench, warm_up

    prompts = load_prompts(None, categories=categories, limit=1)
    encoded, skipped = encode_prompts(engine, prompts, plan.max_tokens)
    warm_up(engine, next(iter(encoded.values())), plan)
    records, notes = compare_greedy(
        engine, list(iter_bench(engine, prompts, encoded, plan)), encoded
    )
    return BenchResult(records, notes, skipped, {"n_prompts": len(encoded)})
