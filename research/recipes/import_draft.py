"""Turn a research/recipes/gpu_distill.py export into an EdgeSpec draft folder (CPU, MLX):

    python -m research.recipes.import_draft --export OUT/draft-0-1-28-29 --layers 0,1,28,29 \
        --reports run1/report.json run2/report.json run3/report.json --column 0 \
        --gpu-data OUT/data-00.npz --out models/smollm2-135m-draft --command "..."

Run it with OpenBLAS preloaded like any EdgeSpec script on Linux (edgespec/blas.py):
LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 python research/recipes/...

Loads the fp16 trunk + head (mlx-lm names) into edgespec.architectures.token_draft with the target's own
embedding, measures greedy agreement on the held-out answers of the draft folder's data (fp32 and
quantized, with the MLX target: the CPU's own numbers, not the GPU's), and exports through
edgespec.distill.export (quantized, shared embedding, model card, curve.csv). With --gpu-data the
GPU's answers are added to OUT/data as the next shard (token ids only, like the other shards).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from edgespec.architectures.token_draft import build
from edgespec.distill.export import DEFAULT_BITS, Card, export_draft, model_card
from edgespec.distill.init_draft import draft_config
from edgespec.distill.shards import (
    Meta,
    next_index,
    read_shard,
    recount,
    write_shard,
)
from edgespec.distill.target import load_target, teacher_topk
from edgespec.distill.train import agreement, head_index, split_data
from edgespec.loading.folder import dequantize_model
from research.distill.tokens import iter_sequences


def curve_rows(reports: list[dict], column: int) -> list[dict[str, float]]:
    """The GPU calls' curves joined into one: steps and tokens seen add up across calls (each
    later call resumed from the previous call's weights, on more data)."""
    rows, step0, seen0 = [], 0, 0
    for r in reports:
        for c in r["curve"]:
            if rows and c["step"] == 0:
                continue  # a resumed call's first point repeats the previous call's last
            rows.append(
                {
                    "step": step0 + c["step"],
                    "tokens_seen": seen0 + c["tokens_seen"],
                    "agreement": round(float(c["agreement"][column]), 4),
                    "data_tokens": r["completion_tokens"],
                }
            )
        step0, seen0 = rows[-1]["step"], rows[-1]["tokens_seen"]
    return rows


def add_gpu_data(npz: Path, data_dir: Path, n_instructions: int) -> Meta:
    """Append the GPU's answers to data_dir as the next shard; refresh meta.json's counts."""
    write_shard(data_dir, next_index(data_dir), read_shard(npz))
    meta = Meta.read(data_dir)
    meta.n_instructions = max(meta.n_instructions, n_instructions)
    meta = recount(data_dir, meta)
    meta.write(data_dir)
    return meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--export", required=True, type=Path)
    ap.add_argument("--layers", required=True)
    ap.add_argument("--reports", nargs="+", required=True, type=Path)
    ap.add_argument("--column", type=int, default=0, help="this draft's index in --drafts")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--bits", type=int, default=DEFAULT_BITS)
    ap.add_argument("--gpu-data", type=Path)
    ap.add_argument("--n-instructions", type=int, default=150_000)
    ap.add_argument("--command", required=True, help="the recipe, for the model card")
    args = ap.parse_args()

    layers = [int(v) for v in args.layers.split(",")]
    reports = [json.loads(p.read_text()) for p in args.reports]
    target = load_target(args.target)
    weights: dict[str, mx.array] = {}
    for f in sorted(args.export.glob("part-*.safetensors")):
        weights.update(mx.load(str(f)))
    head_ids = np.array(weights.pop("head_ids")).astype(np.int32)
    config = draft_config(target.config, layers, len(head_ids), args.target)
    model = build(config)
    tw = dict(tree_flatten(target.model.parameters()))
    weights = {k: v.astype(mx.float32) for k, v in weights.items()}
    weights["model.embed_tokens.weight"] = tw["model.embed_tokens.weight"].astype(mx.float32)
    weights["head_ids"] = mx.array(head_ids)
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())

    data_dir = args.out / "data"
    if args.gpu_data:
        add_gpu_data(args.gpu_data, data_dir, args.n_instructions)
    meta = Meta.read(data_dir)
    _, held = split_data(list(iter_sequences(data_dir)), meta)
    held = teacher_topk(target.model, held, 1)
    hidx = head_index(head_ids, int(config["vocab_size"]))
    max_len = 512
    fp32 = agreement(model, held, hidx, max_len)
    print(f"held-out agreement (MLX, fp32): {fp32:.4f} on {len(held)} answers")

    rows = curve_rows(reports, args.column)
    card = Card(
        target=args.target,
        command=args.command,
        data_sequences=reports[-1]["answers"],
        data_tokens=reports[-1]["completion_tokens"],
        tokens_seen=rows[-1]["tokens_seen"],
        steps=int(rows[-1]["step"]),
        layers=layers,
        head_size=len(head_ids),
        bits=args.bits,
        curve=rows,
        loss=(
            "soft cross-entropy against the target's full next-token distribution restricted to "
            "the head (= KL up to a constant), at completion positions only, on a lent H100 "
            "(research/recipes/gpu_distill.py: PyTorch twin of `edgespec distill`)"
        ),
    )
    export_draft(model, config, args.out, card)
    dequantize_model(model)  # same values, fp32 arithmetic: MLX's quantized matmul is slow on CPU
    quant = agreement(model, held, hidx, max_len)
    print(f"held-out agreement (MLX, {args.bits}-bit): {quant:.4f}")
    quality = {
        "held-out agreement (GPU, fp32, training's own check)": rows[-1]["agreement"],
        "held-out agreement (CPU MLX, fp32)": fp32,
        f"held-out agreement (CPU MLX, {args.bits}-bit)": quant,
    }
    (args.out / "README.md").write_text(model_card(Card(**{**card.__dict__, "quality": quality})))
    cols = ["step", "tokens_seen", "agreement", "data_tokens"]
    lines = [",".join(cols)] + [",".join(str(r[c]) for c in cols) for r in rows]
    (args.out / "curve.csv").write_text("\n".join(lines) + "\n")
    print(
        f"wrote {args.out} ({meta.n_sequences} answers, {meta.n_completion_tokens} tokens of data)"
    )


if __name__ == "__main__":
    main()
