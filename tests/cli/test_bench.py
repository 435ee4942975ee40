"""`edgespec bench`: prompt loading, greedy comparison, reports, and the run end to end on tiny models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.bench.greedy import MismatchNote, first_difference
from edgespec.bench.plan import BenchPlan
from edgespec.bench.prompts import DEFAULT_PROMPTS, MT_BENCH, load_prompts
from edgespec.bench.records import RunRecord, aggregate
from edgespec.bench.report import format_markdown, format_table, write_report
from edgespec.bench.runner import BenchResult
from edgespec.errors import ConfigError, PromptError
from tests.helpers.bench import _bench, check_schema
from tests.helpers.cli import mlx_lm_stopper, run_edgespec
from tests.helpers.prompt_sets import SPEC_BENCH, prompt_set

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


def test_spec_bench_mt_bench_categories() -> None:
    prompts = load_prompts(prompt_set(SPEC_BENCH), categories=["mt-bench"])
    assert len(prompts) == 80 and {p.category for p in prompts} == set(MT_BENCH)
    assert prompts[0].id == "81" and prompts[0].text.startswith("Compose an engaging travel")


def test_bad_prompt_files(tmp_path: Path) -> None:
    with pytest.raises(PromptError, match="not found"):
        load_prompts(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "category": "qa", "turns": ["ok"]}\n{"turns": []}\n')
    with pytest.raises(PromptError, match="bad.jsonl:2"):
        load_prompts(bad)


def test_a_prompt_may_hold_raw_unicode_line_separators(tmp_path: Path) -> None:
    """JSON lines end at "\n" only: U+2028 and U+0085 are valid raw inside a JSON string."""
    path = tmp_path / "raw.jsonl"
    turn = "one\u2028two\x85three"
    rows = [{"question_id": i, "category": "qa", "turns": [turn]} for i in (1, 2)]
    path.write_text("\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows), "utf-8")
    assert [p.text for p in load_prompts(path)] == [turn, turn]


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


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"ks": (1, 0)}, "K .* must be in 1..64, got 0"),
        ({"ks": (65,)}, "got 65"),
        ({"temps": (0.0, float("nan"))}, "temperature must be a finite number"),
        ({"temps": (float("inf"),)}, "temperature must be a finite number"),
        ({"temps": (-0.5,)}, "temperature"),
        ({"seed": -1}, r"seed must be in \[0, 2\*\*64\)"),
        ({"seed": 2**63}, r"bench's seed must be in \[0, 2\*\*63\)"),
        ({"repeats": 0}, "repeats"),
    ],
)
def test_plan_rejects_bad_settings_with_generates_messages(bad, message) -> None:
    with pytest.raises(ConfigError, match=message):
        BenchPlan(**bad)
    BenchPlan(ks=(1, 64), temps=(0.0, 2.0), seed=2**63 - 1)  # the edges themselves are fine


def _synthetic() -> BenchResult:
    recs = []
    for cat, pid in (("qa", "1"), ("math", "2")):
        common = dict(
            temp=0.0,
            prompt_id=pid,
            category=cat,
            repeat=0,
            ttft=0.05,
            wall_time=1.0,
            finish_reason="length",
            peak_memory=2**20,
        )
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
            )
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


def test_ctrl_c_keeps_what_was_measured() -> None:
    from edgespec.commands import bench as command

    done = _synthetic().records[0]

    def interrupted(*_: object):
        yield done
        raise KeyboardInterrupt

    records, complete = command._measure(interrupted(), 1, quiet=True)
    assert (records, complete) == ([done], False)


def test_every_run_executes_on_mlx_lms_stream(monkeypatch, tmp_path: Path) -> None:
    """EdgeSpec's methods and mlx-lm's products run on one stream, hence one thread: a second
    thread calling a multi-threaded BLAS slows every later multi-row product (methods.one_stream)."""
    import argparse

    import mlx.core as mx
    from mlx_lm.generate import generation_stream

    from edgespec.commands import bench as command

    seen = []
    monkeypatch.setattr(command, "_run", lambda *a: seen.append(mx.default_stream(mx.cpu)) or 0)
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    args = parser.parse_args(["--out", str(tmp_path / "o"), "--quiet"])
    assert command.run(args) == 0
    with mx.stream(generation_stream):
        theirs = mx.default_stream(mx.cpu)
    assert seen == [theirs] != [mx.default_stream(mx.cpu)]


@pytest.fixture(scope="module")
def tiny_pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    from tests.helpers.tiny import make_tiny_pair

    root = tmp_path_factory.mktemp("pairs")
    return {kind: make_tiny_pair(root / kind, seed=0, draft=kind) for kind in ("subset", "self")}


def test_bench_end_to_end_on_tiny_models(tiny_pairs, tmp_path: Path) -> None:
    runtime = pytest.importorskip("edgespec.runtime")
    target, draft = tiny_pairs["subset"]
    engine = runtime.Engine.load(str(target), str(draft), draft_bits=0)
    plan = BenchPlan(methods=("plain", "spec", "mlx-lm"), ks=(2,), max_tokens=12, warmup_tokens=3)
    result = _bench(engine, plan, ["qa", "math"])
    assert [r.method for r in result.records[:3]] == ["plain", "spec", "mlx-lm"]
    assert [r.method for r in result.records[3:]] == ["spec", "mlx-lm", "plain"]  # rotated
    plain = {r.prompt_id: r.token_ids for r in result.records if r.method == "plain"}
    for r in result.records:
        assert 0 < r.tokens <= 12 and r.tokens == len(r.token_ids)
        if r.method == "spec":  # exact: greedy speculative output is plain's, token for token
            assert r.mismatch is False and r.token_ids == plain[r.prompt_id]
            assert r.rounds > 0 and r.t_draft is not None and r.t_draft > 0
    assert all(n.near_tie for n in result.notes)  # mlx-lm may differ only at a near-tie
    # the peer ran mlx-lm's model as loaded: EdgeSpec's CPU layers live in the Engine's twin only
    for model in (engine.target.model, engine.draft.model):
        assert not any(type(m).__module__.startswith("edgespec") for _, m in model.named_modules())
    variants = aggregate(result.records)
    files = write_report(result, variants, tmp_path)
    check_schema(json.loads(files.json.read_text()))
    assert len(files.plots) == 2 and all(p.read_bytes()[:8] == PNG_MAGIC for p in files.plots)


def test_self_draft_accepts_every_token(tiny_pairs) -> None:
    runtime = pytest.importorskip("edgespec.runtime")
    target, draft = tiny_pairs["self"]
    engine = runtime.Engine.load(str(target), str(draft), draft_bits=0)
    plan = BenchPlan(methods=("plain", "spec", "mlx-lm"), ks=(3,), max_tokens=10, warmup_tokens=2)
    by_method = {v.method: v.overall for v in aggregate(_bench(engine, plan, ["coding"]).records)}
    assert by_method["spec"].alpha == 1.0 and by_method["mlx-lm"].alpha == 1.0
    assert by_method["spec"].mismatches == 0
    assert by_method["plain"].tau is None


def test_cli_bench_subprocess(tiny_pairs, tmp_path: Path) -> None:
    pytest.importorskip("edgespec.runtime")
    target, draft = tiny_pairs["subset"]
    cmd = [
        sys.executable,
        "-m",
        "edgespec",
        "bench",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--draft-bits",
        "0",
        "--prompts",
        str(DEFAULT_PROMPTS),
        "--categories",
        "qa,coding",
        "--limit",
        "1",
        "--max-tokens",
        "6",
        "-k",
        "2",
        "--out",
        str(tmp_path),
        "--quiet",
        "--no-think",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "spec K=2 T=0" in proc.stdout and "results.json" in proc.stdout
    # The tiny template has no thinking mode: the switch changes nothing, said once.
    assert proc.stderr.count("has no thinking mode; --no-think changes nothing") == 1
    doc = json.loads((tmp_path / "results.json").read_text())
    check_schema(doc)
    assert doc["complete"] and doc["settings"]["n_prompts"] == 2
    assert doc["settings"]["thinking"] is None
    env_keys = {"platform", "machine", "cpu_count", "device", "blas", "cpu", "cpu_vendor"}
    assert env_keys <= set(doc["environment"]) and isinstance(doc["environment"]["cpu"], str)
    blas_names = ("mkl", "mkl-fast", "openblas", "preloaded", "reference", "accelerate")
    assert doc["environment"]["blas"] in blas_names  # the BLAS under the numbers
    rewrites = doc["environment"]["cpu_rewrites"]  # which CPU graph rewrites ran
    assert set(rewrites) == {
        "grouped_attention",
        "numpy_softmax",
        "fused_attention",
        "table_rope",
        "lean_ops",
        "compiled_blocks",
        "fast_exp",
        "draft_pairs",
    }
    assert all(isinstance(v, bool) for v in rewrites.values())
    assert rewrites["fused_attention"]  # asked for and built (the test machines have a compiler)
    labels = {m["label"] for m in doc["methods"]}  # the default methods
    assert labels == {"plain T=0", "spec K=2 T=0", "mlx-lm K=2 T=0", "adaptive-hybrid T=0"}
    assert (tmp_path / "results.md").is_file() and (tmp_path / "speedup_landscape.png").is_file()


def test_cli_unknown_method_is_one_line_error(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "edgespec",
        "bench",
        "--methods",
        "plain,turbo",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("edgespec bench: error: unknown methods ['turbo']")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--methods", "plain,turbo"], "unknown methods ['turbo']"),
        (["-k", "0"], "K (draft tokens per round) must be in 1..64"),
        (["--temp", "-1"], "temperature must be"),
        (["--limit", "0"], "--limit must be >= 1"),
    ],
)
def test_cli_bad_settings_are_refused_before_mlx_lm_is_imported(tmp_path: Path, args, needle):
    out = tmp_path / "out"
    proc = run_edgespec("bench", *args, "--out", str(out), path_first=mlx_lm_stopper(tmp_path))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgespec bench: error: "), proc.stderr
    assert needle in lines[0]
    assert not out.exists()


def test_cli_unwritable_out_fails_before_loading_and_a_failed_run_leaves_no_folder(
    tmp_path: Path,
) -> None:
    def bench(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "edgespec", "bench", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    # the default pair is not even looked up: the folder is checked first
    proc = bench("--out", str(blocker / "out"), "--pair", "no-such-pair")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"edgespec bench: error: cannot write the results to {blocker / 'out'}: Not a directory"
    ]
    fresh = tmp_path / "fresh" / "out"
    proc = bench("--out", str(fresh), "--pair", "no-such-pair")
    assert proc.returncode == 2 and "no model pair named 'no-such-pair'" in proc.stderr
    assert not fresh.exists() and (tmp_path / "fresh").is_dir()  # only the empty leaf is removed
    kept = tmp_path / "kept"
    (kept / "old.txt").parent.mkdir()
    (kept / "old.txt").write_text("earlier results")
    assert bench("--out", str(kept), "--pair", "no-such-pair").returncode == 2
    assert (kept / "old.txt").read_text() == "earlier results"
