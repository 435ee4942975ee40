"""The `edgespec distill` pipeline: generate -> train -> export, each stage resumable.

Orchestration only; the maths lives in train.py, the data in data.py. Returns summary lines for
the command to print (the library never prints; tqdm bars go to stderr).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from edgespec.device import kind as backend_kind
from edgespec.distill.checkpoints import TrainConfig, latest_checkpoint, load_checkpoint
from edgespec.distill.data import generate_data
from edgespec.distill.export import DEFAULT_BITS, Card, export_draft, model_card
from edgespec.distill.shards import Meta, SamplingPlan
from edgespec.distill.target import load_target, load_with_topk
from edgespec.distill.train import TrainResult, agreement, head_index, split_data, train
from edgespec.errors import ConfigError
from edgespec.loading.folder import dequantize_model


def train_config(a: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        layers=a.layers,
        head_size=a.head_size,
        steps=a.steps,
        batch_tokens=a.batch,
        accum=a.accum,
        lr=a.lr,
        warmup=a.warmup,
        eval_every=a.eval_every,
        ckpt_every=a.ckpt_every,
    )


def data_meta(a: argparse.Namespace) -> Meta:
    plan = SamplingPlan(
        temperature=a.temperature,
        greedy_fraction=a.greedy_fraction,
        max_new_tokens=a.max_new_tokens,
    )
    return Meta(
        target=a.target,
        instruction_seed=a.instruction_seed,
        n_instructions=a.instructions,
        sampling=plan,
    )


def run_pipeline(a: argparse.Namespace, command: str, *, progress: bool = True) -> list[str]:
    """Run the three stages for the parsed `edgespec distill` arguments; return a report."""
    out = Path(a.out)
    data_dir = Path(a.data) if a.data else out / "data"
    if latest_checkpoint(out / "train") is not None and not a.resume:
        raise ConfigError(f"{out} already holds a training run; pass --resume or another --out")
    target = load_target(a.target)
    meta = generate_data(
        target.model,
        target.tokenizer,
        data_dir,
        data_meta(a),
        tokens=a.tokens,
        batch_size=a.gen_batch,
        shard_size=a.shard_size,
        progress=progress,
    )
    result = train(target, data_dir, out, train_config(a), resume=a.resume, progress=progress)
    quantized = export_stage(result, data_dir, meta, out / "draft", command, a.bits)
    return [
        f"data: {meta.n_sequences} answers, {meta.n_completion_tokens} completion tokens "
        f"in {data_dir}",
        f"train: {result.state.step} steps, {result.state.tokens_seen} tokens seen, "
        f"{result.tokens_per_s:.0f} tokens/s, loss {result.loss:.4f}",
        f"held-out greedy agreement: {result.agreement:.4f} (fp32), {quantized:.4f} ({a.bits}-bit)",
        f"draft: {out / 'draft'} (curve: {out / 'train' / 'curve.csv'})",
    ]


def export_stage(
    result: TrainResult,
    data_dir: Path,
    meta: Meta,
    dest: Path,
    command: str,
    bits: int = DEFAULT_BITS,
) -> float:
    """Export the final checkpoint (loaded afresh, so quantizing never touches the training
    copy) and measure the quantized draft's held-out agreement for the card; returns it."""
    model, config, _, state, cfg = load_checkpoint(result.checkpoint)
    _, held = split_data(load_with_topk(data_dir, None), meta)
    card = Card(
        target=meta.target,
        command=command,
        data_sequences=meta.n_sequences,
        data_tokens=meta.n_completion_tokens,
        tokens_seen=state.tokens_seen,
        steps=state.step,
        layers=list(config["edgespec"]["source_layers"]),
        head_size=int(config["head_size"]),
        bits=bits,
        curve=state.curve,
    )
    export_draft(model, config, dest, card)
    if backend_kind().dequantizes:  # same values in fp32 arithmetic (edgespec/backend.py)
        dequantize_model(model)
    hidx = head_index(np.array(model.head_ids), int(config["vocab_size"]))
    quantized = agreement(model, held, hidx, cfg.max_len) if held else float("nan")
    quality = {
        "held-out agreement (fp32)": result.agreement,
        f"held-out agreement ({bits}-bit)": quantized,
    }
    export_draft_card(dest, Card(**{**card.__dict__, "quality": quality}))
    return quantized


def export_draft_card(dest: Path, card: Card) -> None:

    (dest / "README.md").write_text(model_card(card))
