"""The block draft's training (train.py) on a lent GPU, in PyTorch: train.py's GPU twin.

The lent machine has PyTorch but no MLX, and nothing reaches it but what a call carries. This
script needs only torch, numpy, safetensors and (for a GGUF target) the gguf package; it imports
the pure-NumPy parts of features.py and train.py, so the data, the held-out split, the anchors,
the training head, the loss weights, the schedule and the curve are theirs:

- target: the GGUF (gpu_common.load_gguf_state, dequantized to float32) or an mlx-lm folder
  (affine-quantized weights dequantized with research/recipes/mlx_affine.py); its outputs at
  --layers are computed teacher-forced on the data's token ids at first use, rounded to float16
  as features.py stores them, and kept on the device (--cache-gb);
- data: features.py's sequences (`read_sequences`, --max-len, --held-every), cut into its chunks,
  so the held-out set and train.py's anchor draws are the same for the same data and seed;
- model and loss: torch_block.block_hidden (train.py's block_forward for many sequences at once),
  scored by the target's tied embedding restricted to the --head most frequent answer tokens,
  cross-entropy weighted exp(-(j - 1) / gamma), against the answer's token or, with --kd, the
  target's distribution (torch_kd.py, kd.py's twin); optimiser: MLX's AdamW (no bias correction);
- output: --out in train.py's layout (config.json, head_ids.npy, curve.csv, ckpt/model.safetensors,
  ckpt/opt.safetensors, ckpt/state.json), so export.py exports it and train.py resumes it; it
  resumes from its own --out, or from another run folder with --resume. --ship DIR also writes the
  weights in files under 16 MiB (what a device call can bring back); `join` rebuilds a run folder
  from them (Adam's moments restart at zero: they are not shipped).

    python3 -m research.block_draft.gpu_train train --target T.gguf \
        --data models/smollm2-135m-draft/data-real-gpu --out /tmp/run --ship $OUT --deadline 420
    python -m research.block_draft.gpu_train join --ship SHIPPED --out WORK/run
    python -m research.block_draft.export --run WORK/run --out research/block_draft/smollm2-135m-block --bits 4
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from research.block_draft import torch_block as tb
from research.block_draft.features import CHUNK_SEQS, read_sequences
from research.block_draft.torch_kd import Kd, soft_rows
from research.block_draft.train import Anchors, agreement, head_ids, to_head
from research.block_draft.twin_ckpt import MlxAdamW, join, load_run, load_target, save_run, ship


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def draft_config(hp: dict, a) -> dict:
    """train.py's build() config for a target with hyper-parameters `hp`."""
    return {
        "hidden_size": hp["hidden"],
        "num_hidden_layers": len(a.init_layers),
        "num_attention_heads": hp["heads"],
        "num_key_value_heads": hp["kv_heads"],
        "head_dim": hp["hidden"] // hp["heads"],
        "intermediate_size": hp["ffn"],
        "vocab_size": hp["vocab"],
        "rms_norm_eps": hp["eps"],
        "rope_theta": hp["rope_theta"],
        "max_position_embeddings": hp["context"],
        "block_size": a.block,
        "target_layer_ids": a.layers,
        "mask_token_id": a.mask_id,
        "qk_norm": False,
        "num_target_layers": hp["layers"],
    }


def as_chunk(seqs: list[tuple[np.ndarray, int]]) -> dict[str, np.ndarray]:
    """A features.py chunk without features (zero columns: Anchors slices them for the context
    length only; the features come from the target, `Features`)."""
    starts = np.concatenate([[0], np.cumsum([len(s) for s, _ in seqs])]).astype(np.int64)
    return {
        "feats": np.zeros((int(starts[-1]), 0), np.float16),
        "tokens": np.concatenate([s for s, _ in seqs]).astype(np.int32),
        "starts": starts,
        "prompt_lens": np.array([p for _, p in seqs], np.int32),
    }


def split_chunks(data: str, max_len: int, held_every: int) -> tuple[list, list]:
    """features.py's held chunk and train chunks for the data folders (comma-separated)."""
    seqs = read_sequences([Path(p) for p in data.split(",")], max_len)
    held = [s for i, s in enumerate(seqs) if i % held_every == 0][:CHUNK_SEQS]
    train = [s for i, s in enumerate(seqs) if i % held_every != 0]
    return [as_chunk(held)], [
        as_chunk(train[i : i + CHUNK_SEQS]) for i in range(0, len(train), CHUNK_SEQS)
    ]


class Features:
    """The target's layer outputs of whole sequences, computed on first use in batches of about
    `batch_tokens` tokens, float16 (as features.py stores them), kept while under `budget` bytes."""

    def __init__(self, target, hp, layers, chunks, batch_tokens: int, budget: float):
        self.target, self.hp, self.layers, self.chunks = target, hp, tuple(layers), chunks
        self.batch_tokens, self.budget, self.kept, self.store = batch_tokens, budget, 0, {}
        self.device = target["model.embed_tokens.weight"].device

    def tokens(self, key) -> np.ndarray:
        ch, s = self.chunks[key[0]], key[1]
        return ch["tokens"][int(ch["starts"][s]) : int(ch["starts"][s + 1])]

    def get(self, keys: list[tuple[int, int]]) -> list[torch.Tensor]:
        found = {k: self.store[k] for k in keys if k in self.store}
        todo = sorted({k for k in keys if k not in found}, key=lambda k: -len(self.tokens(k)))
        j = 0
        while j < len(todo):
            width = len(self.tokens(todo[j]))
            group = todo[j : j + max(1, self.batch_tokens // width)]
            ids = torch.zeros((len(group), width), dtype=torch.long)
            for r, k in enumerate(group):
                t = self.tokens(k)
                ids[r, : len(t)] = torch.from_numpy(t.astype(np.int64))
            out = tb.layer_outputs(self.target, self.hp, ids.to(self.device), self.layers).half()
            for r, k in enumerate(group):
                found[k] = out[r, : len(self.tokens(k))].clone()
                if self.kept + found[k].nbytes <= self.budget:
                    self.store[k], self.kept = found[k], self.kept + found[k].nbytes
            j += len(group)
        return [found[k] for k in keys]


def draw(src: Anchors, head: np.ndarray, pick: int | None = None):
    """train.py's draw (same random stream): (chunk, sequence), anchors, block tokens, labels
    as columns of the training head."""
    if pick is None:
        pick = int(src.rng.integers(len(src.index)))
    _, anchors, toks, labels = src.sequence(pick)
    return src.index[pick], anchors, toks, to_head(labels, head)


def collate(items, feats: Features, device, width: int = 0) -> tuple[torch.Tensor, ...]:
    """Sequences of one step as padded tensors: raw [b, S, F] float32 (S: the largest anchor; a
    block reads only the positions before its anchor), anchors [b, n], toks [b, n, B], labels
    [b, n, B - 1] (padding rows: anchor 0, token 0, labels -1; no other block sees them); with
    `width` (--kd), also the target's last-layer rows of each block (torch_kd.soft_rows)."""
    raws = feats.get([it[0] for it in items])
    S = max(int(it[1].max()) for it in items)
    n, B = max(len(it[1]) for it in items), items[0][2].shape[1]
    raw = torch.zeros((len(items), S, raws[0].shape[1]), device=device)
    anchors = np.zeros((len(items), n), np.int64)
    toks = np.zeros((len(items), n, B), np.int64)
    labels = np.full((len(items), n, B - 1), -1, np.int64)
    for r, (_, a, t, lab) in enumerate(items):
        s = min(S, raws[r].shape[0])
        raw[r, :s] = raws[r][:s].float()
        anchors[r, : len(a)], toks[r, : len(a)], labels[r, : len(a)] = a, t, lab
    soft = (soft_rows(raws, items, B, width, device),) if width else ()
    return raw, *(torch.from_numpy(x).to(device) for x in (anchors, toks, labels)), *soft


@dataclass(frozen=True)
class Draft:
    """What one training step needs: the draft's config and weights (trained in place), the
    target's embedding, its rows for the training head, the loss weight of each block position,
    and with --kd the target's final norm (soft labels)."""

    cfg: dict
    w: dict[str, torch.Tensor]
    embed: torch.Tensor
    train_head: torch.Tensor
    weights: torch.Tensor
    kd: Kd | None = None

    @property
    def soft_width(self) -> int:
        """Columns of soft-label rows a batch carries: the target's width with --kd, else 0."""
        return self.cfg["hidden_size"] if self.kd else 0

    def logits(self, batch) -> torch.Tensor:
        """[b, n, B - 1, head]: each block row's logits over the training head."""
        raw, anchors, toks = batch[:3]
        h = tb.block_hidden(self.w, self.cfg, self.embed, raw, anchors, toks)
        return h[:, :, 1:] @ self.train_head.T

    def loss(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kd.loss(self, batch) if self.kd else loss_fn(self, batch)


def make_draft(cfg: dict, w: dict, embed, head: np.ndarray, gamma: float, kd=None) -> Draft:
    """train.py's head rows and loss weights exp(-(j - 1) / gamma) for block positions j >= 1."""
    rows = embed[torch.from_numpy(head.astype(np.int64)).to(embed.device)]
    ws = [math.exp(-j / gamma) for j in range(cfg["block_size"] - 1)]
    return Draft(cfg, w, embed, rows, torch.tensor(ws, device=embed.device), kd)


def loss_fn(d: Draft, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """train.py's loss_fn over a collated batch: (weighted mean cross-entropy, logits)."""
    logits, labels = d.logits(batch), batch[3]
    ce = F.cross_entropy(logits.flatten(0, -2), labels.clamp(min=0).flatten(), reduction="none")
    wt = d.weights * (labels >= 0)
    return (ce.view_as(wt) * wt).sum() / wt.sum().clamp(min=1.0), logits


def lr_at(step: int, lr: float, total: int, frac: float) -> float:
    """train.py's schedule: linear warm-up over 100 steps, then cosine to 0 at step `total`;
    total 0: cosine over this call's training time instead (`frac` of it gone), for a call
    bounded by its deadline. Example: lr_at(99, 3e-4, 200, 0.0) is about 1.5e-4 (half-way
    down), and so is lr_at(99, 3e-4, 0, 0.5)."""
    warm = min(1.0, (step + 1) / 100)
    x = min(step, total) / total if total else min(frac, 1.0)
    return lr * warm * 0.5 * (1 + math.cos(math.pi * x))


@torch.no_grad()
def evaluate(d: Draft, batch) -> dict[str, float]:
    """train.py's evaluate: teacher-forced agreement per block position and tau; with --kd also
    the agreement with the target's argmax (kd.target_agreement), from the same logits."""
    logits, labels = d.logits(batch), batch[3]
    ok = labels >= 0
    hits = ((logits.argmax(-1) == labels) & ok).sum((0, 1)).cpu().numpy()
    acc, tau = agreement(hits, ok.sum((0, 1)).cpu().numpy())
    ev = {"tau_independent": tau, **{f"acc{j + 1}": float(x) for j, x in enumerate(acc)}}
    return ev | (d.kd.agreement(d, batch, logits) if d.kd else {})


def held_batch(d: Draft, head, target, hp, held, device, per_seq=48, feature_tokens=32768):
    """The evaluation batch: the first 24 held-out sequences, anchors seeded 1234 as train.py
    draws them, features computed and not kept."""
    src = Anchors(held, d.cfg["block_size"], per_seq, d.cfg["mask_token_id"], 1234)
    items = [draw(src, head, i) for i in range(min(24, len(src.index)))]
    if not items:
        raise SystemExit("no held-out sequence has an answer of 2 tokens or more (--held-every)")
    feats = Features(target, hp, d.cfg["target_layer_ids"], held, feature_tokens, 0)
    return collate(items, feats, device, d.soft_width)


def start(a, hp, target, train_chunks, out: Path):
    """(config, head ids, weights, optimiser, step): from --resume, from --out's own checkpoint,
    or fresh from the target's layers (train.py's build)."""
    src = Path(a.resume) if a.resume else out if (out / "ckpt" / "state.json").exists() else None
    if src is None:
        cfg = draft_config(hp, a)
        head = head_ids(train_chunks, a.head, hp["vocab"])
        w = tb.init_draft(target, cfg, a.init_layers, a.seed)
        w = {k: v.to(a.device) for k, v in w.items()}
        return cfg, head, w, MlxAdamW(w), 0
    cfg, head, w, arrays, step = load_run(src, a.device)
    have = (cfg["hidden_size"], cfg["vocab_size"], cfg.get("num_target_layers", hp["layers"]))
    if have != (hp["hidden"], hp["vocab"], hp["layers"]):
        raise SystemExit(f"{src} holds a draft for another target (width, vocabulary, layers)")
    opt = MlxAdamW(w)
    if arrays is not None:
        opt.load(arrays)
    log(f"resumed {src} at step {step}")
    return cfg, head, w, opt, step


def begin_files(out: Path, cfg: dict, head: np.ndarray) -> None:
    """config.json, head_ids.npy and curve.csv's header (kept when the curve goes on)."""
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    np.save(out / "head_ids.npy", head)
    if not (out / "curve.csv").exists():
        cols = ["tau_independent"] + [f"acc{j + 1}" for j in range(cfg["block_size"] - 1)]
        (out / "curve.csv").write_text("step,seconds,tokens_seen,loss," + ",".join(cols) + "\n")


def record(out: Path, d: Draft, ev: dict, step: int, seconds: float, seen: int, loss: float):
    """One curve.csv row, as train.py writes it."""
    row = [step, round(seconds, 1), seen, round(loss, 4), round(ev["tau_independent"], 4)]
    row += [round(ev[f"acc{j + 1}"], 4) for j in range(d.cfg["block_size"] - 1)]
    with (out / "curve.csv").open("a") as f:
        f.write(",".join(str(x) for x in row) + "\n")


def fit(a, d: Draft, opt: MlxAdamW, step: int, chunks, head, feats, eval_batch, t_end) -> int:
    """train.py's loop (--seqs sequences a step) until t_end or --steps; evaluates and saves
    every --eval-every steps and at the end. Returns the last step."""
    B, first, out = d.cfg["block_size"], step, Path(a.out)
    data = Anchors(chunks, B, a.per_seq, d.cfg["mask_token_id"], a.seed + step)
    t0, losses = time.time(), []
    rewarm = first > 0 and opt.step == 0  # a joined or exported draft: no moments came back
    while time.time() < t_end and (not a.steps or step < first + a.steps):
        if step % a.reload_every == 0 and step:  # train.py re-seeds here when it reloads chunks
            data = Anchors(chunks, B, a.per_seq, d.cfg["mask_token_id"], a.seed + step)
        items = [draw(data, head) for _ in range(a.seqs)]
        loss, _ = d.loss(collate(items, feats, a.device, d.soft_width))
        grads = torch.autograd.grad(loss, list(d.w.values()))
        lr = lr_at(step, a.lr, a.total_steps, (time.time() - t0) / max(t_end - t0, 1e-9))
        if rewarm:  # Adam's moments start at zero on trained weights: warm up again
            lr *= min(1.0, (step - first + 1) / 100)
        opt.update(d.w, dict(zip(d.w, grads, strict=True)), lr)
        losses.append(loss.detach())
        step += 1
        if step % a.eval_every == 0 or time.time() >= t_end or step == first + a.steps:
            ev, mean = evaluate(d, eval_batch), float(torch.stack(losses).mean())
            seen = step * a.seqs * a.per_seq * (B - 1)
            record(out, d, ev, step, time.time() - t0, seen, mean)
            rate, kept = (step - first) / (time.time() - t0), feats.kept / 2**30
            log(f"step {step} loss {mean:.3f} {ev} ({rate:.1f} steps/s, {kept:.1f} GiB kept)")
            save_run(out, d.w, opt, step)
            losses = []
    return step


def train(a) -> int:
    t_start = time.time()
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    hp, target = load_target(a.target, a.device)
    log(f"target loaded in {time.time() - t_start:.1f}s on {a.device}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    held, chunks = split_chunks(a.data, a.max_len, a.held_every)
    cfg, head, w, opt, step = start(a, hp, target, chunks, out)
    if a.resume and (Path(a.resume) / "curve.csv").exists() and not (out / "curve.csv").exists():
        shutil.copy(Path(a.resume) / "curve.csv", out / "curve.csv")  # the curve goes on
    begin_files(out, cfg, head)
    for v in w.values():
        v.requires_grad_(True)
    kd = Kd.of(target, hp, cfg) if a.kd else None
    d = make_draft(cfg, w, target["model.embed_tokens.weight"], head, a.gamma, kd)
    eval_batch = held_batch(d, head, target, hp, held, a.device, a.per_seq, a.feature_tokens)
    layers = cfg["target_layer_ids"]
    feats = Features(target, hp, layers, chunks, a.feature_tokens, a.cache_gb * 2**30)
    n_train = sum(len(c["prompt_lens"]) for c in chunks)
    log(f"{n_train} training sequences, {eval_batch[1].shape[0]} held out")
    step = fit(a, d, opt, step, chunks, head, feats, eval_batch, t_start + a.deadline - a.reserve)
    if a.ship:
        log(f"shipped {len(ship(out, Path(a.ship)))} files to {a.ship}")
    log(f"done in {time.time() - t_start:.0f}s at step {step}")
    return 0


def parser() -> argparse.ArgumentParser:
    """`train` (train.py's and features.py's flags and defaults, --seqs 32) and `join`."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="phase", required=True)
    t = sub.add_parser("train", help="train (or go on training) a block draft")
    t.add_argument("--target", required=True, help="the target's GGUF or mlx-lm folder")
    t.add_argument("--data", required=True, help="data folders (shard-*.npz), comma-separated")
    t.add_argument("--out", required=True, help="the run folder (train.py's layout)")
    t.add_argument(
        "--resume", default="", help="start from this run folder's checkpoint, or an exported draft"
    )
    t.add_argument("--ship", default="", help="also write the result here in files under 16 MiB")
    t.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    t.add_argument("--deadline", type=float, default=420, help="seconds for the whole run")
    t.add_argument("--reserve", type=float, default=20, help="seconds kept for the last save")
    t.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: deadline)")
    t.add_argument("--layers", default="1,8,15,22,29", help="target layers the draft reads")
    t.add_argument("--max-len", type=int, default=640)
    t.add_argument("--held-every", type=int, default=64)
    t.add_argument("--block", type=int, default=8)
    t.add_argument("--per-seq", type=int, default=48, help="anchors per sequence")
    t.add_argument("--init-layers", default="0,1,28,29")
    t.add_argument("--mask-id", type=int, default=16, help="a token id never in answers")
    t.add_argument("--head", type=int, default=8192)
    t.add_argument("--seqs", type=int, default=32, help="sequences per step")
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--gamma", type=float, default=4.0)
    t.add_argument(
        "--total-steps", type=int, default=0, help="the cosine's length in steps (0: the deadline)"
    )
    t.add_argument("--eval-every", type=int, default=200)
    t.add_argument("--reload-every", type=int, default=400, help="re-seed the draws (train.py)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--feature-tokens", type=int, default=32768, help="target batch, in tokens")
    t.add_argument("--cache-gb", type=float, default=40, help="device memory for features")
    t.add_argument("--kd", action="store_true", help="soft labels from the target (torch_kd.py)")
    j = sub.add_parser("join", help="a shipped folder -> a run folder export.py reads")
    j.add_argument("--ship", required=True)
    j.add_argument("--out", required=True)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if a.phase == "join":
        join(Path(a.ship), Path(a.out))
        return 0
    a.layers = [int(x) for x in a.layers.split(",")]
    a.init_layers = [int(x) for x in a.init_layers.split(",")]
    return train(a)


if __name__ == "__main__":
    sys.exit(main())
