"""Draft round 2's training pieces on a tiny seeded target: fake quantization equals the export's
rounding, a re-chosen head keeps what the draft learnt, fine-tuning through 4-bit rounding lowers
the 4-bit loss and resumes from a checkpoint to the same weights."""

from __future__ import annotations

import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from edgespec.architectures.token_draft import build
from edgespec.distill import data as D
from edgespec.distill import shards as S
from edgespec.distill.checkpoints import TrainConfig, latest_checkpoint
from edgespec.distill.export import quantize
from edgespec.distill.target import Target, load_target, load_with_topk
from edgespec.distill.train import head_index, kl_loss, make_batch, new_draft, split_data
from research.distill.finetune import Plan, Source, finetune, mixed_head, regrow_head
from research.distill.qat import add_fake_quant, set_bits
from tests.helpers.tiny import make_tiny_pair

CFG = TrainConfig(
    layers="0,-1",
    head_size=96,
    steps=8,
    batch_tokens=384,
    lr=3e-3,
    warmup=1,
    eval_every=4,
    ckpt_every=4,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Target, list[S.Sequence]]:
    """A tiny target and its answers (with top-k) to ~20 instructions."""
    root = tmp_path_factory.mktemp("finetune")
    target_dir, _ = make_tiny_pair(root / "pair", seed=5)
    target = load_target(str(target_dir))
    plan = S.SamplingPlan(max_new_tokens=16, top_k_saved=8)
    meta = S.Meta(target=str(target_dir), n_instructions=120, sampling=plan)
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
    seqs, _ = split_data(load_with_topk(root / "data", None), S.Meta.read(root / "data"))
    return target, seqs


def _copy(model, config):  # type: ignore[no-untyped-def]
    other = build(config)
    other.model.embed_tokens = model.model.embed_tokens
    other.load_weights(tree_flatten(model.parameters()), strict=True)
    return other


def test_fake_quant_computes_what_the_exported_draft_computes(tiny) -> None:  # type: ignore[no-untyped-def]
    target, seqs = tiny
    model, config = new_draft(target, seqs, CFG)
    shipped = _copy(model, config)
    quantize(shipped, config, 4)
    assert add_fake_quant(model, 4) == 2 * 7 + 1  # 7 Linears per layer, 2 layers, the head
    x = mx.array(seqs[0].ids[None, :12])
    np.testing.assert_allclose(
        np.array(model.head_logits(x)), np.array(shipped.head_logits(x)), atol=1e-4
    )
    set_bits(model, 0)  # no rounding: differs from the 4-bit export
    assert float(mx.abs(model.head_logits(x) - shipped.head_logits(x)).max()) > 1e-3


def test_a_regrown_head_keeps_learnt_rows_and_seeds_new_ones_from_the_target(tiny) -> None:  # type: ignore[no-untyped-def]
    target, seqs = tiny
    model, config = new_draft(target, seqs, CFG)
    model.lm_head.weight = model.lm_head.weight + 0.5  # "trained": differs from the target's rows
    old = np.array(model.head_ids)
    new = np.sort(np.concatenate([old[: len(old) // 2], np.setdiff1d(np.arange(200), old)[:40]]))
    grown, gconfig = regrow_head(model, config, target.model.model.embed_tokens.weight, new)
    assert gconfig["head_size"] == len(new) and "quantization" not in gconfig
    x = mx.array(seqs[0].ids[None, :12])
    before, after = np.array(model.head_logits(x)), np.array(grown.head_logits(x))
    for j, t in enumerate(new.tolist()):
        if t in old:  # a kept token scores exactly as before
            np.testing.assert_allclose(after[..., j], before[..., list(old).index(t)], atol=1e-5)
        else:  # a new token starts from the target's output row
            want = np.array(target.model.model.embed_tokens.weight[t])
            np.testing.assert_allclose(np.array(grown.lm_head.weight[j]), want, atol=1e-6)


def test_finetune_through_4bit_lowers_the_4bit_loss_and_resumes(tmp_path: Path, tiny) -> None:  # type: ignore[no-untyped-def]
    target, seqs = tiny
    src = [
        Source("a", seqs[: len(seqs) // 2], seqs[-4:], 2),
        Source("b", seqs[len(seqs) // 2 :], [], 1),
    ]
    eos = (int(target.tokenizer.eos_token_id),)
    model, config = new_draft(target, seqs, CFG)
    head = mixed_head(src, 96, int(config["vocab_size"]), eos)
    start = regrow_head(model, config, target.model.model.embed_tokens.weight, head)
    hidx = head_index(head, int(config["vocab_size"]))
    probe = _copy(*start)
    add_fake_quant(probe, 4)
    before = float(kl_loss(probe, make_batch(seqs, hidx, 512))[0].item())
    cfg = TrainConfig(**{**CFG.__dict__, "steps": 16, "ckpt_every": 8})
    trained, _, state = finetune(tmp_path / "a", src, cfg, Plan(bits=4), start)
    after = float(kl_loss(trained, make_batch(seqs, hidx, 512))[0].item())
    assert after < 0.8 * before
    assert state.curve[0]["step"] == 0 and "a@4" in state.curve[-1] and "b@4" not in state.curve[-1]
    # A run killed after step 8 resumes from its checkpoint to the same weights.
    part = tmp_path / "b" / "train"
    part.mkdir(parents=True)
    shutil.copytree(tmp_path / "a" / "train" / "ckpt-000008", part / "ckpt-000008")
    (part / "latest").write_text("ckpt-000008")
    resumed, _, rstate = finetune(tmp_path / "b", src, cfg, Plan(bits=4), start)
    assert rstate.step == 16 and (rstate.epoch, rstate.pos) == (state.epoch, state.pos)
    a = mx.load(str(latest_checkpoint(tmp_path / "a" / "train") / "draft.safetensors"))
    b = mx.load(str(latest_checkpoint(part) / "draft.safetensors"))
    for k in a:
        np.testing.assert_allclose(np.array(a[k]), np.array(b[k]), atol=1e-6, err_msg=k)
