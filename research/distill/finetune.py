"""Draft round 2: continue a shipped draft on several data sources, through its export rounding.

Differences from train.py (which builds a draft from its target and trains on one data folder):
- the start is a trained draft (its dequantized weights); its head may be re-chosen for the new
  data: rows of tokens it already scored keep their trained weights, new tokens start from the
  target's output rows (its tied embedding), exactly as build_draft initialises a head;
- the training sequences come from several sources, each repeated `repeat` times per epoch (a
  small source of the kind users send can weigh as much as a large one of another kind);
- with `bits`, the draft trains through fake quantization (qat.py), so the 4-bit export is what
  was trained; agreement is measured on every source's held-out answers at each evaluation.
Checkpoints are train.py's (ckpt-NNNNNN under OUT/train, resumable), plus finetune.json with the
sources and bits.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from edgespec.architectures.token_draft import EMBED, DraftModel, build
from edgespec.distill.checkpoints import (
    State,
    TrainConfig,
    latest_checkpoint,
    load_checkpoint,
    restore_optimizer,
    save_checkpoint,
)
from edgespec.distill.init_draft import choose_head, freeze_for_training
from edgespec.distill.shards import Sequence
from edgespec.distill.train import (
    agreement_counts,
    head_index,
    kl_loss,
    make_optimizer,
    train_step,
    write_curve,
)
from edgespec.files import atomic_write_bytes
from edgespec.loading.folder import dequantize_model
from research.distill.qat import add_fake_quant, set_bits


@dataclass
class Source:
    """One data source: its training and held-out sequences and its weight (repeats per epoch)."""

    name: str
    train: list[Sequence]
    held: list[Sequence]
    repeat: int = 1


@dataclass(frozen=True)
class Plan:
    """What finetune.json records: the sources (name, repeat, sizes) and the rounding trained
    through (bits 0: none)."""

    sources: list[dict[str, Any]] = field(default_factory=list)
    bits: int = 4
    start: str = ""


def regrow_head(
    start: DraftModel, config: dict[str, Any], target_out: mx.array, head_ids: np.ndarray
) -> tuple[DraftModel, dict[str, Any]]:
    """A fp32 copy of `start` scoring `head_ids`: rows of tokens `start` scored keep their
    weights, the others come from the target's output matrix `target_out` [vocab, d].
    `start`'s quantized layers are made dense in place; its embedding (the target's) is shared."""
    embedding = start.model.embed_tokens
    flat = cast(list[tuple[str, mx.array]], tree_flatten(dequantize_model(start).parameters()))
    w = {k: v for k, v in flat if not k.startswith(EMBED)}
    old_ids = np.array(w.pop("head_ids"))
    old_rows = w.pop("lm_head.weight")
    where = {int(t): i for i, t in enumerate(old_ids.tolist())}
    rows = [old_rows[where[int(t)]] if int(t) in where else target_out[int(t)] for t in head_ids]
    config = config | {"head_size": len(head_ids)}
    config.pop("quantization", None)
    model = build(config)
    model.model.embed_tokens = embedding
    w |= {"lm_head.weight": mx.stack(rows).astype(mx.float32), "head_ids": mx.array(head_ids)}
    model.load_weights(list(w.items()), strict=False)
    mx.eval(model.parameters())
    return model, config


def training_mix(sources: list[Source]) -> list[Sequence]:
    """Every source's training answers, each repeated `repeat` times (one epoch's sequences)."""
    return [s for src in sources for s in src.train * src.repeat]


def mixed_head(sources: list[Source], size: int, vocab: int, eos: tuple[int, ...]) -> np.ndarray:
    """The head for the mix: choose_head over the training mix."""
    return choose_head(training_mix(sources), size, vocab, eos)


def evaluate(
    model: DraftModel, sources: list[Source], hidx: np.ndarray, max_len: int, bits: list[int]
) -> dict[str, float]:
    """Held-out agreement per source at each rounding in `bits` (0 = fp32), e.g. {"real@4": ...}."""
    out: dict[str, float] = {}
    for b in bits:
        set_bits(model, b)
        for src in sources:
            if src.held:
                c = agreement_counts(model, src.held, hidx, max_len)
                out[f"{src.name}@{b}"] = round(int(c[:, 0].sum()) / max(int(c[:, 1].sum()), 1), 4)
    return out


def finetune(
    run: Path,
    sources: list[Source],
    cfg: TrainConfig,
    plan: Plan,
    start: tuple[DraftModel, dict[str, Any]] | None,
    log: Any = None,
) -> tuple[DraftModel, dict[str, Any], State]:
    """Train (or resume, when RUN/train has a checkpoint) through `plan.bits`; returns the
    fp32 draft (fake quantization set to plan.bits), its config and the state."""
    train_dir = Path(run) / "train"
    train_dir.mkdir(parents=True, exist_ok=True)
    ckpt = latest_checkpoint(train_dir)
    if ckpt is not None:
        embedding = start[0].model.embed_tokens if start is not None else None
        model, config, flat, state, old = load_checkpoint_shared(ckpt, embedding)
        cfg = replace(old, steps=cfg.steps, eval_every=cfg.eval_every, ckpt_every=cfg.ckpt_every)
    elif start is not None:
        (model, config), flat, state = start, None, State()
    else:
        raise ValueError(f"no checkpoint in {train_dir} and no draft to start from")
    atomic_write_bytes(Path(run) / "finetune.json", (json.dumps(asdict(plan), indent=2)).encode())
    freeze_for_training(model)
    add_fake_quant(model, plan.bits)
    opt = make_optimizer(cfg)
    if flat is None:
        opt.init(model.trainable_parameters())
    else:
        restore_optimizer(opt, model, flat)
    hidx = head_index(np.array(model.head_ids), int(config["vocab_size"]))
    seqs = training_mix(sources)
    loss_and_grad = nn.value_and_grad(model, lambda m, b: kl_loss(m, b)[0])
    if not state.curve:
        _record(model, sources, hidx, cfg, plan, state, float("nan"), train_dir, log)
    while state.step < cfg.steps:
        loss = train_step(model, opt, loss_and_grad, seqs, hidx, state, cfg)
        last = state.step == cfg.steps
        if state.step % cfg.eval_every == 0 or last:
            _record(model, sources, hidx, cfg, plan, state, loss, train_dir, log)
        if state.step % cfg.ckpt_every == 0 or last:
            save_checkpoint(train_dir, model, config, opt, state, cfg)
    set_bits(model, plan.bits)
    return model, config, state


def load_checkpoint_shared(
    ckpt: Path, embedding: nn.Module | None
) -> tuple[DraftModel, dict[str, Any], dict[str, mx.array], State, TrainConfig]:
    """load_checkpoint, with `embedding` (the target's) attached when given, so a resumed draft
    shares it as the fresh one did."""
    model, config, flat, state, cfg = load_checkpoint(ckpt)
    if embedding is not None:
        model.model.embed_tokens = embedding  # type: ignore[assignment]
    return model, config, flat, state, cfg


def _record(
    model: DraftModel,
    sources: list[Source],
    hidx: np.ndarray,
    cfg: TrainConfig,
    plan: Plan,
    state: State,
    loss: float,
    train_dir: Path,
    log: Any,
) -> None:
    """One curve row: held-out agreement per source through the trained rounding."""
    scores = evaluate(model, sources, hidx, cfg.max_len, [plan.bits])
    set_bits(model, plan.bits)
    row = {"step": state.step, "tokens_seen": state.tokens_seen, "loss": round(loss, 4)}
    row |= {"elapsed_s": round(state.elapsed_s, 1), **scores}
    row["agreement"] = float(np.mean(list(scores.values()))) if scores else float("nan")
    state.curve.append(row)
    write_curve(train_dir, state.curve)
    if log is not None:
        log(json.dumps(row))
