"""The architectures through the real command line and the bench: `edgespec generate` with a
sliding-window pair and a hybrid pair (300 tokens: speculation equals --no-spec), `--no-spec` on a
hybrid (once refused), and `edgespec bench` on every family, where mlx-lm's speculative decoding
is left out, with its reason in results.json, for targets it refuses."""

from __future__ import annotations

import dataclasses
import json

import pytest

from edgespec.bench.greedy import compare_greedy
from edgespec.bench.plan import BenchPlan
from edgespec.bench.prompts import encode_prompts, load_prompts
from edgespec.bench.runner import iter_bench, refused_methods
from tests.helpers.arch_models import Families
from tests.helpers.cli import run_edgespec
from tests.helpers.tiny_arch import FAMILIES

RECURRENT = ("qwen3_next", "qwen3_5")


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> Families:
    return Families(tmp_path_factory.mktemp("cli_families"))


def _token_ids(*args: str) -> list[int]:
    proc = run_edgespec("generate", "the cat and the dog", "--json", *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    return [e["id"] for e in lines if e.get("type") == "token"]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gemma3_text", "gemma4_text", "qwen3_next"])
def test_generate_speculative_equals_no_spec_over_300_tokens(families, family):
    target, draft = (str(p) for p in families.paths(family))
    models = ("--target", target, "--draft", draft, "--temp", "0", "--max-tokens", "300")
    plain = _token_ids(*models, "--no-spec")
    assert len(plain) == 300
    assert _token_ids(*models) == plain  # the default: adaptive hybrid drafting
    assert _token_ids(*models, "--method", "draft", "--no-adaptive", "-k", "3") == plain


def test_no_spec_runs_a_hybrid_and_speculation_too(families):
    target, draft = (str(p) for p in families.paths("qwen3_next"))
    proc = run_edgespec("generate", "hi", "--target", target, "--no-spec", "--max-tokens", "8")
    assert proc.returncode == 0 and "8 tokens (length) | plain decoding" in proc.stderr
    proc = run_edgespec("generate", "hi", "--target", target, "--draft", draft, "--max-tokens", "8")
    assert proc.returncode == 0 and "8 tokens (length)" in proc.stderr, proc.stderr


@pytest.mark.parametrize("family", list(FAMILIES))
def test_mlx_lm_is_refused_exactly_where_it_cannot_trim(families, family):
    engine = families.engine(family)
    refused = refused_methods(engine, BenchPlan(methods=("plain", "spec", "mlx-lm")))
    if family in RECURRENT:
        assert [r["method"] for r in refused] == ["mlx-lm"]
        assert "ArraysCache" in refused[0]["reason"]
    else:
        assert refused == []


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_bench_runs_on_every_family(families, family):
    """plain, spec, mlx-lm and mlx-lm-plain, in process, on one prompt: EdgeSpec's greedy runs
    match plain decoding's; mlx-lm's speculative decoding runs wherever it does not refuse."""
    engine = families.engine(family)
    plan = BenchPlan(
        methods=("plain", "spec", "mlx-lm", "mlx-lm-plain"), ks=(3,), max_tokens=24, warmup_tokens=0
    )
    gone = {r["method"] for r in refused_methods(engine, plan)}
    plan = dataclasses.replace(plan, methods=tuple(m for m in plan.methods if m not in gone))
    prompts = load_prompts(None, categories=["qa"], limit=1)
    encoded, _ = encode_prompts(engine, prompts, plan.max_tokens)
    records, notes = compare_greedy(
        engine, list(iter_bench(engine, prompts, encoded, plan)), encoded
    )
    assert {r.method for r in records} == set(plan.methods)
    assert all(r.tokens == 24 for r in records)
    assert not [n for n in notes if n.method == "spec"]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gemma3_text", "qwen3_next"])
def test_the_bench_command_says_why_mlx_lm_was_left_out(families, family, tmp_path):
    target, draft = (str(p) for p in families.paths(family))
    proc = run_edgespec(
        "bench",
        "--target",
        target,
        "--draft",
        draft,
        "--methods",
        "plain,spec,mlx-lm",
        "--categories",
        "qa",
        "--limit",
        "1",
        "--max-tokens",
        "40",
        "-k",
        "3",
        "--no-warmup",
        "--out",
        str(tmp_path),
        "--quiet",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "results.json").read_text())
    ran = {m["method"] for m in doc["methods"]}
    assert not [n for n in doc["mismatches"] if n["method"] == "spec"]
    if family in RECURRENT:
        assert ran == {"plain", "spec"} and doc["refused"][0]["method"] == "mlx-lm"
        assert "mlx-lm left out" in proc.stderr and proc.stderr.count("\n") == 1
    else:
        assert ran == {"plain", "spec", "mlx-lm"} and doc["refused"] == []
