"""Draft training's settings, its resumable state and its checkpoints (ckpt-NNNNNN folders under
the run's train/ folder, `latest` pointing at the newest)."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_unflatten

from edgespec.architectures.token_draft import DraftModel, build
from edgespec.files import atomic_write_bytes


@dataclass(frozen=True)
class TrainConfig:
    """Training settings; `layers` is a list like "0,1,-2,-1" (negatives count from the end)."""

    layers: str = "0,1,-2,-1"
    head_size: int = 8192
    steps: int = 2000
    batch_tokens: int = 4096
    accum: int = 1
    lr: float = 5e-4
    min_lr_ratio: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.0
    beta2: float = 0.95
    bias_correction: bool = True
    eval_every: int = 100
    ckpt_every: int = 100
    max_len: int = 512
    seed: int = 0


@dataclass
class State:
    """Everything a resumed run needs besides the weights and the optimizer."""

    step: int = 0
    tokens_seen: int = 0
    epoch: int = 0
    pos: int = 0
    elapsed_s: float = 0.0
    curve: list[dict[str, float]] = field(default_factory=list)


def latest_checkpoint(train_dir: Path) -> Path | None:
    ptr = Path(train_dir) / "latest"
    if not ptr.exists():
        return None
    path = Path(train_dir) / ptr.read_text().strip()
    return path if path.exists() else None


def save_checkpoint(
    train_dir: Path,
    model: DraftModel,
    config: dict[str, Any],
    opt: optim.Optimizer,
    state: State,
    cfg: TrainConfig,
    keep: int = 2,
) -> Path:
    """Write ckpt-NNNNNN (via a temp folder renamed into place), point `latest` at it, prune."""
    train_dir = Path(train_dir)
    name = f"ckpt-{state.step:06d}"
    tmp = train_dir / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    mx.save_safetensors(str(tmp / "draft.safetensors"), dict(tree_flatten(model.parameters())))
    mx.save_safetensors(str(tmp / "optimizer.safetensors"), dict(tree_flatten(opt.state)))
    info = {"state": asdict(state), "train": asdict(cfg), "draft_config": config}
    (tmp / "state.json").write_text(json.dumps(info, indent=2) + "\n")
    final = train_dir / name
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    atomic_write_bytes(train_dir / "latest", name.encode())
    for old in sorted(train_dir.glob("ckpt-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(
    path: Path,
) -> tuple[DraftModel, dict[str, Any], dict[str, mx.array], State, TrainConfig]:
    """(draft, draft config, flat optimizer state, training state, training config)."""
    info = json.loads((Path(path) / "state.json").read_text())
    config = info["draft_config"]
    model = build(config)
    model.load_weights(str(Path(path) / "draft.safetensors"), strict=True)
    opt_state = cast(dict[str, mx.array], mx.load(str(Path(path) / "optimizer.safetensors")))
    return model, config, opt_state, State(**info["state"]), TrainConfig(**info["train"])


def restore_optimizer(opt: optim.Optimizer, model: nn.Module, flat: dict[str, mx.array]) -> None:
    opt.init(model.trainable_parameters())
    opt.state = tree_unflatten(list(flat.items()))
