"""EdgeSpec's distillation recipe on a lent GPU, in PyTorch (a twin of `edgespec distill`).

Round 1 of the embedded draft was made with it; gpu_finetune.py (the twin of draft_r2.py, which
continues a shipped draft through 4-bit rounding) shares its GGUF loading, target, answers and
data shards (gpu_common.py, beside it).

Why a twin: the lent GPU machine has PyTorch but no MLX, and nothing can be installed there beyond
what travels with the call (64 MiB). The recipe is `edgespec distill`'s: the target's own answers
to EdgeSpec's generated instructions (research/recipes/make_prompts.py; never benchmark prompts),
a draft made of some of the target's layers + its frozen tied embedding + final norm + a
reduced-vocabulary head, distilled on completion positions against the target's distribution.
The shipped, CPU-runnable trainer is edgespec/distill (MLX); this script only makes the embedded
draft faster than a CPU can. research/recipes/import_draft.py turns its output into a draft folder.

    python gpu_distill.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --prompts prompts.npz \
        --out OUT --work WORK --gen-seconds 200 --train-seconds 270 --drafts 0,1,28,29 0,29

Phases: load (GGUF -> HF LlamaForCausalLM in fp32, undoing llama.cpp's q/k permutation) ->
generate (batched; half the batches greedy, half sampled at T=0.8/top-p 0.95; one shard per batch
in WORK, so a later call resumes) -> train every --drafts shape at once on the same batches and the
same target distributions -> export (fp16 safetensors in mlx-lm names, files under 15 MB, a JSON
report with the held-out agreement curve of each draft).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from gpu_common import (
    EOS,
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

# ----------------------------------------------------------------------------- generation


def read_prompts(path: str, prefix: str = "") -> tuple[list[np.ndarray], np.ndarray]:
    pz = dict(np.load(path))  # materialise once: NpzFile[key] re-reads the file each time
    tokens, starts = pz[prefix + "tokens"], pz[prefix + "starts"]
    ids = pz["eval_ids" if prefix else "instr_ids"]
    return [tokens[starts[i] : starts[i + 1]].astype(np.int64) for i in range(len(ids))], ids


def generate(model, args, work: Path) -> None:
    """Batched answers until the time budget runs out; one shard per batch (resumable)."""
    prompts, ids = read_prompts(args.prompts)
    gen_dir = work / "gen"
    gen_dir.mkdir(parents=True, exist_ok=True)
    eval_file = work / "eval.npz"
    if not eval_file.exists():  # held-out prompts, answered greedily: the agreement curve's data
        ep, eids = read_prompts(args.prompts, "eval_")
        ans = answer(model, ep, True, args)
        write_shard(
            eval_file,
            [np.concatenate([p, a]) for p, a in zip(ep, ans, strict=True)],
            [len(p) for p in ep],
            eids.tolist(),
        )
    done = set(read_shards(sorted(gen_dir.glob("shard-*.npz")))[2])
    todo = [i for i in range(len(prompts)) if int(ids[i]) not in done]
    rng = np.random.default_rng(len(done))
    todo = [todo[i] for i in rng.permutation(len(todo))]
    shard = len(list(gen_dir.glob("shard-*.npz")))
    t0, made = time.time(), 0
    for s in range(0, len(todo), args.gen_batch):
        if time.time() - t0 > args.gen_seconds:
            break
        batch = sorted(todo[s : s + args.gen_batch], key=lambda i: len(prompts[i]))
        greedy = shard % 2 == 1  # alternate sampled / greedy batches
        ans = answer(model, [prompts[i] for i in batch], greedy, args)
        made += sum(len(a) for a in ans)
        write_shard(
            gen_dir / f"shard-{shard:05d}.npz",
            [np.concatenate([prompts[i], a]) for i, a in zip(batch, ans, strict=True)],
            [len(prompts[i]) for i in batch],
            [int(ids[i]) for i in batch],
        )
        shard += 1
        log(
            f"gen shard {shard} ({'greedy' if greedy else 'sampled'}): {made} new tokens, "
            f"{made / (time.time() - t0):.0f} tok/s"
        )


# ----------------------------------------------------------------------------- training


def choose_head(seqs, plens, vocab: int, size: int) -> np.ndarray:
    """The `size` most emitted completion tokens, EOS always in (sorted ids): the draft's head."""
    counts = np.zeros(vocab, np.float64)
    for s, p in zip(seqs, plens, strict=True):
        np.add.at(counts, s[p:], 1.0)
    counts[EOS] = np.inf
    head = np.sort(np.argsort(-counts, kind="stable")[:size])
    cover = counts[head][np.isfinite(counts[head])].sum() / counts[np.isfinite(counts)].sum()
    log(f"head of {size} tokens covers {cover:.4f} of completion tokens")
    return head


class Draft(torch.nn.Module):
    """Target layers `layers` (renumbered) + frozen tied embedding + final norm + reduced head."""

    def __init__(self, target, hp: dict, layers: list[int], head_ids: np.ndarray):
        super().__init__()
        from transformers import LlamaModel

        self.layers_src = layers
        self.trunk = LlamaModel(hf_config(hp, len(layers)))
        tsd = target.model.state_dict()
        sd = {"embed_tokens.weight": tsd["embed_tokens.weight"], "norm.weight": tsd["norm.weight"]}
        for j, i in enumerate(layers):
            for k, v in tsd.items():
                if k.startswith(f"layers.{i}."):
                    sd[k.replace(f"layers.{i}.", f"layers.{j}.", 1)] = v
        missing, _ = self.trunk.load_state_dict(sd, strict=False)
        assert not [m for m in missing if "rotary" not in m], missing
        self.trunk.embed_tokens.weight.requires_grad_(False)
        self.register_buffer("head_ids", torch.from_numpy(head_ids.astype(np.int64)))
        self.head = torch.nn.Linear(hp["hidden"], len(head_ids), bias=False)
        self.head.weight.data.copy_(tsd["embed_tokens.weight"][self.head_ids])

    def forward(self, x):
        return self.head(self.trunk(input_ids=x).last_hidden_state)


def batches(seqs, plens, idx, bsz: int, max_len: int, rng):
    """pad_batch over `idx` in a seeded order, `bsz` sequences a batch."""
    idx = list(rng.permutation(idx))
    for s in range(0, len(idx), bsz):
        yield pad_batch(seqs, plens, idx[s : s + bsz], max_len)


@torch.no_grad()
def target_probs(target, x):
    logits = target(input_ids=x).logits.float()
    return torch.softmax(logits, -1)


def draft_loss(draft, x, m, p_full):
    """Soft cross-entropy against the target's probabilities on the head (off-head mass is
    unreachable for the draft), and greedy agreement; both averaged over masked positions."""
    z = draft(x).float()
    p = p_full[..., draft.head_ids]
    ce = -(p * torch.log_softmax(z, -1)).sum(-1)
    agree = (draft.head_ids[z.argmax(-1)] == p_full.argmax(-1)).float()
    denom = m.sum().clamp(min=1)
    return (ce * m).sum() / denom, (agree * m).sum() / denom


def evaluate(drafts, target, held, args) -> list[float]:
    seqs, plens = held
    sums, n = [0.0] * len(drafts), 0.0
    for d in drafts:
        d.eval()
    with torch.no_grad():
        for x, m in batches(
            seqs, plens, range(len(seqs)), 32, args.max_len, np.random.default_rng(1)
        ):
            x, m = x.to(args.device), m.to(args.device)
            p = target_probs(target, x)
            for j, d in enumerate(drafts):
                sums[j] += float(draft_loss(d, x, m, p)[1]) * float(m.sum())
            n += float(m.sum())
    for d in drafts:
        d.train()
    return [s / max(n, 1.0) for s in sums]


def train(target, hp, args, work: Path, out: Path) -> None:
    seqs, plens, _ = read_shards(sorted((work / "gen").glob("shard-*.npz")))
    eseqs, eplens, _ = read_shards([work / "eval.npz"])
    n_tok = sum(len(s) - p for s, p in zip(seqs, plens, strict=True))
    log(f"data: {len(seqs)} answers, {n_tok} completion tokens; held-out: {len(eseqs)} answers")
    head_ids = choose_head(seqs, plens, hp["vocab"], args.head_size)
    shapes = [[int(v) for v in spec.split(",")] for spec in args.drafts]
    drafts = [Draft(target, hp, ls, head_ids).to(args.device) for ls in shapes]
    saved = work / "drafts.pt"
    if args.resume and saved.exists():  # go on from the last call's weights (head ids included)
        state = torch.load(saved, map_location=args.device)
        for j, d in enumerate(drafts):
            d.load_state_dict(state[f"d{j}"])
        log(f"resumed {len(drafts)} drafts from {saved}")
    opts = [
        torch.optim.AdamW(
            [p for p in d.parameters() if p.requires_grad],
            lr=args.lr,
            weight_decay=0.0,
            betas=(0.9, 0.95),
        )
        for d in drafts
    ]
    curve, seen, step, t0 = [], 0, 0, time.time()

    def record():
        ag = evaluate(drafts, target, (eseqs, eplens), args)
        curve.append(
            {
                "step": step,
                "tokens_seen": seen,
                "agreement": ag,
                "seconds": round(time.time() - t0, 1),
            }
        )
        log(f"step {step} seen {seen} held-out agreement " + " ".join(f"{v:.4f}" for v in ag))

    record()
    done, epoch = False, 0
    while not done:
        for x, m in batches(
            seqs,
            plens,
            range(len(seqs)),
            args.batch,
            args.max_len,
            np.random.default_rng(100 + epoch),
        ):
            frac = min(1.0, (time.time() - t0) / args.train_seconds)  # cosine over the time budget
            lr = cosine_lr(args.lr, step, args.warmup, frac)
            x, m = x.to(args.device), m.to(args.device)
            p = target_probs(target, x)
            for d, opt in zip(drafts, opts, strict=True):
                for g in opt.param_groups:
                    g["lr"] = lr
                loss, _ = draft_loss(d, x, m, p)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_([q for q in d.parameters() if q.requires_grad], 1.0)
                opt.step()
            del p
            seen += int(m.sum())
            step += 1
            if step % args.eval_every == 0:
                record()
            if time.time() - t0 > args.train_seconds:
                done = True
                break
        epoch += 1
    record()
    for d in drafts:
        export(d, out / ("draft-" + "-".join(map(str, d.layers_src))))
    report = {
        "drafts": [d.layers_src for d in drafts],
        "head_size": int(len(head_ids)),
        "answers": len(seqs),
        "completion_tokens": n_tok,
        "held_out_answers": len(eseqs),
        "held_out_tokens": int(sum(len(s) - p for s, p in zip(eseqs, eplens, strict=True))),
        "steps": step,
        "epochs": epoch,
        "tokens_seen": seen,
        "curve": curve,
        "args": vars(args),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2))
    torch.save({f"d{j}": d.state_dict() for j, d in enumerate(drafts)}, work / "drafts.pt")


def export(draft, dest: Path) -> None:
    """mlx-lm names, fp16, files under 15 MB (the transfer limit is 16 MB a file)."""
    from safetensors.numpy import save_file

    dest.mkdir(parents=True, exist_ok=True)
    sd = {
        f"model.{k}": v.detach().float().cpu().numpy()
        for k, v in draft.trunk.state_dict().items()
        if "embed_tokens" not in k and "rotary" not in k
    }
    sd["lm_head.weight"] = draft.head.weight.detach().float().cpu().numpy()
    parts: list[dict] = [{"head_ids": draft.head_ids.cpu().numpy().astype(np.int32)}]
    size = 0
    for k in sorted(sd):
        arr = sd[k].astype(np.float16)
        if size + arr.nbytes > 15_000_000 and parts[-1]:
            parts.append({})
            size = 0
        parts[-1][k] = arr
        size += arr.nbytes
    for i, part in enumerate(parts):
        save_file(part, str(dest / f"part-{i:02d}.safetensors"))


def pack_data(work: Path, out: Path, max_tokens: int = 6_000_000) -> None:
    """Every generated answer as compressed npz files of at most `max_tokens` tokens each (the
    project's own data, committed compactly; one file stays under the 16 MB transfer limit)."""
    groups: list[list[Path]] = [[]]
    size = 0
    for f in sorted((work / "gen").glob("shard-*.npz")):
        n = int(np.load(f)["starts"][-1])
        if size + n > max_tokens and groups[-1]:
            groups.append([])
            size = 0
        groups[-1].append(f)
        size += n
    for g, files in enumerate(groups):
        seqs, plens, ids = read_shards(files)
        if seqs:
            write_shard(out / f"data-{g:02d}.npz", seqs, plens, ids, compress=True)


@torch.no_grad()
def reference_logits(model, prompts_path: str, dest: Path, device: str) -> None:
    """The target's last-position logits on the first held-out prompt: compared on the CPU with
    EdgeSpec's MLX target, so a wrong weight mapping shows before any training is trusted."""
    ep, _ = read_prompts(prompts_path, "eval_")
    x = torch.from_numpy(ep[0])[None].to(device)
    np.save(dest, model(input_ids=x).logits[0].float().cpu().numpy()[-4:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--prompts", required=True, help="make_prompts.py output")
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/edgespec-gpu")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--gen-seconds", type=float, default=200)
    ap.add_argument("--gen-batch", type=int, default=1024)
    ap.add_argument("--gen-temp", type=float, default=0.8)
    ap.add_argument("--gen-top-p", type=float, default=0.95)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--train-seconds", type=float, default=270)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=352)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--drafts", nargs="+", default=["0,1,28,29"])
    ap.add_argument("--head-size", type=int, default=8192)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--skip-gen", action="store_true")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--resume", action="store_true", help="start from WORK/drafts.pt")
    args = ap.parse_args()
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    t = time.time()
    torch.backends.cuda.matmul.allow_tf32 = False  # the data: fp32 like the target on the CPU
    hp, state = load_gguf_state(args.gguf)
    target = build_target(hp, state, args.device)
    log(f"target loaded in {time.time() - t:.1f}s on {args.device}")
    reference_logits(target, args.prompts, out / "reference_logits.npy", args.device)
    if not args.skip_gen:
        generate(target, args, work)
    pack_data(work, out)
    if not args.skip_train:
        torch.backends.cuda.matmul.allow_tf32 = True  # soft labels and training: TF32 is plenty
        train(target, hp, args, work, out)
    log("done")


if __name__ == "__main__":
    main()
