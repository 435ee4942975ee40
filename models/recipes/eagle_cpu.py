"""Train a feature draft (edgespec.eagle) for the embedded target on this machine, from the shipped
draft data (models/smollm2-135m-draft/data, the target's own answers as token ids).

Two phases, both resumable (run it again to continue):
1. features: the target runs over --tokens tokens of answers (shuffled, seeded) and its top hidden
   states are cached as fp16 chunks in WORK/features (~125 tokens/s on 2 CPU cores: the slow part);
2. train: either `--grow` (start as the embedded token draft, train only how the feature enters;
   export only that mixer, ~1.3 MB, pointing at the token draft) or from scratch (one llama layer
   copied from target layer --init-layer, the target's own head rows).

    python models/recipes/eagle_cpu.py --work /tmp/eagle --tokens 80000 --grow --steps 100 \
        --lr 1e-4 --out /tmp/eagle/draft
    python models/recipes/eagle_cpu.py --work /tmp/eagle-scratch --tokens 80000 --steps 500

Held-out agreement is printed on the first --held sequences (the training data's own kind of
answers); measure a result on benchmark answers with `edgespec bench` or `edgespec verify`.
Run with OpenBLAS preloaded on Linux (see README).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TOKEN_DRAFT = HERE.parent / "smollm2-135m-draft"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, help="export the draft here when training ends")
    ap.add_argument("--tokens", type=int, default=80_000, help="tokens of features to cache")
    ap.add_argument("--grow", action="store_true", help="grow from the embedded token draft")
    ap.add_argument("--init-layer", type=int, default=29)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--held", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard", default="shard-00011.npz", help="data shard (the GPU answers)")
    a = ap.parse_args(argv)

    from edgespec.distill.data import read_shard
    from edgespec.distill.eagle import (
        EagleTrainConfig,
        agreement,
        export_grown,
        extract_features,
        from_token_draft,
        load_items,
        match_feature_scale,
        new_eagle,
        train_eagle,
    )
    from edgespec.eagle import save_eagle
    from edgespec.runtime import Engine

    engine = Engine.load()  # the embedded pair: target + token draft (its head ids, its layers)
    target = engine.target.model
    seqs = read_shard(TOKEN_DRAFT / "data" / a.shard)
    order = np.random.default_rng(a.seed).permutation(len(seqs))
    extract_features(target, [seqs[i] for i in order], a.work / "features", a.tokens)
    items = load_items(a.work / "features")
    held, train = items[: a.held], items[a.held :]
    config = json.loads((engine.target.path / "config.json").read_text())
    if a.grow:
        model, cfg = from_token_draft(target, config, engine.draft.model)
        print(f"feature scale {match_feature_scale(model, cfg, items):.4f}")
    else:
        head = np.array(engine.draft.model.head_ids)
        model, cfg = new_eagle(target, config, head, a.init_layer)
    print(f"held-out agreement before training: {agreement(model, held):.3f}")
    tc = EagleTrainConfig(
        steps=a.steps,
        batch=a.batch,
        lr=a.lr,
        warmup=10,
        eval_every=a.eval_every,
        reg_weight=0.0 if a.grow else 1.0,
        only_fc=a.grow,
        seed=a.seed,
    )
    train_eagle(model, train, held, tc, a.work / "train", log=lambda s: print(s, flush=True))
    if a.out is not None:
        if a.grow:
            export_grown(model, cfg, a.out, TOKEN_DRAFT)
        else:
            save_eagle(model, cfg, a.out)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
