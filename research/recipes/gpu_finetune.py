"""Draft round 2's recipe on a lent GPU, in PyTorch: the GPU twin of research/recipes/draft_r2.py.

draft_r2 (MLX, the CPU) continues the shipped 4-bit draft on several data sources through 4-bit
rounding; this script does the same where a CPU day is a GPU minute, and adds the step the CPU
cannot afford: the target answers thousands of real-text requests first. The lent machine has
PyTorch but no MLX, so it reads and writes MLX's files itself:

- start: the shipped draft's model.safetensors (MLX affine 4-bit: uint32-packed nibbles, scales,
  biases), dequantized exactly; the target from its GGUF (gpu_distill.load_gguf_state);
- generate: the target answers the pack's real-text prompts (made on the CPU by
  `draft_r2 gpu-pack` from the real_data pool: training groups only, single-turn requests),
  batches alternating greedy and T=0.8 / top-p 0.95, like real_data generate;
- train: sources `new` (those answers), `prev` (earlier GPU rounds' answers, data-real-gpu/),
  `real` (data-real's training answers) and `gpu` (a sample of the GPU set), each repeated --mix
  times per epoch; loss = soft cross-entropy against the target's full distribution on the head
  at completion positions; every quantizable Linear and the head see their weights through MLX's
  affine 4-bit rounding (fake_quantize, mlx_affine's arithmetic), gradient passed straight
  through;
- evaluate: held-out agreement on the pack's `gpu` and `real` held-out answers, the same sets
  draft_r2 reports, at 4 bits; the best evaluation's weights are the ones exported;
- export: OUT/model.safetensors in MLX's 4-bit format (what was trained through, bit for bit),
  OUT/report.json (curve, data, timings), OUT/new-NN.npz (the new answers, token ids).

    python3 research/recipes/gpu_finetune.py --gguf T.gguf --draft DRAFT_DIR --pack PACK --out OUT \
        --gen-seconds 190 --deadline 500

`draft_r2 gpu-import` measures the result with MLX on the CPU and writes the draft folder.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import mlx_affine
import numpy as np
import torch
from gpu_distill import (
    answer,
    build_target,
    cosine_lr,
    hf_config,
    load_gguf_state,
    log,
    pad_batch,
    read_shards,
    write_shard,
)

BITS_DEFAULT = 4
GROUP = mlx_affine.GROUP
QUANTIZED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# ----------------------------------------------------------------------------- MLX 4-bit files


def quantize_groups(w: torch.Tensor, bits: int, group: int = GROUP):
    """mlx_affine.quantize in torch (on the GPU, inside every training step): (q, scales,
    biases), flat by group. tests/research/test_mlx_affine.py compares the two where torch is
    installed."""
    x = w.reshape(-1, group)
    n = float(2**bits - 1)
    wmin = x.min(-1, keepdim=True).values
    wmax = x.max(-1, keepdim=True).values
    mask = wmin.abs() > wmax.abs()
    scales = ((wmax - wmin) / n).clamp(min=1e-7)
    scales = torch.where(mask, scales, -scales)
    edge = torch.where(mask, wmin, wmax)
    q0 = torch.round(edge / scales)
    scales = torch.where(q0 != 0, edge / q0, scales)
    biases = torch.where(q0 == 0, torch.zeros_like(edge), edge)
    q = torch.clamp(torch.round((x - biases) / scales), 0, n)
    return q, scales, biases


def fake_quantize(w: torch.Tensor, bits: int) -> torch.Tensor:
    """w rounded as MLX rounds it at export, with an identity gradient (bits 0: w)."""
    if not bits:
        return w
    q, s, b = quantize_groups(w.detach(), bits)
    return w + ((q * s + b).reshape(w.shape) - w).detach()


def mlx_pack(w: torch.Tensor, bits: int) -> dict[str, np.ndarray]:
    """weight (uint32 words), scales, biases as mx.quantize returns them (float32 scales): the
    rounding the training saw (quantize_groups), packed by mlx_affine."""
    q, s, b = quantize_groups(w.detach().float(), bits)
    rows = w.shape[0]
    return {
        "weight": mlx_affine.pack(q.reshape(rows, -1).cpu().numpy(), bits),
        "scales": s.reshape(rows, -1).cpu().numpy().astype(np.float32),
        "biases": b.reshape(rows, -1).cpu().numpy().astype(np.float32),
    }


class FQLinear(torch.nn.Linear):
    """nn.Linear whose forward sees its weight through the export's rounding."""

    bits = BITS_DEFAULT

    def forward(self, x):
        return torch.nn.functional.linear(x, fake_quantize(self.weight, self.bits), self.bias)


# ----------------------------------------------------------------------------- the draft


class Draft(torch.nn.Module):
    """The shipped draft: its layers (LlamaModel trunk sharing the target's frozen embedding),
    final norm and reduced head, every Linear a FQLinear."""

    def __init__(self, target, hp: dict, draft_dir: Path, bits: int):
        super().__init__()
        from safetensors.numpy import load_file
        from transformers import LlamaModel

        cfg = json.loads((draft_dir / "config.json").read_text())
        self.config = cfg
        flat = load_file(str(draft_dir / "model.safetensors"))
        qbits = int(cfg.get("quantization", {}).get("bits", 0))
        dense: dict[str, np.ndarray] = {}
        for k, v in flat.items():
            if k.endswith((".scales", ".biases")):
                continue
            stem = k[: -len(".weight")] if k.endswith(".weight") else k
            if v.dtype == np.uint32 and f"{stem}.scales" in flat:
                v = mlx_affine.dequantize(v, flat[f"{stem}.scales"], flat[f"{stem}.biases"], qbits)
            dense[k] = v
        self.register_buffer("head_ids", torch.from_numpy(dense.pop("head_ids").astype(np.int64)))
        self.trunk = LlamaModel(hf_config(hp, int(cfg["num_hidden_layers"])))
        sd = {
            k[len("model.") :]: torch.from_numpy(np.ascontiguousarray(v))
            for k, v in dense.items()
            if k.startswith("model.")
        }
        sd["embed_tokens.weight"] = target.model.embed_tokens.weight.detach().cpu()
        missing, unexpected = self.trunk.load_state_dict(sd, strict=False)
        assert not [m for m in missing if "rotary" not in m] and not unexpected, (
            missing,
            unexpected,
        )
        self.trunk.embed_tokens.weight.requires_grad_(False)
        self.head = FQLinear(hp["hidden"], len(self.head_ids), bias=False)
        self.head.weight.data.copy_(torch.from_numpy(dense["lm_head.weight"]))
        for layer in self.trunk.layers:
            for mod in (layer.self_attn, layer.mlp):
                for name in QUANTIZED:
                    if hasattr(mod, name):
                        old = getattr(mod, name)
                        new = FQLinear(old.in_features, old.out_features, bias=old.bias is not None)
                        new.load_state_dict(old.state_dict())
                        setattr(mod, name, new)
        self.set_bits(bits)

    def set_bits(self, bits: int) -> None:
        for m in self.modules():
            if isinstance(m, FQLinear):
                m.bits = bits

    def hidden(self, x):
        return self.trunk(input_ids=x).last_hidden_state

    def export(self, dest: Path, bits: int) -> None:
        """model.safetensors in MLX's names and 4-bit layout, head_ids included."""
        from safetensors.numpy import save_file

        out: dict[str, np.ndarray] = {"head_ids": self.head_ids.cpu().numpy().astype(np.int32)}
        for k, v in self.trunk.state_dict().items():
            if "embed_tokens" in k or "rotary" in k:
                continue
            name = f"model.{k}"
            if k.endswith(".weight") and any(f".{q}." in k for q in QUANTIZED):
                for part, arr in mlx_pack(v, bits).items():
                    out[name[: -len("weight")] + part] = arr
            else:
                out[name] = v.detach().float().cpu().numpy()
        for part, arr in mlx_pack(self.head.weight, bits).items():
            out[f"lm_head.{part}"] = arr
        dest.mkdir(parents=True, exist_ok=True)
        save_file(out, str(dest / "model.safetensors"))


# ----------------------------------------------------------------------------- data


@torch.no_grad()
def generate(target, pack: Path, args, deadline: float):
    """The target's answers (gpu_distill.answer) to the pack's prompts until --gen-seconds (or
    the prompts) run out: batches of similar length, alternating sampled and greedy. Returns
    (seqs, plens, ids, kinds, summary)."""
    prompts, _, prompt_ids = read_shards([pack / "prompts.npz"])
    with np.load(pack / "prompts.npz") as z:
        prompt_kinds = z["kinds"]
    order = np.argsort([len(p) for p in prompts], kind="stable")
    batches = [order[s : s + args.gen_batch] for s in range(0, len(order), args.gen_batch)]
    rng = np.random.default_rng(0)
    batches = [batches[i] for i in rng.permutation(len(batches))]
    seqs, plens, ids, kinds = [], [], [], []
    t0, made = time.time(), 0
    for b, idx in enumerate(batches):
        if time.time() - t0 > args.gen_seconds or time.time() > deadline:
            break
        greedy = b % 2 == 1
        for i, ans in zip(
            idx, answer(target, [prompts[i] for i in idx], greedy, args), strict=True
        ):
            seqs.append(np.concatenate([prompts[i], ans]))
            plens.append(len(prompts[i]))
            ids.append(int(prompt_ids[i]))
            kinds.append(int(prompt_kinds[i]))
            made += len(ans)
        width = max(len(prompts[i]) for i in idx)
        log(f"gen batch {b} ({'greedy' if greedy else 'sampled'}, width {width}): "
            f"{len(seqs)} answers, {made} tokens, {made / (time.time() - t0):.0f} tok/s")  # fmt: skip
    return (
        seqs,
        plens,
        ids,
        kinds,
        {"answers": len(seqs), "tokens": made, "seconds": round(time.time() - t0, 1)},
    )


def batches(seqs, plens, order, max_tokens: int, max_len: int):
    """gpu_distill.pad_batch over `order`, batches of at most max_tokens padded tokens (sequences
    sorted by length inside windows of 256, so a batch's width is its last sequence's)."""
    for w in range(0, len(order), 256):
        chunk: list[int] = []
        for i in sorted(order[w : w + 256], key=lambda i: len(seqs[i])):
            if chunk and (len(chunk) + 1) * min(max_len, len(seqs[i])) > max_tokens:
                yield pad_batch(seqs, plens, chunk, max_len)
                chunk = []
            chunk.append(i)
        if chunk:
            yield pad_batch(seqs, plens, chunk, max_len)


def loss_on(draft, target, x, m):
    """Soft cross-entropy against the target's distribution on the head, and greedy agreement,
    at the masked positions only (logits are never formed for prompt positions)."""
    sel = m.bool()
    with torch.no_grad():
        th = target.model(input_ids=x).last_hidden_state[sel]
        tl = target.lm_head(th).float()
        p = torch.softmax(tl, -1)
        top = tl.argmax(-1)
    z = draft.head(draft.hidden(x)[sel]).float()
    ce = -(p[:, draft.head_ids] * torch.log_softmax(z, -1)).sum(-1).mean()
    agree = (draft.head_ids[z.argmax(-1)] == top).float()
    return ce, agree


@torch.no_grad()
def evaluate(draft, target, held: dict, args, bits: int) -> dict[str, float]:
    draft.eval()
    draft.set_bits(bits)
    out = {}
    for name, (seqs, plens) in held.items():
        hit = n = 0.0
        for x, m in batches(seqs, plens, list(range(len(seqs))), args.batch_tokens, args.max_len):
            _, a = loss_on(draft, target, x.to(args.device), m.to(args.device))
            hit += float(a.sum())
            n += float(a.numel())
        out[f"{name}@{bits}"] = round(hit / max(n, 1.0), 4)
    draft.set_bits(args.bits)
    draft.train()
    return out


def train(draft, target, sources: dict, held: dict, args, deadline: float, out: Path) -> dict:
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    mix = [
        (name, i)
        for name, (seqs, _, rep) in sources.items()
        for _ in range(rep)
        for i in range(len(seqs))
    ]
    seqs_all = [sources[n][0][i] for n, i in mix]
    plens_all = [sources[n][1][i] for n, i in mix]
    t0 = time.time()
    stop = min(t0 + args.train_seconds, deadline)
    curve: list[dict] = []
    best = {"score": -1.0, "state": None, "row": None}
    step = seen = epoch = 0

    def record(loss: float) -> None:
        row = {
            "step": step,
            "tokens_seen": seen,
            "loss": round(loss, 4),
            "seconds": round(time.time() - t0, 1),
        }
        row |= evaluate(draft, target, held, args, args.bits)
        row["agreement"] = round(float(np.mean([v for k, v in row.items() if "@" in k])), 4)
        curve.append(row)
        log(json.dumps(row))
        if row["agreement"] > best["score"]:
            best.update(score=row["agreement"], row=row,
                        state={k: v.detach().clone() for k, v in draft.state_dict().items()})  # fmt: skip
        (out / "report.json").write_text(json.dumps({"curve": curve}, indent=1))

    record(float("nan"))
    last = float("nan")
    while time.time() < stop:
        order = list(np.random.default_rng(100 + epoch).permutation(len(seqs_all)))
        for x, m in batches(seqs_all, plens_all, order, args.batch_tokens, args.max_len):
            frac = min(1.0, (time.time() - t0) / max(stop - t0, 1.0))
            for g in opt.param_groups:
                g["lr"] = cosine_lr(args.lr, step, args.warmup, frac)
            x, m = x.to(args.device), m.to(args.device)
            loss, _ = loss_on(draft, target, x, m)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            last = loss.item()
            seen += int(m.sum())
            step += 1
            if step % args.eval_every == 0:
                record(last)
            if time.time() >= stop:
                break
        epoch += 1
    record(last)
    draft.load_state_dict(best["state"])
    return {
        "curve": curve,
        "best": best["row"],
        "steps": step,
        "epochs": epoch,
        "tokens_seen": seen,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--draft", required=True, type=Path, help="the shipped draft folder")
    ap.add_argument("--pack", required=True, type=Path, help="draft_r2 gpu-pack output")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--deadline", type=float, default=500, help="seconds for the whole run")
    ap.add_argument("--gen-seconds", type=float, default=190)
    ap.add_argument("--gen-batch", type=int, default=1024)
    ap.add_argument("--gen-temp", type=float, default=0.8)
    ap.add_argument("--gen-top-p", type=float, default=0.95)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--train-seconds", type=float, default=1e9)
    ap.add_argument("--batch-tokens", type=int, default=32768)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--bits", type=int, default=BITS_DEFAULT)
    ap.add_argument("--mix", default="new=1,prev=1,real=3,gpu=1", help="source=repeats per epoch")
    ap.add_argument(
        "--limit",
        type=int,
        default=0,
        help="use only this many sequences per source (a smoke test)",
    )
    args = ap.parse_args()
    t_start = time.time()
    deadline = t_start + args.deadline - 30  # export and the last evaluation fit in 30 s
    args.out.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    hp, state = load_gguf_state(args.gguf)
    target = build_target(hp, state, args.device)
    del state
    for p in target.parameters():
        p.requires_grad_(False)
    log(f"target loaded in {time.time() - t_start:.1f}s on {args.device}")
    draft = Draft(target, hp, args.draft, args.bits).to(args.device)
    lim = args.limit or None
    held = {}
    for name in ("gpu", "real"):
        s, p, _ = read_shards([args.pack / f"{name}_held.npz"])
        held[name] = (s[:lim], p[:lim])
    start_scores = {
        **evaluate(draft, target, held, args, 0),
        **evaluate(draft, target, held, args, args.bits),
    }
    log(f"start draft: {start_scores}")
    gen = generate(target, args.pack, args, deadline)
    new_seqs, new_plens, new_ids, new_kinds, gen_info = gen
    for g in range(0, len(new_seqs), 12000):
        part = slice(g, g + 12000)
        write_shard(args.out / f"new-{g // 12000:02d}.npz", new_seqs[part], new_plens[part],
                    new_ids[part], new_kinds[part], compress=True)  # fmt: skip
    reps = {k: int(v) for k, v in (kv.split("=") for kv in args.mix.split(","))}
    sources = {"new": (new_seqs, new_plens, reps.get("new", 1))}
    # prev: earlier GPU rounds' answers, when the pack has them
    for name in ("real", "gpu", "prev"):
        if (args.pack / f"{name}_train.npz").exists():
            s, p, _ = read_shards([args.pack / f"{name}_train.npz"])
            sources[name] = (s[:lim], p[:lim], reps.get(name, 1))
    data = {k: {"answers": len(v[0]), "completion_tokens": int(sum(len(s) - p for s, p in zip(v[0], v[1], strict=True))), "repeat": v[2]}
            for k, v in sources.items()}  # fmt: skip
    log(f"sources: {data}")
    result = train(draft, target, sources, held, args, deadline, args.out)
    final = {
        **evaluate(draft, target, held, args, 0),
        **evaluate(draft, target, held, args, args.bits),
    }
    draft.export(args.out, args.bits)
    report = {
        "start": start_scores, "final_best": final, "generation": gen_info, "sources": data,
        **result, "args": {k: str(v) for k, v in vars(args).items()},
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
        "seconds": round(time.time() - t_start, 1),
    }  # fmt: skip
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    log(f"done in {time.time() - t_start:.0f}s: {final}")


if __name__ == "__main__":
    main()
