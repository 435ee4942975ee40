"""gpu_train.py's optimiser and files: MLX's AdamW in PyTorch, train.py's checkpoint layout
written and read without MLX, the shipped form a device call can bring back, and the target
read from its GGUF or mlx-lm folder.

A run folder (train.py's --out): config.json, head_ids.npy, curve.csv, ckpt/model.safetensors
(float32, edgespec.architectures.block_model's names), ckpt/opt.safetensors (MLX's optimiser state:
`step`, `learning_rate`, NAME.m, NAME.v), ckpt/state.json ({"step": N}).

A shipped folder: config.json, curve.csv, state.json ({"step": N, "head_ids": [...]}) and the
weights in model-NN.safetensors files of at most PART_BYTES each (a device call brings back files
of up to 16 MiB, and a draft in float32 is larger). `join` turns it back into a run folder, Adam's
moments set to zero (twice the weights' size, they would not come back).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

PART_BYTES = 16_000_000


class MlxAdamW:
    """mlx.optimizers.AdamW as train.py uses it (betas 0.9 / 0.999, eps 1e-8, no bias
    correction): m = 0.9 m + 0.1 g, v = 0.999 v + 0.001 g^2, w -= lr m / (sqrt(v) + eps)."""

    def __init__(self, w: dict[str, torch.Tensor], weight_decay: float = 0.0):
        self.m = {k: torch.zeros_like(v) for k, v in w.items()}
        self.v = {k: torch.zeros_like(v) for k, v in w.items()}
        self.step, self.lr, self.wd = 0, 0.0, weight_decay

    @torch.no_grad()
    def update(self, w: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], lr: float):
        self.step, self.lr = self.step + 1, lr
        for k, g in grads.items():
            m = self.m[k].mul_(0.9).add_(g, alpha=0.1)
            v = self.v[k].mul_(0.999).add_(g.square(), alpha=0.001)
            w[k].mul_(1 - lr * self.wd).sub_(lr * m / (v.sqrt() + 1e-8))

    def arrays(self) -> dict[str, np.ndarray]:
        """The state as mx.save_safetensors(dict(tree_flatten(opt.state))) writes it."""
        out = {
            "step": np.array(self.step, np.uint64),
            "learning_rate": np.array(self.lr, np.float32),
        }
        for k in self.m:
            out[f"{k}.m"], out[f"{k}.v"] = numpy(self.m[k]), numpy(self.v[k])
        return out

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        self.step, self.lr = int(arrays["step"]), float(arrays["learning_rate"])
        for k in self.m:
            self.m[k].copy_(torch.from_numpy(arrays[f"{k}.m"]))
            self.v[k].copy_(torch.from_numpy(arrays[f"{k}.v"]))


def numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def save_run(out: Path, w: dict[str, torch.Tensor], opt: MlxAdamW, step: int) -> None:
    """train.py's checkpoint files under out/ckpt."""
    (out / "ckpt").mkdir(parents=True, exist_ok=True)
    save_file({k: numpy(v) for k, v in w.items()}, str(out / "ckpt" / "model.safetensors"))
    save_file(opt.arrays(), str(out / "ckpt" / "opt.safetensors"))
    (out / "ckpt" / "state.json").write_text(json.dumps({"step": step}) + "\n")


def load_run(run: Path, device) -> tuple[dict, np.ndarray, dict, dict | None, int]:
    """A run folder: (config, head ids, weights on `device`, optimiser arrays or None, step).
    An exported draft folder (export.py's; what the repository keeps) reads as a run folder
    without optimiser state, its weights dequantized (`draft_folder`)."""
    if not (run / "ckpt").is_dir() and (run / "model.safetensors").is_file():
        return draft_folder(run, device)
    cfg = json.loads((run / "config.json").read_text())
    ck = run / "ckpt"
    weights = load_file(str(ck / "model.safetensors"))
    w = {k: torch.from_numpy(v.astype(np.float32)).to(device) for k, v in weights.items()}
    opt = load_file(str(ck / "opt.safetensors")) if (ck / "opt.safetensors").exists() else None
    state = ck / "state.json"
    step = json.loads(state.read_text())["step"] if state.exists() else 0
    return cfg, np.load(run / "head_ids.npy"), w, opt, step


# The training config's fields (gpu_train.draft_config); an exported config has more.
TRAIN_FIELDS = (
    "hidden_size num_hidden_layers num_attention_heads num_key_value_heads head_dim "
    "intermediate_size vocab_size rms_norm_eps rope_theta max_position_embeddings block_size "
    "target_layer_ids mask_token_id qk_norm num_target_layers"
).split()


def draft_folder(path: Path, device) -> tuple[dict, np.ndarray, dict, None, int]:
    """An exported block draft (config.json with head_size, model.safetensors with head_ids,
    curve.csv) as load_run's tuple: MLX-quantized weights dequantized to float32 (exactly, by
    research/recipes/mlx_affine.py), the step the curve ends at. So a later run trains on from
    the draft the repository ships, when the float32 run folder is gone."""
    full = json.loads((path / "config.json").read_text())
    cfg = {k: full[k] for k in TRAIN_FIELDS}
    flat = load_file(str(path / "model.safetensors"))
    head = flat.pop("head_ids", None)
    if head is None:
        raise SystemExit(f"{path} scores the whole vocabulary; train on from its run folder")
    group = int((full.get("quantization") or {}).get("group_size", 64))
    w = {k: torch.from_numpy(v).to(device) for k, v in dense(flat, group).items()}
    rows = (path / "curve.csv").read_text().split() if (path / "curve.csv").exists() else []
    step = int(rows[-1].split(",")[0]) if len(rows) > 1 else 0
    return cfg, head.astype(np.int64), w, None, step


def parts(sizes: dict[str, int], limit: int = PART_BYTES) -> list[list[str]]:
    """Names packed into as few files of at most `limit` bytes as first-fit decreasing finds.
    Example: sizes {a: 6, b: 5, c: 4, d: 1}, limit 10 -> [[a, c], [b, d]]."""
    bins: list[list[str]] = []
    room: list[int] = []
    for name in sorted(sizes, key=lambda k: (-sizes[k], k)):
        j = next((i for i, r in enumerate(room) if r >= sizes[name]), len(bins))
        if j == len(bins):
            bins.append([])
            room.append(limit)
        bins[j].append(name)
        room[j] -= sizes[name]
    return bins


def ship(run: Path, dest: Path, limit: int = PART_BYTES) -> list[Path]:
    """The run folder's weights, config, curve and step as a shipped folder; returns its files."""
    dest.mkdir(parents=True, exist_ok=True)
    weights = load_file(str(run / "ckpt" / "model.safetensors"))
    files = []
    for i, names in enumerate(parts({k: v.nbytes + 256 for k, v in weights.items()}, limit)):
        files.append(dest / f"model-{i:02d}.safetensors")
        save_file({k: weights[k] for k in names}, str(files[-1]))
    step = json.loads((run / "ckpt" / "state.json").read_text())["step"]
    head = np.load(run / "head_ids.npy").tolist()
    (dest / "state.json").write_text(json.dumps({"step": step, "head_ids": head}) + "\n")
    for name in ("config.json", "curve.csv"):
        shutil.copy(run / name, dest / name)
    return [*files, dest / "state.json", dest / "config.json", dest / "curve.csv"]


def join(shipped: Path, run: Path) -> None:
    """A shipped folder -> a run folder (Adam's moments zero, the step kept)."""
    weights: dict[str, np.ndarray] = {}
    for f in sorted(shipped.glob("model-*.safetensors")):
        weights |= load_file(str(f))
    state = json.loads((shipped / "state.json").read_text())
    run.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "curve.csv"):
        shutil.copy(shipped / name, run / name)
    np.save(run / "head_ids.npy", np.array(state["head_ids"], np.int32))
    w = {k: torch.from_numpy(v) for k, v in weights.items()}
    opt = MlxAdamW(w)
    opt.step = int(state["step"])
    save_run(run, w, opt, int(state["step"]))


def load_target(path: str, device: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(hyper-parameters as gpu_common names them, float32 weights in HF llama names)."""
    p = Path(path)
    if p.is_file():
        from research.recipes.gpu_common import load_gguf_state

        hp, state = load_gguf_state(path)
    else:
        c = json.loads((p / "config.json").read_text())
        hp = {"layers": c["num_hidden_layers"], "hidden": c["hidden_size"]}
        hp |= {"ffn": c["intermediate_size"], "heads": c["num_attention_heads"]}
        hp |= {"kv_heads": c["num_key_value_heads"], "rope_theta": float(c["rope_theta"])}
        hp |= {"eps": c["rms_norm_eps"], "vocab": c["vocab_size"]}
        hp |= {"context": c["max_position_embeddings"]}
        flat = {k: v for f in sorted(p.glob("model*.safetensors")) for k, v in load_file(f).items()}
        state = dense(flat, int(c.get("quantization", {}).get("group_size", 64)))
    return hp, {k: torch.from_numpy(np.asarray(v, np.float32)).to(device) for k, v in state.items()}


def dense(flat: dict[str, np.ndarray], group: int) -> dict[str, np.ndarray]:
    """An mlx-lm folder's weights as float32, MLX affine-quantized ones dequantized exactly
    (research/recipes/mlx_affine.py: NAME.weight packed, NAME.scales, NAME.biases; the bits of
    each from its shapes, as a converted GGUF mixes 4-bit layers with an 8-bit embedding)."""
    from research.recipes import mlx_affine

    out = {}
    for k, v in flat.items():
        stem = k.removesuffix(".weight")
        if k.endswith((".scales", ".biases")):
            continue
        if v.dtype == np.uint32 and f"{stem}.scales" in flat:
            s, b = (flat[f"{stem}.{x}"].astype(np.float32) for x in ("scales", "biases"))
            v = mlx_affine.dequantize(v, s, b, v.shape[1] * 32 // (s.shape[1] * group))
        out[k] = v.astype(np.float32)
    return out
