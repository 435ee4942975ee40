"""Draft round 2 (issue 31): the shipped token draft continued on real-text data and the GPU set,
trained through 4-bit rounding, exported at 4 bits. Every phase resumes where it stopped.

    python -m research.recipes.draft_r2 topk --work W --sequences 4000
    python -m research.recipes.draft_r2 train --work W --real REAL --steps 1500
    python -m research.recipes.draft_r2 export --work W --real REAL --out models/smollm2-135m-draft

- topk: the target's top-16 next-token log-probs for a seeded sample of the GPU set
  (models/smollm2-135m-draft/data/shard-00011.npz carries token ids only), W/gpu-topk/chunk-NNNNN.npz
  of --chunk answers each, written atomically;
- train: research.distill.finetune from the shipped draft (head re-chosen over the mix), sources
  "gpu" (those chunks; held out: the 48 held-out answers in data/ shards 0-10) and "real" (--real,
  split by its pool's held-out groups, repeated --real-repeat times per epoch); checkpoints in W/train;
- export: the latest checkpoint's held-out agreement at fp32, 8 and 4 bits, then the draft written
  at --bits to --out (config.json, model.safetensors, curve.csv; the card is written by hand);
- gpu-pack / gpu-import: the same recipe on a lent GPU (research/recipes/gpu_finetune.py, PyTorch):
  the token ids it reads, then its 4-bit export measured here with MLX on the same held-out sets
  and installed (research/recipes/README.md has the calls).
No benchmark prompt is read by any phase.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

MODELS = Path(__file__).resolve().parents[2] / "models"  # the repository's models/
DRAFT = MODELS / "smollm2-135m-draft"
TARGET = "smollm2-135m-instruct"


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def cmd_topk(a: argparse.Namespace) -> int:
    import numpy as np

    from edgespec.distill.shards import atomic_write_npz, pack, read_shard
    from edgespec.distill.target import load_target, teacher_topk

    out = Path(a.work) / "gpu-topk"
    out.mkdir(parents=True, exist_ok=True)
    seqs = read_shard(DRAFT / "data" / "shard-00011.npz")
    order = np.random.default_rng(a.seed).permutation(len(seqs))[: a.sequences]
    target = load_target(TARGET)
    for c in range(0, len(order), a.chunk):
        path = out / f"chunk-{c // a.chunk:05d}.npz"
        if path.exists():
            continue
        t0 = time.time()
        part = teacher_topk(target.model, [seqs[i] for i in order[c : c + a.chunk]], 16)
        atomic_write_npz(path, pack(part))
        n = sum(s.n_completion for s in part)
        log(f"{path.name}: {len(part)} answers, {n} tokens, {n / (time.time() - t0):.0f} tok/s")
    return 0


def sources(a: argparse.Namespace) -> list:
    from edgespec.distill.shards import Meta, read_shard
    from edgespec.distill.target import load_with_topk
    from edgespec.distill.train import split_data
    from research.distill.finetune import Source

    gpu = [
        s for p in sorted((Path(a.work) / "gpu-topk").glob("chunk-*.npz")) for s in read_shard(p)
    ]
    held_old = held_gpu(Path(a.work))
    real = load_with_topk(Path(a.real), None)
    real_train, real_held = split_data(real, Meta.read(Path(a.real)))
    return [Source("gpu", gpu, held_old, 1), Source("real", real_train, real_held, a.real_repeat)]


def held_gpu_ids() -> list:
    """The 48 held-out answers in data/ shards 0-10 (token ids only there)."""
    from edgespec.distill.shards import Meta, read_shard, shard_paths
    from edgespec.distill.train import split_data

    old = DRAFT / "data"
    seqs = [s for p in shard_paths(old)[:11] for s in read_shard(p)]
    return split_data(seqs, Meta.read(old))[1]


def held_gpu(work: Path) -> list:
    """held_gpu_ids with the target's top-k, computed once and kept in W/held-gpu.npz."""
    from edgespec.distill.shards import atomic_write_npz, pack, read_shard
    from edgespec.distill.target import load_target, teacher_topk

    path = work / "held-gpu.npz"
    if not path.exists():
        atomic_write_npz(path, pack(teacher_topk(load_target(TARGET).model, held_gpu_ids(), 16)))
    return read_shard(path)


def start_draft(srcs: list, head_size: int) -> tuple:
    """(target, (fp32 draft with its head re-chosen over the mix, config))."""
    from edgespec.architectures.token_draft import input_embedding, load_draft
    from edgespec.distill.target import load_target
    from research.distill.finetune import mixed_head, regrow_head

    target = load_target(TARGET)
    draft, config = load_draft(DRAFT, input_embedding(target.model))
    vocab = int(config["vocab_size"])
    eos = tuple(int(e) for e in getattr(target.tokenizer, "eos_token_ids", ()) or ())
    head = mixed_head(srcs, head_size, vocab, eos)
    out = target.model.model.embed_tokens.weight
    return target, regrow_head(draft, config, out, head)


def cmd_train(a: argparse.Namespace) -> int:
    from edgespec.distill.checkpoints import TrainConfig
    from research.distill.finetune import Plan, finetune

    srcs = sources(a)
    for s in srcs:
        n = sum(x.n_completion for x in s.train)
        log(f"source {s.name}: {len(s.train)} train ({n} tokens) x{s.repeat}, {len(s.held)} held")
    _, start = start_draft(srcs, a.head_size)
    cfg = TrainConfig(
        steps=a.steps,
        lr=a.lr,
        warmup=a.warmup,
        batch_tokens=a.batch,
        eval_every=a.eval_every,
        ckpt_every=a.eval_every,
        min_lr_ratio=0.1,
        seed=a.seed,
    )
    info = [
        {"name": s.name, "repeat": s.repeat, "train": len(s.train), "held": len(s.held)}
        for s in srcs
    ]
    plan = Plan(sources=info, bits=a.bits, start=str(DRAFT))
    finetune(Path(a.work), srcs, cfg, plan, start, log=log)
    return 0


def cmd_export(a: argparse.Namespace) -> int:
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten

    from edgespec.architectures.token_draft import build, input_embedding, save_draft
    from edgespec.distill.checkpoints import latest_checkpoint
    from edgespec.distill.export import quantize
    from edgespec.distill.target import load_target
    from edgespec.distill.train import head_index
    from research.distill.finetune import evaluate, load_checkpoint_shared
    from research.distill.qat import add_fake_quant

    srcs = sources(a)
    ckpt = latest_checkpoint(Path(a.work) / "train")
    if ckpt is None:
        log("no checkpoint to export")
        return 1
    embedding = input_embedding(load_target(TARGET).model)
    model, config, _, state, _ = load_checkpoint_shared(ckpt, embedding)
    add_fake_quant(model, 0)
    hidx = head_index(np.array(model.head_ids), int(config["vocab_size"]))
    scores = evaluate(model, srcs, hidx, 512, [0, 8, 4])
    log(f"{ckpt.name}: {json.dumps(scores)}")
    plain = build(config)
    plain.model.embed_tokens = model.model.embed_tokens
    plain.load_weights(tree_flatten(model.parameters()), strict=True)
    mx.eval(plain.parameters())
    config = quantize(plain, config, a.bits)
    config["edgespec"] = config.get("edgespec", {}) | {"shared_embedding": True}
    save_draft(plain, config, Path(a.out))
    write_curve_csv(json.loads((Path(a.work) / "train" / "curve.json").read_text()), Path(a.out))
    (Path(a.work) / "export.json").write_text(
        json.dumps({"checkpoint": ckpt.name, "step": state.step, **scores}, indent=2)
    )
    log(f"wrote {a.out}")
    return 0


def write_curve_csv(rows: list[dict], out: Path) -> None:
    """out/curve.csv: step, tokens seen and every per-source agreement column ("gpu@4", ...)."""
    cols = ["step", "tokens_seen", *[k for k in rows[-1] if "@" in k]]
    lines = [",".join(cols)] + [",".join(str(r.get(c, "")) for c in cols) for r in rows]
    (out / "curve.csv").write_text("\n".join(lines) + "\n")


def _save_pack(path: Path, seqs: list, kinds: list[int] | None = None) -> None:
    """A data shard (shards.pack, plus `kinds` codes), token ids only, compressed: what
    gpu_finetune reads with gpu_common.read_shards."""
    from dataclasses import replace

    import numpy as np

    from edgespec.distill.shards import atomic_write_npz, pack

    arrays = pack([replace(s, topk_ids=None, topk_logprobs=None) for s in seqs])
    if kinds is not None:
        arrays["kinds"] = np.array(kinds, np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_npz(path, arrays, compress=True)


def cmd_gpu_pack(a: argparse.Namespace) -> int:
    """What gpu_finetune.py reads on the lent GPU: real-text prompts to answer (training groups of
    the pool, single-turn requests not answered yet), the real and GPU sets' training and held-out
    answers (the same splits `train` uses). Token ids only."""
    import numpy as np

    from edgespec.distill.shards import Meta, Sequence, done_ids, read_shard
    from edgespec.distill.target import load_target
    from edgespec.distill.train import split_data
    from research.distill.pool import read_pool
    from research.distill.realdata import _template, conversation
    from research.distill.requests import KINDS
    from research.distill.tokens import iter_sequences

    out = Path(a.out)
    real = list(iter_sequences(Path(a.real)))
    real_train, real_held = split_data(real, Meta.read(Path(a.real)))
    _save_pack(out / "real_train.npz", real_train)
    _save_pack(out / "real_held.npz", real_held)
    _save_pack(out / "gpu_held.npz", held_gpu_ids())
    gpu = read_shard(DRAFT / "data" / "shard-00011.npz")
    pick = np.random.default_rng(a.seed).permutation(len(gpu))[: a.gpu_sample]
    _save_pack(out / "gpu_train.npz", [gpu[i] for i in sorted(pick)])
    pool, sha = read_pool(Path(a.pool))
    by_id = pool.by_id()
    done = done_ids(Path(a.real))
    earlier = [s for d in a.gpu_data if Path(d).is_dir() for s in iter_sequences(Path(d))]
    if earlier:  # earlier GPU rounds' answers: trained on again, their prompts not asked again
        _save_pack(out / "prev_train.npz", earlier)
        done |= {s.instr_id for s in earlier}
    roots = [
        p for p in pool.prompts if p.parent < 0 and not pool.is_held_out(p.id) and p.id not in done
    ]
    order = np.random.default_rng(a.seed).permutation(len(roots))
    tok = load_target(TARGET).tokenizer
    prompts, kinds = [], []
    for i in order:
        p = roots[int(i)]
        ids = np.array(_template(tok, conversation(p, by_id, {})), np.int64)
        if len(ids) <= a.max_prompt:
            prompts.append(Sequence(p.id, len(ids), ids))
            kinds.append(KINDS.index(p.kind))
        if len(prompts) == a.prompts:
            break
    _save_pack(out / "prompts.npz", prompts, kinds)
    info = {
        "pool_sha256": sha,
        "prompts": len(prompts),
        "prompt_tokens": int(sum(len(s.ids) for s in prompts)),
        "real_train": len(real_train),
        "real_held": len(real_held),
        "gpu_train": len(pick),
        "prev_train": len(earlier),
    }
    (out / "pack.json").write_text(json.dumps(info, indent=2))
    log(f"pack {out}: {info}")
    return 0


def cmd_gpu_import(a: argparse.Namespace) -> int:
    """Measure gpu_finetune.py's 4-bit export with MLX (the held-out sets `export` reports) and,
    with --out, write it as the draft folder (config.json from the shipped draft, curve.csv from
    the GPU's report)."""
    import shutil

    import numpy as np

    from edgespec.architectures.token_draft import input_embedding, load_draft
    from edgespec.distill.target import load_target
    from edgespec.distill.train import head_index
    from edgespec.loading.folder import dequantize_model
    from research.distill.finetune import evaluate

    run = Path(a.run)
    folder = Path(a.work) / "gpu-import"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(DRAFT / "config.json", folder / "config.json")
    shutil.copy(run / "model.safetensors", folder / "model.safetensors")
    srcs = sources(a)
    embedding = input_embedding(load_target(TARGET).model)
    scores = {}
    for name, path in (("shipped", DRAFT), ("gpu-run", folder)):
        model, config = load_draft(path, embedding)
        dequantize_model(model)
        hidx = head_index(np.array(model.head_ids), int(config["vocab_size"]))
        scores[name] = evaluate(model, srcs, hidx, 512, [0])
        log(f"{name}: {json.dumps(scores[name])}")
    (Path(a.work) / "gpu-import.json").write_text(json.dumps(scores, indent=2))
    if a.out:
        shutil.copy(run / "model.safetensors", Path(a.out) / "model.safetensors")
        write_curve_csv(json.loads((run / "report.json").read_text())["curve"], Path(a.out))
        log(f"wrote {a.out}")
    if a.data_out:
        meta = gpu_answers_to_data(run, Path(a.pool), Path(a.data_out))
        log(f"{meta.n_sequences} answers, {meta.n_completion_tokens} tokens -> {a.data_out}")
    return 0


def gpu_answers_to_data(run: Path, pool_path: Path, dest: Path, shard: int = 1024) -> object:
    """gpu_finetune's new-NN.npz as a pool data folder (real_data's format: meta.json, shards
    with each answer's kind, compressed as a committed folder; sources.tsv.gz naming every quoted
    passage's origin and licence)."""
    import numpy as np

    from edgespec.distill.shards import Meta, SamplingPlan, add_counts, read_shard
    from research.distill.pool import read_pool
    from research.distill.realdata import pool_meta, write_pool_shard
    from research.distill.requests import KINDS
    from research.recipes.real_data import write_manifest

    pool, sha = read_pool(pool_path)
    plan = SamplingPlan(temperature=0.8, top_p=0.95, greedy_fraction=0.5, max_new_tokens=256)
    meta = pool_meta(pool, sha, TARGET, Meta(target=TARGET, n_eval=0, sampling=plan))
    seqs, kinds = [], []
    for f in sorted(run.glob("new-*.npz")):
        seqs += read_shard(f)
        with np.load(f) as z:
            kinds += [KINDS[int(k)] for k in z["kinds"]]
    dest.mkdir(parents=True, exist_ok=True)
    for i in range(0, len(seqs), shard):
        write_pool_shard(dest, i // shard, seqs[i : i + shard], kinds[i : i + shard], compress=True)
        meta = add_counts(meta, seqs[i : i + shard])
    meta.write(dest)
    write_manifest(pool_path, dest, dest / "sources.tsv.gz")
    return meta


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("topk", "train", "export"):
        p = sub.add_parser(name)
        p.add_argument("--work", required=True)
        p.add_argument("--seed", type=int, default=0)
        if name == "topk":
            p.add_argument("--sequences", type=int, default=4000)
            p.add_argument("--chunk", type=int, default=200)
            continue
        p.add_argument("--real", required=True, help="real-text data folder (real_data generate)")
        p.add_argument("--real-repeat", type=int, default=3)
        p.add_argument("--head-size", type=int, default=8192)
        p.add_argument("--bits", type=int, default=4)
        if name == "train":
            p.add_argument("--steps", type=int, default=1500)
            p.add_argument("--lr", type=float, default=2e-4)
            p.add_argument("--warmup", type=int, default=30)
            p.add_argument("--batch", type=int, default=4096)
            p.add_argument("--eval-every", type=int, default=50)
        else:
            p.add_argument("--out", required=True)
    p = sub.add_parser("gpu-pack", help="the data gpu_finetune.py reads on a lent GPU")
    p.add_argument("--pool", required=True, help="real_data pool file")
    p.add_argument("--real", required=True, help="real-text data folder")
    p.add_argument("--out", required=True)
    p.add_argument("--prompts", type=int, default=20000)
    p.add_argument("--max-prompt", type=int, default=768)
    p.add_argument("--gpu-sample", type=int, default=4000)
    p.add_argument(
        "--gpu-data",
        nargs="*",
        default=[str(DRAFT / "data-real-gpu")],
        help="earlier GPU rounds' answer folders (gpu-import --data-out)",
    )
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("gpu-import", help="measure (and install) gpu_finetune.py's export")
    p.add_argument("--run", required=True, help="gpu_finetune.py's --out, fetched")
    p.add_argument("--work", required=True)
    p.add_argument("--real", required=True)
    p.add_argument("--real-repeat", type=int, default=3)
    p.add_argument("--out", help="the draft folder to write (after measuring)")
    p.add_argument("--data-out", help="also write the GPU's answers here as a data folder")
    p.add_argument("--pool", help="the pool gpu-pack read (with --data-out)")
    return ap


def main(argv: list[str] | None = None) -> int:
    from edgespec.blas import reexec_with_blas

    argv = sys.argv[1:] if argv is None else argv
    reexec_with_blas(argv, module="research.recipes.draft_r2")
    a = parser().parse_args(argv)
    return {
        "topk": cmd_topk,
        "train": cmd_train,
        "export": cmd_export,
        "gpu-pack": cmd_gpu_pack,
        "gpu-import": cmd_gpu_import,
    }[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
