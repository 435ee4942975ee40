"""`mtp` in the bench: the target's own MTP head drafts, exact against plain decoding, its rounds
timed (the loop's overhead in results.json); refused in one line without an MTP head."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgespec.bench.plan import BenchPlan
from edgespec.bench.records import aggregate
from edgespec.bench.report import write_report
from edgespec.bench.runner import check_methods
from edgespec.errors import ConfigError
from edgespec.runtime import Engine
from tests.helpers.arch_models import PROMPT
from tests.helpers.bench import _bench, check_schema
from tests.helpers.mtp_models import make_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("mtp-bench"), [PROMPT], 60, steps=60)


def test_bench_mtp_method(checkpoint, tmp_path):
    engine = Engine.load(str(checkpoint), "mtp")
    plan = BenchPlan(methods=("plain", "mtp"), ks=(2,), max_tokens=12, warmup_tokens=3)
    check_methods(engine, plan)
    result = _bench(engine, plan, ["qa"])
    plain = {r.prompt_id: r.token_ids for r in result.records if r.method == "plain"}
    mtp = [r for r in result.records if r.method == "mtp"]
    assert mtp and all(r.mismatch is False and r.token_ids == plain[r.prompt_id] for r in mtp)
    assert all(r.rounds > 1 and r.t_model_decode is not None for r in mtp)
    files = write_report(result, aggregate(result.records), tmp_path)
    doc = json.loads(files.json.read_text())
    check_schema(doc)
    overall = {m["label"]: m["overall"] for m in doc["methods"]}["mtp K=2 T=0"]
    assert 0 <= overall["overhead"] < 1 and overall["overhead_per_round"] > 0


def test_mtp_method_needs_the_mtp_head(tiny_pair):
    engine = Engine.load(str(tiny_pair[0]), str(tiny_pair[1]), draft_bits=0)
    with pytest.raises(ConfigError, match="--draft mtp"):
        check_methods(engine, BenchPlan(methods=("plain", "mtp")))
