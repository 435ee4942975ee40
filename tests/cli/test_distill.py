"""`edgespec distill` end to end on a tiny seeded target: instructions, resumable data shards,
KL training that lowers the loss, bit-exact resume from a checkpoint, quantized export."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from edgespec.architectures.token_draft import input_embedding, load_draft
from edgespec.distill import data as D
from edgespec.distill import shards as S
from edgespec.distill.checkpoints import TrainConfig, latest_checkpoint
from edgespec.distill.evaluate import OWN_PROMPTS, find_prompt_file
from edgespec.distill.evaluate import load_prompts as load_eval_prompts
from edgespec.distill.instructions import instructions, split
from edgespec.distill.target import Target, load_target, load_with_topk
from edgespec.distill.train import head_index, kl_loss, make_batch, new_draft, split_data, train
from edgespec.errors import ConfigError
from research.distill import tokens as T
from tests.helpers.prompt_sets import MT_BENCH, SPEC_BENCH, prompt_set
from tests.helpers.tiny import make_tiny_pair

N_INSTR = 120
PLAN = S.SamplingPlan(max_new_tokens=16, top_k_saved=8)
CFG = TrainConfig(
    layers="0,-1",
    head_size=96,
    steps=6,
    batch_tokens=384,
    lr=3e-3,
    warmup=1,
    eval_every=3,
    ckpt_every=3,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Target, Path]:
    """A tiny target and a data folder with two shards (~20 answers)."""
    root = tmp_path_factory.mktemp("distill")
    target_dir, _ = make_tiny_pair(root / "pair", seed=3)
    target = load_target(str(target_dir))
    meta = S.Meta(target=str(target_dir), n_instructions=N_INSTR, sampling=PLAN)
    D.generate_data(
        target.model,
        target.tokenizer,
        root / "data",
        meta,
        tokens=250,
        batch_size=8,
        shard_size=10,
        progress=False,
    )
    return target, root / "data"


# ----------------------------------------------------------------------------- instructions


def test_instructions_distinct_prefix_stable_and_seeded() -> None:
    xs = instructions(3000, seed=0)
    assert len(set(xs)) == 3000
    assert instructions(500, seed=0) == xs[:500]
    assert instructions(500, seed=1) != xs[:500]
    assert all(x.strip() == x and len(x) > 10 for x in xs)


def test_split_is_disjoint_and_covers_every_id() -> None:
    train_ids, held = split(5000, seed=0, eval_fraction=0.02)
    assert not set(train_ids) & set(held)
    assert sorted(train_ids + held) == list(range(5000))
    assert 50 <= len(held) <= 150


@pytest.mark.parametrize("variable", [MT_BENCH, SPEC_BENCH])
def test_instructions_never_contain_benchmark_prompts(variable: str) -> None:
    path = prompt_set(variable)
    bench = set()
    for line in path.read_text().splitlines():
        if line.strip():
            bench.update(t.strip() for t in json.loads(line)["turns"])
    assert not bench & set(instructions(20_000))


def test_evaluation_defaults_to_the_projects_own_prompts(tmp_path: Path) -> None:
    """Without --prompts, `edgespec distill --evaluate` reads edgespec/data/bench_prompts.jsonl
    (nothing outside the installed package); a missing --prompts file is a one-line error."""
    path = find_prompt_file(None)
    assert path == OWN_PROMPTS and path.is_file()
    questions = load_eval_prompts(path, 0, per_category=1)
    assert len(questions) >= 4 and len({q.category for q in questions}) == len(questions)
    assert not {q.text for q in questions} & set(instructions(20_000))  # never trained on
    with pytest.raises(ConfigError, match="prompt file not found"):
        find_prompt_file(str(tmp_path / "missing.jsonl"))


# ----------------------------------------------------------------------------- data


def test_shards_round_trip_and_match_the_format(tiny: tuple[Target, Path]) -> None:
    _, data_dir = tiny
    meta = S.Meta.read(data_dir)
    shards = S.shard_paths(data_dir)
    assert [p.name for p in shards] == ["shard-00000.npz", "shard-00001.npz"]
    with np.load(shards[0]) as z:
        assert z["tokens"].dtype == np.uint16 and z["starts"].dtype == np.int64
        assert z["prompt_lens"].dtype == np.int32 and z["instr_ids"].dtype == np.int32
        assert len(z["starts"]) == len(z["prompt_lens"]) + 1 == len(z["instr_ids"]) + 1
        assert z["topk_ids"].shape == (int(sum(np.diff(z["starts"]) - z["prompt_lens"])), 8)
    seqs = list(T.iter_sequences(data_dir))
    assert meta.n_sequences == len(seqs) == 20
    assert meta.n_completion_tokens == sum(s.n_completion for s in seqs) >= 250
    # Held-out instructions are answered first and greedily: top-1 == the emitted token.
    _, held = split_data(seqs, meta)
    assert held and all((s.topk_ids[:, 0] == s.ids[s.prompt_len :]).all() for s in held)


def test_generation_resumes_without_regenerating(tiny: tuple[Target, Path]) -> None:
    target, data_dir = tiny
    before = {p: p.stat().st_mtime_ns for p in S.shard_paths(data_dir)}
    meta = S.Meta(target=target.name, n_instructions=N_INSTR, sampling=PLAN)
    again = D.generate_data(
        target.model,
        target.tokenizer,
        data_dir,
        meta,
        tokens=250,
        batch_size=8,
        shard_size=10,
        progress=False,
    )
    assert {p: p.stat().st_mtime_ns for p in S.shard_paths(data_dir)} == before
    assert again.n_sequences == 20


def test_generation_continues_with_new_ids_only(tmp_path: Path, tiny: tuple[Target, Path]) -> None:
    target, data_dir = tiny
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    S.shard_paths(copy)[-1].unlink()  # as if killed before the second shard was written
    meta = S.Meta(target=target.name, n_instructions=N_INSTR, sampling=PLAN)
    meta = D.generate_data(
        target.model,
        target.tokenizer,
        copy,
        meta,
        tokens=400,
        batch_size=8,
        shard_size=10,
        progress=False,
    )
    ids = [s.instr_id for s in T.iter_sequences(copy)]
    assert len(ids) == len(set(ids)) > 20


def test_mismatched_data_folder_is_refused(tiny: tuple[Target, Path]) -> None:
    from edgespec.errors import ConfigError

    target, data_dir = tiny
    other = S.Meta(target=target.name, instruction_seed=7, n_instructions=N_INSTR)
    with pytest.raises(ConfigError, match="instruction_seed"):
        D.generate_data(target.model, target.tokenizer, data_dir, other, tokens=10)


# ----------------------------------------------------------------------------- training


def _mean_kl(model, seqs, hidx) -> float:  # type: ignore[no-untyped-def]
    b = make_batch(seqs, hidx, 512)
    return float(kl_loss(model, b)[0].item())


def test_kl_of_the_target_itself_is_only_the_topk_truncation(tiny: tuple[Target, Path]) -> None:
    target, data_dir = tiny
    seqs = load_with_topk(data_dir, None)
    model, config = new_draft(target, seqs, TrainConfig(layers="0,1,2,3", head_size=384))
    # All 4 layers and the full vocabulary as the head: the draft *is* the target, so the only
    # divergence left is the top-k truncation of p: KL(p_topk / Z || p) = -log Z per position.
    hidx = head_index(np.array(model.head_ids), config["vocab_size"])
    part = seqs[:4]
    lp = np.concatenate([s.topk_logprobs.astype(np.float64) for s in part])
    expected = float(np.mean(-np.log(np.exp(lp).sum(-1))))
    assert _mean_kl(model, part, hidx) == pytest.approx(expected, abs=2e-3)


def test_training_lowers_the_loss(tmp_path: Path, tiny: tuple[Target, Path]) -> None:
    target, data_dir = tiny
    meta = S.Meta.read(data_dir)
    seqs, _ = split_data(load_with_topk(data_dir, None), meta)
    before_model, config = new_draft(target, seqs, CFG)
    hidx = head_index(np.array(before_model.head_ids), config["vocab_size"])
    before = _mean_kl(before_model, seqs, hidx)
    cfg = TrainConfig(**{**CFG.__dict__, "steps": 25})
    result = train(target, data_dir, tmp_path / "out", cfg, progress=False)
    after = _mean_kl(result.model, seqs, hidx)
    assert after < 0.7 * before
    curve = json.loads((tmp_path / "out" / "train" / "curve.json").read_text())
    assert [r["step"] for r in curve][:2] == [0, 3] and curve[-1]["tokens_seen"] > 0


def test_checkpoint_resume_reaches_the_same_state(
    tmp_path: Path, tiny: tuple[Target, Path]
) -> None:
    target, data_dir = tiny
    full = train(target, data_dir, tmp_path / "a", CFG, progress=False)
    # Simulate a kill after step 3: keep only ckpt-000003 and point `latest` at it.
    part = tmp_path / "b" / "train"
    part.mkdir(parents=True)
    shutil.copytree(tmp_path / "a" / "train" / "ckpt-000003", part / "ckpt-000003")
    (part / "latest").write_text("ckpt-000003")
    resumed = train(None, data_dir, tmp_path / "b", CFG, resume=True, progress=False)
    assert resumed.state.step == full.state.step == 6
    assert (resumed.state.epoch, resumed.state.pos) == (full.state.epoch, full.state.pos)
    a = mx.load(str(latest_checkpoint(tmp_path / "a" / "train") / "draft.safetensors"))
    b = mx.load(str(latest_checkpoint(part) / "draft.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(np.array(a[k]), np.array(b[k]), atol=1e-6, err_msg=k)


# ----------------------------------------------------------------------------- CLI + export


def test_cli_end_to_end_exports_a_loadable_4bit_draft(
    tmp_path: Path, tiny: tuple[Target, Path]
) -> None:
    from edgespec.cli import main

    target, data_dir = tiny
    out = tmp_path / "run"
    argv = [
        "distill",
        "--target",
        str(target.name),
        "--out",
        str(out),
        "--data",
        str(data_dir),
        "--tokens",
        "250",
        "--instructions",
        str(N_INSTR),
        "--max-new-tokens",
        "16",
        "--layers",
        "0,-1",
        "--head-size",
        "96",
        "--steps",
        "4",
        "--batch",
        "384",
        "--eval-every",
        "2",
        "--ckpt-every",
        "2",
        "--warmup",
        "1",
        "--bits",
        "4",
    ]
    assert main(argv) == 0
    assert main(argv) == 2  # a second run without --resume refuses to clobber the first
    with pytest.raises(ValueError, match="shares its target's embedding"):
        load_draft(out / "draft")  # the exported draft has no embedding of its own
    model, config = load_draft(out / "draft", input_embedding(target.model))
    assert model.model.embed_tokens is input_embedding(target.model)  # shared, not copied
    assert not any("embed_tokens" in k for k in mx.load(str(out / "draft" / "model.safetensors")))
    assert config["quantization"] == {"group_size": 64, "bits": 4}
    assert config["num_hidden_layers"] == 2 and config["head_size"] == 96
    logits = np.array(model(mx.array([[5, 6, 7]])))[0, -1]
    on = np.zeros(config["vocab_size"], bool)
    on[np.array(model.head_ids)] = True
    assert np.isneginf(logits[~on]).all() and np.isfinite(logits[on]).all()
    card = (out / "draft" / "README.md").read_text()
    assert "edgespec distill --target" in card and "Apache-2.0" not in card
    licence = card.split("## Licence")[1]
    assert "under the target's licence" in licence  # not the embedded target's Apache-2.0
    assert "--warmup 1" in card and "--bits 4" in card  # the card's command reproduces the run
    assert "4-bit" in card


@pytest.fixture(scope="module")
def evaluated_pair(
    tmp_path_factory: pytest.TempPathFactory, tiny: tuple[Target, Path]
) -> tuple[str, Path, Path]:
    """(target, exported draft, prompt file with two categories) for `distill --evaluate`."""
    from edgespec.distill.export import Card, export_draft

    target, data_dir = tiny
    root = tmp_path_factory.mktemp("evaluate")
    result = train(target, data_dir, root / "out", CFG, progress=False)
    card = Card("tiny", "test", 0, 0, 0, 0, [0, 3], 96)
    export_draft(result.model, result.config, root / "draft", card)
    prompts = root / "prompts.jsonl"
    turns = [("greet", "Hello there"), ("ask", "Why not"), ("greet", "Good morning")]
    rows = [{"question_id": i, "category": c, "turns": [t]} for i, (c, t) in enumerate(turns)]
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(target.name), root / "draft", prompts


def test_evaluate_reports_agreement_cost_identical_output_and_categories(
    evaluated_pair: tuple[str, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from edgespec.cli import main

    target, draft, prompts = evaluated_pair
    argv = ["distill", "--evaluate", "--target", target, "--draft", str(draft)]
    argv += ["--prompts", str(prompts), "--n-prompts", "3", "--eval-tokens", "8", "--json"]
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["prompts"] == 3 and 0.0 <= r["agreement"] <= 1.0 and r["agreement_tokens"] > 0
    assert r["draft_ms"] > 0 and r["target_ms"] > 0
    assert r["c"] == pytest.approx(r["draft_ms"] / r["target_ms"])
    assert r["identical"] == 3  # temperature 0: speculation never changes the output
    assert 0.0 <= r["acceptance"] <= 1.0 and r["tau"] >= 1.0
    cats = r["categories"]
    assert list(cats) == ["greet", "ask"]  # first-appearance order
    assert [cats[c]["prompts"] for c in cats] == [2, 1]
    assert [cats[c]["identical"] for c in cats] == [2, 1]
    assert sum(c["agreement_tokens"] for c in cats.values()) == r["agreement_tokens"]
    hits = sum(c["agreement"] * c["agreement_tokens"] for c in cats.values())
    assert hits == pytest.approx(r["agreement"] * r["agreement_tokens"])
    assert all(0.0 <= c["acceptance"] <= 1.0 and c["tau"] >= 1.0 for c in cats.values())
    assert r["margin"] == 0.10 and r["min_category"] == 0.0 and isinstance(r["flagged"], list)


def test_evaluate_cli_prints_categories_and_flags_them(evaluated_pair: tuple[str, Path, Path]):
    """The real CLI as a subprocess: the table by category, an overall row, and a warning for
    every category under --min-category 1 (a 6-step tiny draft never agrees everywhere)."""
    from tests.helpers.cli import run_edgespec

    target, draft, prompts = evaluated_pair
    args = ["--target", target, "--draft", str(draft), "--prompts", str(prompts)]
    proc = run_edgespec(
        "distill",
        "--evaluate",
        *args,
        "--per-category",
        "1",
        "--eval-tokens",
        "8",
        "--min-category",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    table = [ln.split() for ln in lines if ln.split()[:1] in (["greet"], ["ask"], ["overall"])]
    assert [row[:2] for row in table] == [["greet", "1"], ["ask", "1"], ["overall", "2"]]
    warned = {ln.split()[1].rstrip(":") for ln in lines if ln.startswith("warning: ")}
    assert warned == {"greet", "ask"}, proc.stdout
    bad = run_edgespec("distill", "--evaluate", *args, "--per-category", "0")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--per-category" in bad.stderr


def test_by_category_pools_each_category_and_flags_the_weak_one() -> None:
    from edgespec.commands.distill import MARGIN
    from edgespec.distill.evaluate import EvalReport, by_category, flag_categories
    from edgespec.events import Finished, Stats

    def run(tokens: int, rounds: int, drafted: int, accepted: int, text: str) -> Finished:
        stats = Stats(tokens, rounds, drafted, accepted, 0.0, 0.0, 0.0, 1.0, 0.0, 5, 5)
        return Finished("length", stats, text)

    cats = ["a", "b", "a"]
    counts = np.array([[3, 4], [0, 4], [1, 4]])
    plain = [run(8, 8, 0, 0, "x"), run(8, 8, 0, 0, "y"), run(8, 8, 0, 0, "z")]
    spec = [run(8, 4, 8, 4, "x"), run(8, 8, 8, 0, "y"), run(8, 2, 8, 8, "Z")]
    got = by_category(cats, counts, plain, spec)
    assert list(got) == ["a", "b"]
    a, b = got["a"], got["b"]
    assert (a.prompts, a.agreement, a.agreement_tokens) == (2, 0.5, 8)
    assert (a.acceptance, a.tau, a.identical) == (12 / 16, 16 / 6, 1)
    assert (b.prompts, b.agreement, b.acceptance, b.tau, b.identical) == (1, 0.0, 0.0, 1.0, 1)

    report = EvalReport(3, 4 / 12, 12, 1.0, 10.0, 0.1, acceptance=12 / 24, categories=got)
    assert report.margin == MARGIN  # the CLI's default is the library's
    flags = flag_categories(report)  # floor: overall - 0.10
    assert [f.split(":")[0] for f in flags] == ["b", "b"]
    assert "agreement 0.000 is below 0.233 (overall 0.333 - margin 0.10)" in flags[0]
    report.min_category = 0.6  # a floor above overall - margin flags "a" as well
    flags = flag_categories(report)
    assert len(flags) == 3 and "a: agreement 0.500 is below 0.600 (the floor 0.60)" in flags
    report.margin, report.min_category = 1.0, 0.0
    assert flag_categories(report) == []


def test_load_prompts_selects_per_category_and_rejects_bad_lines(tmp_path: Path) -> None:
    from edgespec.distill.evaluate import NO_CATEGORY, load_prompts
    from edgespec.errors import ConfigError

    rows = [{"category": c, "turns": [f"q{i}"]} for i, c in enumerate("aabba")]
    rows.append({"turns": ["q5"]})
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert [q.text for q in load_prompts(path, 3)] == ["q0", "q1", "q2"]
    picked = load_prompts(path, 3, per_category=1)
    assert [(q.category, q.text) for q in picked] == [("a", "q0"), ("b", "q2"), (NO_CATEGORY, "q5")]
    assert [q.text for q in load_prompts(path, 1, per_category=2)] == ["q0", "q1", "q2", "q3", "q5"]
    path.write_text(json.dumps(rows[0]) + "\n{not json\n")
    with pytest.raises(ConfigError, match=r"q.jsonl:2: not a question record"):
        load_prompts(path, 1)


def test_export_tokens_keeps_ids_and_drops_topk(tmp_path):
    from edgespec.distill.shards import Meta, Sequence, write_shard
    from research.distill.tokens import export_tokens, iter_sequences

    src = tmp_path / "src"
    src.mkdir()
    seqs = [
        Sequence(
            4, 2, np.array([1, 2, 3, 4]), np.ones((2, 3), np.int32), np.zeros((2, 3), np.float16)
        ),
        Sequence(7, 1, np.array([5, 6]), np.ones((1, 3), np.int32), np.zeros((1, 3), np.float16)),
    ]
    write_shard(src, 3, seqs)
    Meta(target="t").write(src)
    meta = export_tokens(src, tmp_path / "dst")
    out = list(iter_sequences(tmp_path / "dst"))
    assert [s.ids.tolist() for s in out] == [[1, 2, 3, 4], [5, 6]]
    assert [(s.instr_id, s.prompt_len) for s in out] == [(4, 2), (7, 1)]
    assert all(s.topk_ids is None for s in out)
    assert (tmp_path / "dst" / "shard-00003.npz").exists()
    assert meta.n_sequences == 2 and meta.n_completion_tokens == 3 and meta.target == "t"
