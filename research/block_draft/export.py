"""Stage 3 of the block draft's recipe: a training run's checkpoint -> a block-draft folder.

    python -m research.block_draft.export --run WORK/run --out research/block_draft/smollm2-135m-block --bits 4

Writes config.json (model_type edgespec_block, with `quantization` when --bits is 4 or 8) and
model.safetensors, plus the run's curve.csv; the folder loads with
edgespec.architectures.block_model's load_block beside its target. The draft scores only the run's
training head (head_ids.npy, the tokens it was trained to predict: `head_size`,
edgespec/architectures/block_head.py) unless --full-head.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="train.py's --out")
    ap.add_argument("--out", required=True)
    ap.add_argument("--bits", type=int, choices=(0, 4, 8), default=4, help="0: float32")
    ap.add_argument("--group-size", type=int, default=32)
    ap.add_argument("--full-head", action="store_true", help="score the whole vocabulary")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)

    import mlx.core as mx
    import mlx.nn as nn
    import numpy as np

    from edgespec.architectures.block_model import BlockArgs, BlockModel

    run = Path(a.run)
    cfg = json.loads((run / "config.json").read_text())
    ids = (
        None
        if a.full_head or not (run / "head_ids.npy").exists()
        else np.load(run / "head_ids.npy")
    )
    cfg["head_size"] = 0 if ids is None else len(ids)
    model = BlockModel(BlockArgs.from_config(cfg))
    weights = dict(mx.load(str(run / "ckpt" / "model.safetensors")))
    if ids is not None:
        weights["head_ids"] = mx.array(ids.astype(np.int32))
    model.load_weights(list(weights.items()), strict=True)
    config = BlockArgs.from_config(cfg).to_config()
    if a.bits:
        nn.quantize(model, group_size=a.group_size, bits=a.bits)
        config["quantization"] = {"group_size": a.group_size, "bits": a.bits}
    mx.eval(model.parameters())
    out = Path(a.out)
    save_block(model, config, out)
    if (run / "curve.csv").exists():
        shutil.copy(run / "curve.csv", out / "curve.csv")
    print(f"wrote {out} ({sum(f.stat().st_size for f in out.iterdir()) / 1e6:.1f} MB)")
    return 0


def save_block(model: Any, config: dict[str, Any], path: str | Path) -> None:
    """Write a block draft (edgespec.architectures.block_model.BlockModel) as config.json +
    model.safetensors (config must carry `quantization` if quantized)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    sys.exit(main())
