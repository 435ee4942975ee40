"""Held-out agreement of block drafts, the twin's evaluation on any machine with torch: per
block position, the draft's argmax against the answer's token (train.py's curve) and against the
target's argmax (kd.py's, what acceptance at T = 0 counts), over the held-out sequences that
gpu_train.py and train.py evaluate (every --held-every'th, the first 24, anchors seeded 1234).

    python -m research.block_draft.heldout --target $EDGESPEC_HOME/models/smollm2-135m-instruct \
        --data models/smollm2-135m-draft/data-real-gpu,models/smollm2-135m-draft/data-real,\
models/smollm2-135m-draft/data research/block_draft/smollm2-135m-block WORK/run

prints one JSON line per draft (an exported folder or a run folder): its step, `tau_independent`
and `acc1`.. (answer tokens), `tau_target` and `top1`.. (the target's argmax).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from research.block_draft import gpu_train as g
from research.block_draft.torch_kd import Kd
from research.block_draft.twin_ckpt import load_run, load_target


def evaluate(target, hp, held, folder: Path, device: str) -> dict:
    """The draft in `folder` on gpu_train's evaluation batch: both agreements and tau."""
    cfg, head, w, _, step = load_run(folder, device)
    d = g.make_draft(cfg, w, target["model.embed_tokens.weight"], head, 4.0, Kd.of(target, hp, cfg))
    ev = g.evaluate(d, g.held_batch(d, head, target, hp, held, device))
    return {"draft": str(folder), "step": step, **{k: round(v, 4) for k, v in ev.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("drafts", nargs="+", help="exported draft folders or run folders")
    ap.add_argument("--target", required=True, help="the target's GGUF or mlx-lm folder")
    ap.add_argument("--data", required=True, help="data folders (shard-*.npz), comma-separated")
    ap.add_argument("--max-len", type=int, default=640)
    ap.add_argument("--held-every", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    hp, target = load_target(a.target, a.device)
    held, _ = g.split_chunks(a.data, a.max_len, a.held_every)
    for folder in a.drafts:
        print(json.dumps(evaluate(target, hp, held, Path(folder), a.device)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
