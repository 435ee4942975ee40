"""Draft round 2's recipe on a lent GPU, in PyTorch: the GPU twin of research/recipes/draft_r2.py.

draft_r2 (MLX, the CPU) continues the shipped 4-bit draft on several data sources through 4-bit
rounding; this script does the same where a CPU day is a GPU minute, and adds the step the CPU
cannot afford: the target answers thousands of real-text requests first. The lent machine has
PyTorch but no MLX, so it reads and writes MLX's files itself:

- start: the shipped draft's model.safetensors (MLX affine 4-bit: uint32-packed nibbles, scales,
  biases), dequantized exactly; the target from its GGUF (gpu_common.load_gguf_state);
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

import numpy as np
import torch
from gpu_common import (
    answer,
    build_target,
    cosine_lr,
    load_gguf_state,
    log,
    pad_batch,
    read_shards,
    write_shard,
)
from gpu_draft import BITS_DEFAULT, Draft

# ----------------------------------------------------------------------------- data


@torch.no_grad()
def generate(target, pack: Path, args, deadline: float):
    """The target's answers (gpu_common.answer) to the pack's prompts until --gen-seconds (or
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
        log(
            f"gen batch {b} ({'greedy' if greedy else 'sampled'}, width {width}): "
            f"{len(seqs)} answers, {made} tokens, {made / (time.time() - t0):.0f} tok/s"
        )
    return (
        seqs,
        plens,
        ids,
        kinds,
        {"answers": len(seqs), "tokens": made, "seconds": round(time.time() - t0, 1)},
    )


def batches(seqs, plens, order, max_tokens: int, max_len: int):
    """gpu_common.pad_batch over `order`, batches of at most max_tokens padded tokens (sequences
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
            best.update(
                score=row["agreement"],
                row=row,
                state={k: v.detach().clone() for k, v in draft.state_dict().items()},
            )
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
        write_shard(
            args.out / f"new-{g // 12000:02d}.npz",
            new_seqs[part],
            new_plens[part],
            new_ids[part],
            new_kinds[part],
            compress=True,
        )
    reps = {k: int(v) for k, v in (kv.split("=") for kv in args.mix.split(","))}
    sources = {"new": (new_seqs, new_plens, reps.get("new", 1))}
    # prev: earlier GPU rounds' answers, when the pack has them
    for name in ("real", "gpu", "prev"):
        if (args.pack / f"{name}_train.npz").exists():
            s, p, _ = read_shards([args.pack / f"{name}_train.npz"])
            sources[name] = (s[:lim], p[:lim], reps.get(name, 1))
    data = {
        k: {
            "answers": len(v[0]),
            "completion_tokens": int(sum(len(s) - p for s, p in zip(v[0], v[1], strict=True))),
            "repeat": v[2],
        }
        for k, v in sources.items()
    }
    log(f"sources: {data}")
    result = train(draft, target, sources, held, args, deadline, args.out)
    final = {
        **evaluate(draft, target, held, args, 0),
        **evaluate(draft, target, held, args, args.bits),
    }
    draft.export(args.out, args.bits)
    report = {
        "start": start_scores,
        "final_best": final,
        "generation": gen_info,
        "sources": data,
        **result,
        "args": {k: str(v) for k, v in vars(args).items()},
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
        "seconds": round(time.time() - t_start, 1),
    }
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    log(f"done in {time.time() - t_start:.0f}s: {final}")


if __name__ == "__main__":
    main()
