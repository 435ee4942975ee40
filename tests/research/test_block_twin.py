"""research/block_draft/gpu_train.py (the block draft's PyTorch twin for a lent GPU) against the
MLX recipe it twins, on the tiny target: the target's layer outputs (features.py), the draft's
loss and logits (train.py's loss_fn), one optimiser step (MLX's AdamW), the anchor draws; and a
smoke run whose shipped checkpoint export.py turns into a folder load_block loads. Skipped where
torch is not installed (it is on the lent GPU; on a developer's machine, `pip install torch`)."""

from __future__ import annotations

import json
import math
from argparse import Namespace
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from research.block_draft import export, features, gpu_train, heldout, twin_ckpt  # noqa: E402
from research.block_draft import torch_block as tb  # noqa: E402
from research.block_draft import train as mlx_train  # noqa: E402

LAYERS, INIT, BLOCK = [0, 1, 3], [0, 3], 4


@pytest.fixture(scope="module")
def pair(tiny_pair):
    """(target folder, MLX target, torch hyper-parameters, torch target weights)."""
    from edgespec.loading.load import load_model

    folder = tiny_pair[0]
    hp, w = gpu_train.load_target(str(folder), "cpu")
    return folder, load_model(str(folder), dequantize=False).model, hp, w


def write_data(folder: Path, n: int = 70, seed: int = 0) -> Path:
    """A data shard as the recipes write them: random token ids, prompts of 4-12 tokens."""
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(20, 300, int(rng.integers(18, 50))) for _ in range(n)]
    starts = np.concatenate([[0], np.cumsum([len(s) for s in seqs])])
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(
        folder / "shard-00000.npz",
        tokens=np.concatenate(seqs).astype(np.uint16),
        starts=starts.astype(np.int64),
        prompt_lens=rng.integers(4, 12, n).astype(np.int32),
    )
    return folder


def mlx_draft(target, hp):
    """train.py's draft for the tiny target (its build(), without a features folder)."""
    from edgespec.architectures.block_model import BlockArgs, BlockModel

    ns = Namespace(init_layers=INIT, block=BLOCK, layers=LAYERS, mask_id=16)
    cfg = gpu_train.draft_config(hp, ns)
    model = BlockModel(BlockArgs.from_config(cfg))
    model.attach(target)
    mlx_train.init_from_target(model, target, INIT)
    return model, cfg


def chunks_with_features(target, data: Path):
    """features.py's chunk of the data's first 48 sequences, features from the MLX target."""
    seqs = features.read_sequences([data], 640)[:48]
    chunk = gpu_train.as_chunk(seqs)
    feats = [np.array(features.layer_outputs(target, s[None], tuple(LAYERS)))[0] for s, _ in seqs]
    chunk["feats"] = np.concatenate(feats).astype(np.float16)
    return [chunk]


def stored_features(tw, hp, chunks, src, picks) -> gpu_train.Features:
    """The twin's feature store holding the MLX features of `src`'s sequences `picks` (so both
    sides read the same float16 rows)."""
    feats = gpu_train.Features(tw, hp, LAYERS, chunks, 4096, 0)
    ch = chunks[0]
    for p in picks:
        lo, hi = ch["starts"][p], ch["starts"][p + 1]
        feats.store[src.index[p]] = torch.from_numpy(ch["feats"][lo:hi])
    return feats


def test_target_layer_outputs_match_mlx(pair, tmp_path):
    _, target, hp, w = pair
    batch = np.random.default_rng(1).integers(0, hp["vocab"], (3, 29)).astype(np.int32)
    ours = tb.layer_outputs(w, hp, torch.from_numpy(batch).long(), LAYERS).numpy()
    theirs = np.array(features.layer_outputs(target, batch, tuple(LAYERS)))
    assert ours.shape == theirs.shape == (3, 29, len(LAYERS) * hp["hidden"])
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)


def test_gguf_target_matches_its_mlx_model(tmp_path):
    """The lent GPU's path: the target read from a GGUF (llama.cpp's q/k row order undone by
    gpu_distill's loader) computes the layer outputs of the mlx-lm model it was written from."""
    pytest.importorskip("gguf")
    from mlx_lm.models import llama

    from tests.helpers.gguf import tiny_args, tiny_metadata, to_gguf_tensors

    mx.random.seed(4)
    model = llama.Model(tiny_args())
    mx.eval(model.parameters())
    meta = tiny_metadata() | {"llama.vocab_size": mx.array(model.args.vocab_size, dtype=mx.uint32)}
    mx.save_gguf(str(tmp_path / "t.gguf"), to_gguf_tensors(model, mx.float32), meta)
    hp, w = gpu_train.load_target(str(tmp_path / "t.gguf"), "cpu")
    batch = np.random.default_rng(2).integers(0, hp["vocab"], (2, 17)).astype(np.int32)
    ours = tb.layer_outputs(w, hp, torch.from_numpy(batch).long(), [0, 1]).numpy()
    theirs = np.array(features.layer_outputs(model, batch, (0, 1)))
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)


def test_draft_parameters_are_the_mlx_models(pair):
    from mlx.utils import tree_flatten

    model, _ = mlx_draft(pair[1], pair[2])
    assert set(tb.draft_names(len(INIT))) == {k for k, _ in tree_flatten(model.parameters())}


def test_loss_logits_and_a_step_match_train_py(pair, tmp_path):
    """Same weights, same blocks: the twin's loss and logits are train.py's to 1e-4, and two
    optimiser steps leave the same weights and MLX optimiser state."""
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten, tree_unflatten

    _, target, hp, tw = pair
    model, cfg = mlx_draft(target, hp)
    chunks = chunks_with_features(target, write_data(tmp_path / "data"))
    head = mlx_train.head_ids(chunks, 200, hp["vocab"])
    object.__setattr__(model, "train_head", target.model.embed_tokens.weight[mx.array(head)])
    src = mlx_train.Anchors(chunks, BLOCK, 40, 16, seed=3)
    seqs = [src.sequence(p) for p in (0, 5, 9)]  # contexts and anchor counts differ
    seqs = [(r, a, t, mlx_train.to_head(lab, head)) for r, a, t, lab in seqs]
    assert len({len(a) for _, a, _, _ in seqs}) > 1  # padded rows in the twin's batch
    gamma = mx.array([math.exp(-j / 4.0) for j in range(BLOCK - 1)])
    loss, logits = mlx_train.loss_fn(model, [mlx_train.as_mx(s) for s in seqs], gamma)

    w = {k: torch.from_numpy(np.array(v)) for k, v in tree_flatten(model.parameters())}
    feats = stored_features(tw, hp, chunks, src, (0, 5, 9))
    items = [(src.index[p], a, t, lab) for p, (_, a, t, lab) in zip((0, 5, 9), seqs, strict=True)]
    batch = gpu_train.collate(items, feats, "cpu")
    d = gpu_train.make_draft(cfg, w, tw["model.embed_tokens.weight"], head, 4.0)
    ours, our_logits = gpu_train.loss_fn(d, batch)
    assert abs(float(ours) - float(loss)) < 1e-4
    for r, lg in enumerate(logits):
        n = lg.shape[0]
        np.testing.assert_allclose(our_logits[r, :n].detach().numpy(), np.array(lg), atol=1e-4)
    # agreement: labels set to train.py's own predictions, every third one wrong, so the
    # per-position counts (padding rows and label -1 left out) are fractions, not 0
    ev_seqs = []
    for seq, lg in zip(seqs, logits, strict=True):
        pred = np.array(mx.argmax(lg, -1))
        pred[::3] = (pred[::3] + 1) % len(head)
        ev_seqs.append((*seq[:3], np.where(seq[3] >= 0, pred, -1).astype(np.int32)))
    ev_items = [(it[0], *seq[1:]) for it, seq in zip(items, ev_seqs, strict=True)]
    ours_ev = gpu_train.evaluate(d, gpu_train.collate(ev_items, feats, "cpu"))
    theirs_ev = mlx_train.evaluate(model, ev_seqs, gamma)
    assert 0.3 < theirs_ev["acc1"] < 0.9 and ours_ev == pytest.approx(theirs_ev)

    grad = nn.value_and_grad(model, lambda m, s: mlx_train.loss_fn(m, s, gamma)[0])
    opt = optim.AdamW(learning_rate=1e-3, weight_decay=0.0)
    twin = twin_ckpt.MlxAdamW(w)
    for v in w.values():
        v.requires_grad_(True)
    for _ in range(2):  # the same gradients (to 1e-4 of the largest), the same update rule
        _, g = grad(model, [mlx_train.as_mx(s) for s in seqs])
        g = {k: torch.from_numpy(np.array(v)) for k, v in tree_flatten(g)}
        loss_t, _ = gpu_train.loss_fn(d, batch)
        ours_g = dict(zip(w, torch.autograd.grad(loss_t, list(w.values())), strict=True))
        for k in w:
            assert (ours_g[k] - g[k]).abs().max() <= 1e-4 * g[k].abs().max() + 1e-7, k
        opt.update(model, tree_unflatten([(k, mx.array(v.numpy())) for k, v in g.items()]))
        twin.update(w, g, 1e-3)
    mx.eval(model.parameters(), opt.state)
    for k, v in tree_flatten(model.parameters()):
        np.testing.assert_allclose(w[k].detach().numpy(), np.array(v), atol=1e-6)
    state = dict(tree_flatten(opt.state))
    assert set(state) == set(twin.arrays())
    assert int(twin.arrays()["step"]) == int(state["step"]) == 2
    np.testing.assert_allclose(
        twin.arrays()["fc.weight.v"], np.array(state["fc.weight.v"]), rtol=1e-6
    )


def test_soft_labels_match_kd_py(pair, tmp_path):
    """--kd: the twin's soft-label loss, logits, gradients and agreement with the target's
    argmax are kd.py's (train.py --kd) on the same draws, to 1e-4."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    from research.block_draft import kd, torch_kd

    _, target, hp, tw = pair
    model, cfg = mlx_draft(target, hp)
    chunks = chunks_with_features(target, write_data(tmp_path / "data"))
    head = mlx_train.head_ids(chunks, 200, hp["vocab"])
    object.__setattr__(model, "train_head", target.model.embed_tokens.weight[mx.array(head)])
    src = kd.KdAnchors(chunks, BLOCK, 40, 16, 3, hp["hidden"])
    picks = (0, 5, 9)
    seqs = [src.sequence(p) for p in picks]
    seqs = [(r, a, t, mlx_train.to_head(lab, head), soft) for r, a, t, lab, soft in seqs]
    assert any(s[1].max() + BLOCK - 2 >= len(s[0]) for s in seqs)  # rows past the answer's end
    gamma = mx.array([math.exp(-j / 4.0) for j in range(BLOCK - 1)])
    norm = target.model.norm
    loss, logits = kd.kd_loss_fn(model, [mlx_train.as_mx(s) for s in seqs], gamma, norm)
    theirs_ev = kd.target_agreement(model, seqs, norm)

    w = {k: torch.from_numpy(np.array(v)) for k, v in tree_flatten(model.parameters())}
    feats = stored_features(tw, hp, chunks, src, picks)
    items = [(src.index[p], *seq[1:4]) for p, seq in zip(picks, seqs, strict=True)]
    batch = gpu_train.collate(items, feats, "cpu", hp["hidden"])
    assert len(batch) == 5 and batch[4].shape[-1] == hp["hidden"]
    rule = torch_kd.Kd(tw["model.norm.weight"], hp["eps"])
    d = gpu_train.make_draft(cfg, w, tw["model.embed_tokens.weight"], head, 4.0, rule)
    ours, our_logits = d.loss(batch)
    hard, _ = gpu_train.loss_fn(d, batch)
    assert abs(float(ours) - float(loss)) < 1e-4 and abs(float(hard) - float(ours)) > 1e-2
    for r, lg in enumerate(logits):
        np.testing.assert_allclose(
            our_logits[r, : lg.shape[0]].detach().numpy(), np.array(lg), atol=1e-4
        )
    assert d.kd.agreement(d, batch, our_logits) == pytest.approx(theirs_ev, abs=1e-6)

    class Echo(torch_kd.Kd):  # a target ranking as the draft does but in every fourth row
        def target_logits(self, d_, soft):
            lg = our_logits.detach().clone().flatten(0, -2)
            lg[::4] = lg[::4].roll(1, -1)
            return lg.view_as(our_logits)

    echo = gpu_train.make_draft(cfg, w, d.embed, head, 4.0, Echo(rule.norm, rule.eps))
    ev = echo.kd.agreement(echo, batch, our_logits)
    assert 0.4 < ev["top1"] < 0.9 and 1.0 < ev["tau_target"] < 1 + (BLOCK - 1) * 0.9

    grad = nn.value_and_grad(model, lambda m, s: kd.kd_loss_fn(m, s, gamma, norm)[0])
    _, g = grad(model, [mlx_train.as_mx(s) for s in seqs])
    g = dict(tree_flatten(g))
    for v in w.values():
        v.requires_grad_(True)
    ours_g = dict(zip(w, torch.autograd.grad(d.loss(batch)[0], list(w.values())), strict=True))
    for k in w:
        ref = torch.from_numpy(np.array(g[k]))
        assert (ours_g[k] - ref).abs().max() <= 1e-4 * ref.abs().max() + 1e-7, k


def test_draws_are_train_pys(tmp_path):
    """gpu_train.draw takes train.py's random stream: same seed, same anchors and labels."""
    chunk = gpu_train.as_chunk(features.read_sequences([write_data(tmp_path / "d")], 640))
    head = mlx_train.head_ids([chunk], 50, 400)
    ours, theirs = (mlx_train.Anchors([chunk], 8, 5, 16, seed=7) for _ in range(2))
    for _ in range(4):
        key, a, t, lab = gpu_train.draw(ours, head)
        _, a2, t2, lab2 = theirs.sequence()
        assert np.array_equal(a, a2) and np.array_equal(t, t2)
        assert np.array_equal(lab, mlx_train.to_head(lab2, head))
        assert key in theirs.index


def test_schedule_is_train_pys_or_the_deadlines():
    assert gpu_train.lr_at(0, 1.0, 100, 0.9) == pytest.approx(0.01)  # warm-up, step count
    assert gpu_train.lr_at(150, 1.0, 300, 0.0) == pytest.approx(0.5)
    assert gpu_train.lr_at(150, 1.0, 0, 0.5) == pytest.approx(0.5)  # by the time gone
    assert gpu_train.lr_at(500, 1.0, 300, 0.0) == gpu_train.lr_at(500, 1.0, 0, 1.5) == 0.0


def test_parts_fit_the_limit_and_join_restores_the_run(tmp_path):
    assert twin_ckpt.parts({"a": 6, "b": 5, "c": 4, "d": 1}, 10) == [["a", "c"], ["b", "d"]]
    w = {f"t{i}": torch.randn(10, 100 + i) for i in range(9)}
    run = tmp_path / "run"
    twin_ckpt.save_run(run, w, twin_ckpt.MlxAdamW(w), 7)
    (run / "config.json").write_text("{}\n")
    (run / "curve.csv").write_text("step\n7\n")
    np.save(run / "head_ids.npy", np.arange(5, dtype=np.int32))
    files = twin_ckpt.ship(run, tmp_path / "ship", limit=12_000)
    shards = [f for f in files if f.name.startswith("model-")]
    assert len(shards) > 1 and all(f.stat().st_size <= 12_000 for f in shards)
    twin_ckpt.join(tmp_path / "ship", tmp_path / "back")
    _, head, back, opt, step = twin_ckpt.load_run(tmp_path / "back", "cpu")
    assert step == 7 and int(opt["step"]) == 7 and not opt["t0.m"].any()
    assert np.array_equal(head, np.arange(5)) and all(torch.equal(back[k], w[k]) for k in w)


def test_smoke_run_resumes_ships_and_exports(pair, tmp_path, monkeypatch):
    from edgespec.architectures.block_model import load_block

    folder, target, _, _ = pair
    data = write_data(tmp_path / "data", n=80)
    args = ["train", "--target", str(folder), "--data", str(data), "--device", "cpu"]
    args += ["--out", str(tmp_path / "run"), "--ship", str(tmp_path / "ship")]
    args += ["--layers", "0,1,3", "--init-layers", "0,3", "--block", "4", "--per-seq", "6"]
    args += ["--seqs", "3", "--eval-every", "2", "--feature-tokens", "512", "--lr", "1e-3"]
    assert gpu_train.main([*args, "--steps", "3"]) == 0
    assert gpu_train.main([*args, "--steps", "2"]) == 0  # resumes from --out's checkpoint
    rows = (tmp_path / "run" / "curve.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["2", "3", "4", "5"]
    assert all(0 <= float(x) <= 1 for x in rows[-1].split(",")[5:])
    assert json.loads((tmp_path / "ship" / "state.json").read_text())["step"] == 5

    gpu_train.main(["join", "--ship", str(tmp_path / "ship"), "--out", str(tmp_path / "back")])
    for bits in ("0", "4"):
        out = tmp_path / f"block{bits}"
        assert (
            export.main(["--run", str(tmp_path / "back"), "--out", str(out), "--bits", bits]) == 0
        )
        model, config = load_block(out, target)
        assert config["target_layer_ids"] == LAYERS and config["block_size"] == BLOCK
        ctx = model.context(mx.zeros((1, 5, len(LAYERS) * 64)))
        h = model(mx.array([[7, 16, 16, 16]]), ctx)
        assert model.logits(h).shape == (1, BLOCK, target.args.vocab_size)
    _, _, shipped, _, _ = twin_ckpt.load_run(tmp_path / "run", "cpu")
    model, _ = load_block(tmp_path / "block0", target)
    from mlx.utils import tree_flatten

    # A later run trains on from the exported 8-bit draft (what the repository keeps)
    assert (
        export.main(
            ["--run", str(tmp_path / "back"), "--out", str(tmp_path / "b8")] + ["--bits", "8"]
        )
        == 0
    )
    cfg, ids, w8, opt, step = twin_ckpt.load_run(tmp_path / "b8", "cpu")
    _, ids0, w0, _, _ = twin_ckpt.load_run(tmp_path / "back", "cpu")
    assert step == 5 and opt is None and np.array_equal(ids, ids0) and set(w8) == set(w0)
    assert cfg == {
        k: v
        for k, v in json.loads((tmp_path / "back" / "config.json").read_text()).items()
        if k in cfg
    }
    for k in w0:  # 8-bit groups of 32: within a 255th of each group's range
        assert torch.allclose(w8[k], w0[k], atol=float(w0[k].abs().max()) / 100)
    more = [a if a != str(tmp_path / "run") else str(tmp_path / "run2") for a in args]
    rates, update = [], twin_ckpt.MlxAdamW.update
    monkeypatch.setattr(
        twin_ckpt.MlxAdamW, "update", lambda o, w, g, lr: rates.append(lr) or update(o, w, g, lr)
    )
    assert gpu_train.main([*more, "--resume", str(tmp_path / "b8"), "--steps", "1"]) == 0
    assert 0 < rates[0] <= 1e-3 / 100  # fresh moments on trained weights: warmed up again
    rows = (tmp_path / "run2" / "curve.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["2", "3", "4", "5", "6"]
    head = np.load(tmp_path / "back" / "head_ids.npy")  # the export scores the training head
    assert model.args.head_size == len(head) and np.array_equal(np.array(model.head_ids), head)
    for k, v in tree_flatten(model.parameters()):
        if k != "head_ids":
            np.testing.assert_array_equal(np.array(v), shipped[k].numpy())


def test_kd_run_trains_on_soft_labels_and_logs_the_targets_agreement(pair, tmp_path, capsys):
    """gpu_train --kd end to end: the loss falls over a few steps on the same sequences, the log
    gives agreement with the target's argmax, and a draft not reading the target's last layer
    is refused in one line."""
    folder = pair[0]
    data = write_data(tmp_path / "data", n=80)
    base = ["train", "--target", str(folder), "--data", str(data), "--device", "cpu", "--kd"]
    base += ["--init-layers", "0,3", "--block", "4"]
    args = [*base, "--out", str(tmp_path / "run"), "--per-seq", "6", "--seqs", "3"]
    args += ["--eval-every", "3", "--feature-tokens", "512", "--lr", "3e-3"]
    args += ["--reload-every", "1000", "--total-steps", "100000"]
    assert gpu_train.main([*args, "--layers", "0,1,3", "--steps", "9"]) == 0
    out = capsys.readouterr().out
    assert out.count("'tau_target'") == 3 and "'top3'" in out
    losses = [
        float(r.split(",")[3]) for r in (tmp_path / "run" / "curve.csv").read_text().split()[1:]
    ]
    assert len(losses) == 3 and losses[-1] < losses[0]
    # heldout.py evaluates the saved draft as the run did at its last step, plus the target's
    assert heldout.main([str(tmp_path / "run"), "--target", str(folder), "--data", str(data)]) == 0
    got = json.loads(capsys.readouterr().out.splitlines()[-1])
    last = [float(x) for x in (tmp_path / "run" / "curve.csv").read_text().split()[-1].split(",")]
    assert got["step"] == 9 and got["tau_independent"] == pytest.approx(last[4], abs=1e-3)
    assert [got[f"acc{j}"] for j in (1, 2, 3)] == pytest.approx(last[5:8], abs=1e-3)
    assert 1.0 <= got["tau_target"] <= BLOCK and "top3" in got
    with pytest.raises(SystemExit, match="last layer"):
        gpu_train.main([*base, "--out", str(tmp_path / "other"), "--layers", "0,1,2"])


def test_train_py_goes_on_from_the_twins_runs(pair, tmp_path, capsys):
    """train.py (MLX, the CPU) resumes a run the twin wrote, and one it shipped and joined:
    weights, optimiser state and step load, and its curve goes on; the twin resumes train.py's."""
    folder = pair[0]
    data = write_data(tmp_path / "data", n=80)
    args = ["train", "--target", str(folder), "--data", str(data), "--device", "cpu"]
    args += ["--out", str(tmp_path / "run"), "--ship", str(tmp_path / "ship")]
    args += ["--layers", "0,1,3", "--init-layers", "0,3", "--block", "4", "--per-seq", "6"]
    assert gpu_train.main([*args, "--seqs", "2", "--steps", "3", "--eval-every", "3"]) == 0
    gpu_train.main(["join", "--ship", str(tmp_path / "ship"), "--out", str(tmp_path / "back")])
    feats = tmp_path / "feats"
    features.main(
        ["--data", str(data), "--out", str(feats), "--target", str(folder)] + ["--layers", "0,1,3"]
    )
    for run in ("run", "back"):
        cpu = ["--features", str(feats), "--out", str(tmp_path / run), "--target", str(folder)]
        cpu += ["--block", "4", "--init-layers", "0,3", "--per-seq", "6", "--eval-every", "1"]
        assert mlx_train.main([*cpu, "--minutes", "0.02"]) == 0
        assert "resumed at step 3" in capsys.readouterr().out
        rows = (tmp_path / run / "curve.csv").read_text().splitlines()
        assert [int(r.split(",")[0]) for r in rows[1:3]] == [3, 4]
    # and back: the twin goes on from the run train.py wrote last (MLX's optimiser file)
    step = json.loads((tmp_path / "back" / "ckpt" / "state.json").read_text())["step"]
    again = [*args[:7], "--out", str(tmp_path / "again"), "--resume", str(tmp_path / "back")]
    assert gpu_train.main([*again, "--per-seq", "6", "--seqs", "2", "--steps", "1"]) == 0
    assert f"at step {step}" in capsys.readouterr().out
    assert json.loads((tmp_path / "again" / "ckpt" / "state.json").read_text())["step"] == step + 1


def test_the_twin_imports_neither_mlx_nor_edgespec():
    """The lent GPU has no MLX: gpu_train and what it imports must run without it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for m in ('mlx', 'mlx_lm', 'edgespec'): sys.modules[m] = None\n"
        "import research.block_draft.gpu_train\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_embedded_targets_layer_outputs_match_mlx():
    """The embedded target as EdgeSpec pulls it (4-bit MLX, 8-bit embedding): the twin's
    dequantized copy computes the layer outputs a block draft for it reads."""
    from edgespec.loading.load import load_model

    rec = load_model("smollm2-135m-instruct")
    hp, w = gpu_train.load_target(str(rec.path), "cpu")
    layers = (1, 8, 15, 22, 29)
    batch = np.random.default_rng(5).integers(0, hp["vocab"], (1, 24)).astype(np.int32)
    ours = tb.layer_outputs(w, hp, torch.from_numpy(batch).long(), list(layers)).numpy()
    theirs = np.array(features.layer_outputs(rec.model, batch, layers))
    for j in range(len(layers)):
        part = slice(j * hp["hidden"], (j + 1) * hp["hidden"])
        scale = np.abs(theirs[..., part]).max()
        assert np.abs(ours[..., part] - theirs[..., part]).max() <= 1e-5 * scale, layers[j]
