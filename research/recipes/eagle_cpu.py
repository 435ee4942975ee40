"""Train a feature draft (edgespec.architectures.eagle) for the embedded target on this machine, from the shipped
draft data (models/smollm2-135m-draft/data, the target's own answers as token ids).

Three phases, each resumable (run it again to continue), selectable with --phase so that the
first two can run side by side as two processes (training reloads the cache every --chunk steps):
1. features: the target runs over --tokens tokens of answers (shuffled, seeded) and its top hidden
   states are cached as fp16 chunks in WORK/features (~330 tokens/s alone on 2 AMD EPYC cores);
2. train: either from scratch (one llama layer copied from target layer --init-layer, the target's
   own head rows; `--scale` feeds the features at the RMS of the token embeddings, which they
   otherwise outweigh ~17x) or `--grow` (start as the embedded token draft, train only how the
   feature enters);
3. export: --bits (default 8) weights to --out; a grown draft exports only its mixer (~1.3 MB),
   pointing at the token draft.

How research/recipes/smollm2-135m-eagle was made (features and training side by side, the
training switching to a lighter feature regression at step 2200, then export; its model card has
the details):

    python -m research.recipes.eagle_cpu --work W --phase features --tokens 3000000  # stopped at 587k
    python -m research.recipes.eagle_cpu --work W --phase train --scale --steps 4000 --lr 8e-4 \
        --chunk 500 --reg 1.0 --until 2200
    python -m research.recipes.eagle_cpu --work W --phase train --scale --steps 4000 --lr 8e-4 \
        --chunk 500 --reg 0.1
    python -m research.recipes.eagle_cpu --work W --phase export --scale --out research/recipes/smollm2-135m-eagle

Held-out agreement is printed on the first --held sequences (the training data's own kind of
answers); measure a result on benchmark answers with `edgespec bench` or `edgespec verify`.
Run with an optimised BLAS preloaded on Linux (see docs/cpu-backend.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

MODELS = Path(__file__).resolve().parents[2] / "models"  # the repository's models/
TOKEN_DRAFT = MODELS / "smollm2-135m-draft"
PHASES = ("features", "train", "export", "all")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--phase", choices=PHASES, default="all")
    ap.add_argument("--out", type=Path, help="export the draft here (phase export / all)")
    ap.add_argument("--tokens", type=int, default=80_000, help="tokens of features to cache")
    ap.add_argument("--grow", action="store_true", help="grow from the embedded token draft")
    ap.add_argument("--scale", action="store_true", help="scale features to the embeddings' RMS")
    ap.add_argument("--init-layer", type=int, default=29)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--chunk", type=int, default=0, help="reload the feature cache every N steps")
    ap.add_argument("--until", type=int, help="stop at this step (the schedule stays --steps')")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--reg", type=float, default=None, help="feature regression weight")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--held", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bits", type=int, default=8, choices=(4, 6, 8))
    ap.add_argument("--shard", default="shard-00011.npz", help="data shard (the GPU answers)")
    return ap.parse_args(argv)


def fresh_model(a: argparse.Namespace, engine: Any, items: list) -> tuple[Any, dict]:
    """The untrained draft (its trained weights come from the checkpoint, if any)."""
    from research.distill.eagle import from_token_draft, match_feature_scale, new_eagle

    target = engine.target.model
    config = json.loads((engine.target.path / "config.json").read_text())
    if a.grow:
        model, cfg = from_token_draft(target, config, engine.draft.model)
    else:
        head = np.array(engine.draft.model.head_ids)
        model, cfg = new_eagle(target, config, head, a.init_layer)
    if a.grow or a.scale:
        print(f"feature scale {match_feature_scale(model, cfg, items[:64]):.4f}")
    return model, cfg


def checkpoint_step(folder: Path) -> int:
    """The step a training checkpoint in `folder` reached (0 when there is none)."""
    path = folder / "train.json"
    return int(json.loads(path.read_text())["step"]) if path.is_file() else 0


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if any(n % a.eval_every for n in (a.chunk, a.until or 0)):
        raise SystemExit("--chunk and --until must be multiples of --eval-every (checkpoints)")
    from edgespec.distill.export import quantize
    from edgespec.distill.shards import read_shard
    from edgespec.runtime import Engine
    from research.distill.eagle import (
        EagleTrainConfig,
        agreement,
        export_grown,
        extract_features,
        load_items,
        load_trained,
        save_eagle,
        train_eagle,
    )

    engine = Engine.load()  # the embedded pair: target + token draft (its head ids, its layers)
    if a.phase in ("features", "all"):
        seqs = read_shard(TOKEN_DRAFT / "data" / a.shard)
        order = np.random.default_rng(a.seed).permutation(len(seqs))
        extract_features(
            engine.target.model, [seqs[i] for i in order], a.work / "features", a.tokens
        )
    if a.phase == "features":
        return 0
    tc = EagleTrainConfig(
        steps=a.steps,
        batch=a.batch,
        lr=a.lr,
        warmup=a.warmup,
        eval_every=a.eval_every,
        reg_weight=(0.0 if a.grow else 1.0) if a.reg is None else a.reg,
        only_fc=a.grow,
        seed=a.seed,
    )
    first, end = True, min(a.steps, a.until or a.steps)
    while a.phase in ("train", "all"):  # each pass sees the features cached so far
        step = checkpoint_step(a.work / "train")
        if step >= end:
            break
        items = load_items(a.work / "features")
        held, train = items[: a.held], items[a.held :]
        model, cfg = fresh_model(a, engine, items)
        if first:
            print(f"held-out agreement before training: {agreement(model, held):.3f}")
            first = False
        print(f"training on {len(train)} answers, {sum(len(i.ids) for i in train)} tokens")
        stop = min(step + a.chunk, end) if a.chunk else end
        train_eagle(model, train, held, tc, a.work / "train", print, stop)
    if a.out is None or a.phase not in ("export", "all"):
        return 0
    items = load_items(a.work / "features")
    model, cfg = fresh_model(a, engine, items)
    load_trained(model, a.work / "train")
    if a.grow:
        export_grown(model, cfg, a.out, TOKEN_DRAFT)
    else:
        save_eagle(model, quantize(model, cfg, a.bits), a.out)
    print(f"held-out agreement as exported: {agreement(model, items[: a.held]):.3f}")
    curve = json.loads((a.work / "train" / "train.json").read_text())["curve"]
    rows = [f"{r['step']},{r['seen']},{r['agreement']:.4f}" for r in curve]
    (a.out / "curve.csv").write_text("step,tokens_seen,agreement\n" + "\n".join(rows) + "\n")
    print(f"wrote {a.out} (config.json, model.safetensors, curve.csv)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
