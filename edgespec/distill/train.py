"""Distil the target into a draft: KL(p || q) over the draft's head, on completion positions only.

p is the target's next-token distribution from the saved top-k, restricted to the head and
renormalised (the best q supported on the head, for acceptance sum_x min(p, q), is exactly that);
q = softmax(draft head logits). AdamW, linear warm-up then cosine decay, gradient accumulation.
Checkpoints (draft weights + optimizer state + step + data cursor + curve) every `ckpt_every`
steps under OUT/train/ckpt-NNNNNN, with OUT/train/latest naming the newest complete one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_map

from edgespec.architectures.token_draft import DraftModel
from edgespec.distill.checkpoints import (
    State,
    TrainConfig,
    latest_checkpoint,
    load_checkpoint,
    restore_optimizer,
    save_checkpoint,
)
from edgespec.distill.init_draft import (
    build_draft,
    choose_head,
    freeze_for_training,
    resolve_layers,
)
from edgespec.distill.instructions import is_eval
from edgespec.distill.shards import Meta, Sequence
from edgespec.distill.target import load_with_topk
from edgespec.errors import ConfigError
from edgespec.files import atomic_write_bytes


@dataclass
class Batch:
    """inputs [B, L] token ids; idx/p [B, L, k] head columns and renormalised target probs of the
    top-k (p = 0 off the head); mask [B, L] = 1 at completion positions with a label."""

    inputs: mx.array
    idx: mx.array
    p: mx.array
    mask: mx.array
    n_labels: int


def head_index(head_ids: np.ndarray, vocab: int) -> np.ndarray:
    """Full id -> head column (-1 off the head).

    >>> head_index(np.array([2, 5]), 6).tolist()
    [-1, -1, 0, -1, -1, 1]
    """
    out = np.full(vocab, -1, np.int64)
    out[head_ids] = np.arange(len(head_ids))
    return out


def make_batch(seqs: list[Sequence], hidx: np.ndarray, max_len: int) -> Batch:
    """Right-pad sequences into one batch (causal attention: padding after a token never
    affects it). Position t predicts token t+1; completion positions are prompt_len-1 .. L-2."""
    lens = [min(len(s.ids), max_len) - 1 for s in seqs]
    B, L, k = len(seqs), max(lens), seqs[0].topk_ids.shape[1]  # type: ignore[union-attr]
    inputs = np.zeros((B, L), np.int32)
    idx = np.zeros((B, L, k), np.int32)
    p = np.zeros((B, L, k), np.float32)
    for b, (s, n) in enumerate(zip(seqs, lens, strict=True)):
        inputs[b, :n] = s.ids[:n]
        a = s.prompt_len - 1
        m = max(n - a, 0)
        if s.topk_ids is None or s.topk_logprobs is None:
            raise ValueError("training needs the target's top-k for every sequence")
        cols = hidx[s.topk_ids[:m]]
        pr = np.exp(s.topk_logprobs[:m].astype(np.float32)) * (cols >= 0)
        tot = pr.sum(-1, keepdims=True)
        p[b, a : a + m] = np.divide(pr, tot, out=np.zeros_like(pr), where=tot > 0)
        idx[b, a : a + m] = np.maximum(cols, 0)
    mask = (p.sum(-1) > 0).astype(np.float32)
    return Batch(mx.array(inputs), mx.array(idx), mx.array(p), mx.array(mask), int(mask.sum()))


def kl_loss(model: DraftModel, batch: Batch) -> tuple[mx.array, mx.array]:
    """(mean KL(p || q) per labelled position, number of labels). Cross-entropy -sum p log q
    drives the gradient; the constant sum p log p makes the value a KL (0 when q = p on the head)."""
    z = model.head_logits(batch.inputs)  # [B, L, H]
    logq = z - mx.logsumexp(z, axis=-1, keepdims=True)
    lq = mx.take_along_axis(logq, batch.idx, axis=-1)  # [B, L, k]
    plogp = mx.where(batch.p > 0, batch.p * mx.log(mx.maximum(batch.p, 1e-30)), 0.0)
    kl = (plogp - batch.p * lq).sum(-1) * batch.mask
    n = mx.maximum(batch.mask.sum(), 1.0)
    return kl.sum() / n, n


def next_batch(seqs: list[Sequence], state: State, cfg: TrainConfig) -> list[Sequence]:
    """Take sequences in a seeded per-epoch order until the padded batch would exceed
    `batch_tokens` (at least one); advances the cursor in `state`."""
    out: list[Sequence] = []
    longest = 0
    while True:
        order = np.random.default_rng([cfg.seed, state.epoch]).permutation(len(seqs))
        s = seqs[order[state.pos]]
        n = min(len(s.ids), cfg.max_len)
        if out and (len(out) + 1) * max(longest, n) > cfg.batch_tokens:
            return out
        out.append(s)
        longest = max(longest, n)
        state.pos += 1
        if state.pos >= len(seqs):
            state.epoch, state.pos = state.epoch + 1, 0


def agreement(model: DraftModel, held: list[Sequence], hidx: np.ndarray, max_len: int) -> float:
    """Greedy agreement on held-out data: draft argmax == target argmax (top-1 of the saved
    top-k) over completion positions; a target argmax off the head counts as a miss."""
    counts = agreement_counts(model, held, hidx, max_len)
    return int(counts[:, 0].sum()) / max(int(counts[:, 1].sum()), 1)


def agreement_counts(
    model: DraftModel, held: list[Sequence], hidx: np.ndarray, max_len: int
) -> np.ndarray:
    """[len(held), 2] int: (hits, positions compared) of `agreement` for each sequence."""
    counts = np.zeros((len(held), 2), np.int64)
    head_ids = np.array(model.head_ids)
    for i in range(0, len(held), 8):
        part = held[i : i + 8]
        batch = make_batch(part, hidx, max_len)
        arg = np.array(mx.argmax(model.head_logits(batch.inputs), axis=-1))
        for b, s in enumerate(part):
            a, n = s.prompt_len - 1, min(len(s.ids), max_len) - 1
            want = s.topk_ids[: max(n - a, 0), 0]  # type: ignore[index]
            counts[i + b] = int((head_ids[arg[b, a:n]] == want).sum()), len(want)
    return counts


def make_optimizer(cfg: TrainConfig) -> optim.AdamW:
    warm = max(1, min(cfg.warmup, cfg.steps // 2))
    schedule = optim.join_schedules(
        [
            optim.linear_schedule(cfg.lr / warm, cfg.lr, warm),
            optim.cosine_decay(cfg.lr, max(1, cfg.steps - warm), cfg.lr * cfg.min_lr_ratio),
        ],
        [warm],
    )
    # MLX's AdamW skips bias correction by default; with few steps that inflates early updates
    # (m/sqrt(v) is ~3x too large at step 1) and made the first drafts' loss spike.
    return optim.AdamW(
        learning_rate=schedule,
        betas=[0.9, cfg.beta2],
        weight_decay=cfg.weight_decay,
        bias_correction=cfg.bias_correction,
    )


def split_data(seqs: list[Sequence], meta: Meta) -> tuple[list[Sequence], list[Sequence]]:
    """(train, held-out) by the instruction split the data was made with (prompt pools split by
    group: id // id_stride)."""
    train: list[Sequence] = []
    held: list[Sequence] = []
    for s in seqs:
        ev = is_eval(
            s.instr_id // max(1, meta.id_stride), meta.instruction_seed, meta.eval_fraction
        )
        (held if ev else train).append(s)
    return train, held


def new_draft(
    target: Any, seqs: list[Sequence], cfg: TrainConfig
) -> tuple[DraftModel, dict[str, Any]]:
    """Draft initialised from the target (`target` is a distill.target.Target)."""
    n_layers = int(target.config["num_hidden_layers"])
    layers = resolve_layers(cfg.layers, n_layers)
    vocab = int(target.config["vocab_size"])
    eos = tuple(int(e) for e in getattr(target.tokenizer, "eos_token_ids", ()) or ())
    head = choose_head(seqs, cfg.head_size, vocab, eos)
    return build_draft(target.model, target.config, layers, head, target.name)


def accumulate(grads: Any, more: Any) -> Any:
    return more if grads is None else tree_map(lambda a, b: a + b, grads, more)


def write_curve(train_dir: Path, curve: list[dict[str, float]]) -> None:
    """curve.json and curve.csv: step, tokens_seen, agreement, loss, elapsed_s."""
    atomic_write_bytes(train_dir / "curve.json", (json.dumps(curve, indent=2) + "\n").encode())
    cols = ("step", "tokens_seen", "agreement", "loss", "elapsed_s")
    rows = [",".join(cols)] + [",".join(str(r.get(c, "")) for c in cols) for r in curve]
    atomic_write_bytes(train_dir / "curve.csv", ("\n".join(rows) + "\n").encode())


@dataclass
class TrainResult:
    """What a training run reached; `tokens_per_s` counts labelled (completion) tokens."""

    model: DraftModel
    config: dict[str, Any]
    state: State
    agreement: float
    loss: float
    tokens_per_s: float
    checkpoint: Path


def train(
    target: Any,
    data_dir: Path,
    out_dir: Path,
    cfg: TrainConfig,
    *,
    resume: bool = True,
    progress: bool = True,
) -> TrainResult:
    """Train (or resume) a draft on the data in `data_dir`; checkpoints under OUT/train.

    `target` (a distill.target.Target) builds a fresh draft and adds missing teacher top-k; a run
    resumed from a checkpoint whose data already has top-k needs none (pass None). On resume
    the checkpoint's settings win, except `steps`, `eval_every` and `ckpt_every`.
    """
    from tqdm import tqdm

    train_dir = Path(out_dir) / "train"
    train_dir.mkdir(parents=True, exist_ok=True)
    meta = Meta.read(Path(data_dir))
    seqs = load_with_topk(Path(data_dir), target.model if target else None)
    train_seqs, held = split_data(seqs, meta)
    if not train_seqs:
        raise ConfigError(f"{data_dir} holds no training sequences; generate data first")
    model, config, opt, state, cfg = _start(target, train_seqs, train_dir, cfg, resume)
    hidx = head_index(np.array(model.head_ids), int(config["vocab_size"]))
    loss_and_grad = nn.value_and_grad(model, lambda m, b: kl_loss(m, b)[0])
    if not state.curve:
        _evaluate(model, held, hidx, cfg, state, float("nan"), train_dir)
    bar = tqdm(total=cfg.steps, initial=state.step, unit="step", desc="train", disable=not progress)
    loss = float("nan")
    while state.step < cfg.steps:
        loss = train_step(model, opt, loss_and_grad, train_seqs, hidx, state, cfg)
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{state.tokens_seen / state.elapsed_s:.0f}")
        last = state.step == cfg.steps
        if state.step % cfg.eval_every == 0 or last:
            _evaluate(model, held, hidx, cfg, state, loss, train_dir)
        if state.step % cfg.ckpt_every == 0 or last:
            save_checkpoint(train_dir, model, config, opt, state, cfg)
    bar.close()
    ckpt = latest_checkpoint(train_dir) or save_checkpoint(
        train_dir, model, config, opt, state, cfg
    )
    agree = state.curve[-1]["agreement"] if state.curve else float("nan")
    rate = state.tokens_seen / state.elapsed_s if state.elapsed_s else 0.0
    return TrainResult(model, config, state, agree, loss, rate, ckpt)


def _start(
    target: Any, seqs: list[Sequence], train_dir: Path, cfg: TrainConfig, resume: bool
) -> tuple[DraftModel, dict[str, Any], optim.Optimizer, State, TrainConfig]:
    """Fresh draft + optimizer, or both restored from the latest checkpoint."""
    from dataclasses import replace

    ckpt = latest_checkpoint(train_dir) if resume else None
    if ckpt is not None:
        model, config, flat, state, old = load_checkpoint(ckpt)
        cfg = replace(old, steps=cfg.steps, eval_every=cfg.eval_every, ckpt_every=cfg.ckpt_every)
        freeze_for_training(model)
        opt = make_optimizer(cfg)
        restore_optimizer(opt, model, flat)
        return model, config, opt, state, cfg
    if target is None:
        raise ConfigError(f"no checkpoint in {train_dir} and no target to build a draft from")
    model, config = new_draft(target, seqs, cfg)
    freeze_for_training(model)
    opt = make_optimizer(cfg)
    opt.init(model.trainable_parameters())
    return model, config, opt, State(), cfg


def train_step(
    model: DraftModel,
    opt: optim.Optimizer,
    loss_and_grad: Any,
    seqs: list[Sequence],
    hidx: np.ndarray,
    state: State,
    cfg: TrainConfig,
) -> float:
    """One optimizer step over `accum` micro-batches (gradients averaged); returns the loss."""
    t0 = time.perf_counter()
    grads, total, labels = None, 0.0, 0
    for _ in range(cfg.accum):
        batch = make_batch(next_batch(seqs, state, cfg), hidx, cfg.max_len)
        loss, g = loss_and_grad(model, batch)
        grads = accumulate(grads, g)
        mx.eval(loss, grads)
        total += loss.item()
        labels += batch.n_labels
    grads = tree_map(lambda x: x / cfg.accum, grads)
    opt.update(model, grads)
    mx.eval(model.parameters(), opt.state)
    state.step += 1
    state.tokens_seen += labels
    state.elapsed_s += time.perf_counter() - t0
    return total / cfg.accum


def _evaluate(
    model: DraftModel,
    held: list[Sequence],
    hidx: np.ndarray,
    cfg: TrainConfig,
    state: State,
    loss: float,
    train_dir: Path,
) -> None:
    agree = agreement(model, held, hidx, cfg.max_len) if held else float("nan")
    state.curve.append(
        {
            "step": state.step,
            "tokens_seen": state.tokens_seen,
            "agreement": round(agree, 4),
            "loss": round(loss, 4),
            "elapsed_s": round(state.elapsed_s, 1),
        }
    )
    write_curve(train_dir, state.curve)
