"""`edgespec bench`: prompt loading, greedy comparison, reports, and the run end to end on tiny models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from edgespec.bench import (
    DEFAULT_PROMPTS,
    MT_BENCH,
    BenchPlan,
    BenchResult,
    MismatchNote,
    first_difference,
    load_prompts,
)
from edgespec.errors import ConfigError, PromptError
from edgespec.metrics import RunRecord, Summary, aggregate
from edgespec.report import format_markdown, format_table, write_report

SHARED = Path(os.environ.get("EDGESPEC_SHARED", Path(__file__).parents[1] / ".." / "shared"))
SPEC_BENCH = SHARED / "prompts" / "spec_bench_question.jsonl"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_default_prompt_set_is_spec_bench_format() -> None:
    prompts = load_prompts()
    assert 16 <= len(prompts) <= 24
    assert len({p.id for p in prompts}) == len(prompts)
    assert len({p.category for p in prompts}) >= 4
    assert all(p.text.strip() for p in prompts)
    for line in DEFAULT_PROMPTS.read_text().splitlines():
        assert set(json.loads(line)) == {"question_id", "category", "turns"}


def test_categories_and_per_category_limit() -> None:
    prompts = load_prompts(None, categories=["qa", "math"], limit=2)
    assert [p.category for p in prompts] == ["qa", "qa", "math", "math"]
    with pytest.raises(ConfigError, match="unknown categories nope"):
        load_prompts(None, categories=["nope"])


@pytest.mark.skipif(not SPEC_BENCH.is_file(), reason="needs ../shared/prompts")
def test_spec_bench_mt_bench_categories() -> None:
    prompts = load_prompts(SPEC_BENCH, categories=["mt-bench"])
    assert len(prompts) == 80 and {p.category for p in prompts} == set(MT_BENCH)
    assert prompts[0].id == "81" and prompts[0].text.startswith("Compose an engaging travel")


def test_bad_prompt_files(tmp_path: Path) -> None:
    with pytest.raises(PromptError, match="not found"):
        load_prompts(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "category": "qa", "turns": ["ok"]}\n{"turns": []}\n')
    with pytest.raises(PromptError, match="bad.jsonl:2"):
        load_prompts(bad)


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2


def test_plan_rejects_unknown_method_and_counts_runs() -> None:
    with pytest.raises(ConfigError, match="unknown methods"):
        BenchPlan(methods=("plain", "turbo"))
    plan = BenchPlan(methods=("plain", "spec", "mlx-lm"), ks=(2, 4), temps=(0.0, 0.7), repeats=2)
    assert plan.variants() == [("plain", 0), ("spec", 2), ("spec", 4), ("mlx-lm", 2), ("mlx-lm", 4)]
    assert plan.total_runs(3) == 2 * 2 * 3 * 5


def _synthetic() -> BenchResult:
    recs = []
    for cat, pid in (("qa", "1"), ("math", "2")):
        common = dict(temp=0.0, prompt_id=pid, category=cat, repeat=0, ttft=0.05,
                      wall_time=1.0, finish_reason="length", peak_memory=2**20)  # fmt: skip
        recs.append(RunRecord(method="plain", k=0, tokens=21, decode_time=1.0, **common))
        recs.append(
            RunRecord(
                method="spec",
                k=4,
                tokens=21,
                decode_time=0.5,
                rounds=8,
                drafted=32,
                accepted=12,
                rejections=8,
                accepted_hist=(2, 2, 2, 2),
                t_draft=0.1,
                t_verify=0.35,
                mismatch=pid == "2",
                first_diff=3 if pid == "2" else None,
                **common,
            )  # fmt: skip
        )
    note = MismatchNote("spec", 4, "2", "math", 0, 3, 10, 11, 1e-6, True)
    settings = {"max_tokens": 21, "n_prompts": 2, "prompts": "synthetic", "repeats": 1}
    return BenchResult(recs, [note], [], settings, {"name": "toy"}, {"device": "cpu"})


def test_report_files_and_schema(tmp_path: Path) -> None:
    result = _synthetic()
    variants = aggregate(result.records)
    files = write_report(result, variants, tmp_path)
    doc = json.loads(files.json.read_text())
    check_schema(doc)
    spec = next(m for m in doc["methods"] if m["method"] == "spec")
    assert spec["overall"]["speedup_vs_plain"] == pytest.approx(2.0)
    assert spec["categories"]["math"]["mismatches"] == 1
    assert spec["categories"]["qa"]["mismatches"] == 0
    assert doc["mismatches"][0]["near_tie"] is True
    md = files.markdown.read_text()
    assert "| spec K=4 T=0 | all |" in md and "near-tie" in md
    assert {p.name for p in files.plots} == {"speedup_by_category.png", "speedup_landscape.png"}
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in files.plots)


def test_terminal_table_shows_speedup_and_partial_flag() -> None:
    result = _synthetic()
    variants = aggregate(result.records)
    table = format_table(variants)
    assert table.splitlines()[0].split()[:4] == ["method", "category", "runs", "tok/s"]
    assert any(line.startswith("spec K=4 T=0") and "2.00x" in line for line in table.splitlines())
    result.complete = False
    assert "partial results" in format_markdown(result, variants)


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
