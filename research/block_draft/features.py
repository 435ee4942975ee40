"""Stage 1 of the block draft's recipe: the target's hidden states at the draft's layers.

A block draft (edgespec/architectures/block_model.py) reads the outputs of a few target layers at
every context position. Training needs them for every position of every training sequence, so this
stage runs the target once over each sequence (teacher forcing, no output head) and stores the
chosen layers' outputs as float16 chunks, with the token ids. It resumes: chunks already written
are skipped, so the job accumulates across sessions.

    python -m research.block_draft.features --data models/smollm2-135m-draft/data-real-gpu \
        --out WORK/features --layers 1,8,15,22,29 --max-len 640

Sequences whose index is a multiple of --held-every go to the held-out chunk set (`held-*`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

CHUNK_SEQS = 48  # sequences per chunk file


def read_sequences(folders: list[Path], max_len: int) -> list[tuple[np.ndarray, int]]:
    """(token ids, prompt length) of every sequence in the data folders' shards, in order, cut
    to max_len tokens (sequences whose prompt alone fills max_len are dropped)."""
    out = []
    for folder in folders:
        for shard in sorted(folder.glob("shard-*.npz")):
            z = np.load(shard)
            toks, starts, plens = z["tokens"], z["starts"], z["prompt_lens"]
            for i in range(len(plens)):
                seq = toks[starts[i] : starts[i + 1]].astype(np.int32)[:max_len]
                if int(plens[i]) < len(seq) - 1:
                    out.append((seq, int(plens[i])))
    return out


def layer_outputs(model, batch: np.ndarray, layers: tuple[int, ...]):
    """Outputs of target `layers` for a right-padded batch [B, L] -> [B, L, len(layers) * d]
    (causal attention: padding never changes earlier positions)."""
    import mlx.core as mx
    from mlx_lm.models.base import create_attention_mask

    inner = model.model
    h = inner.embed_tokens(mx.array(batch))
    mask = create_attention_mask(h, None)
    taken = []
    for i, layer in enumerate(inner.layers[: max(layers) + 1]):
        h = layer(h, mask, cache=None)
        if i in layers:
            taken.append(h)
    return mx.concatenate([taken[layers.index(i)] for i in layers], axis=-1)


def write_chunk(path: Path, model, seqs: list[tuple[np.ndarray, int]], layers, batch_tokens: int):
    import mlx.core as mx

    lens = [len(s) for s, _ in seqs]
    starts = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    feats = np.zeros((int(starts[-1]), len(layers) * model.args.hidden_size), np.float16)
    order = sorted(range(len(seqs)), key=lambda i: -lens[i])
    j = 0
    while j < len(order):
        width = lens[order[j]]
        group = order[j : j + max(1, batch_tokens // width)]
        batch = np.zeros((len(group), width), np.int32)
        for r, i in enumerate(group):
            batch[r, : lens[i]] = seqs[i][0]
        out = layer_outputs(model, batch, layers).astype(mx.float16)
        mx.eval(out)
        arr = np.array(out)
        for r, i in enumerate(group):
            feats[starts[i] : starts[i + 1]] = arr[r, : lens[i]]
        j += len(group)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(
        tmp,
        feats=feats,
        tokens=np.concatenate([s for s, _ in seqs]).astype(np.int32),
        starts=starts,
        prompt_lens=np.array([p for _, p in seqs], np.int32),
    )
    tmp.rename(path)


def main(argv: list[str] | None = None) -> int:
    from edgespec.blas import reexec_with_blas

    argv = sys.argv[1:] if argv is None else argv
    reexec_with_blas(argv, module="research.block_draft.features")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="data folders (shard-*.npz), comma-separated")
    ap.add_argument("--out", required=True)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--layers", default="1,8,15,22,29")
    ap.add_argument("--max-len", type=int, default=640)
    ap.add_argument("--held-every", type=int, default=64)
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--max-chunks", type=int, default=10**9, help="stop after writing this many")
    a = ap.parse_args(argv)

    from edgespec.loading.load import load_model

    layers = tuple(int(x) for x in a.layers.split(","))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    data = [Path(p).name for p in a.data.split(",")]
    meta = {"target": a.target, "layers": list(layers), "max_len": a.max_len, "data": data}
    meta["held_every"] = a.held_every
    meta_path = out / "meta.json"
    if meta_path.exists() and json.loads(meta_path.read_text()) != meta:
        raise SystemExit(f"{out} holds features made with other settings (meta.json)")
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    seqs = read_sequences([Path(p) for p in a.data.split(",")], a.max_len)
    held = [s for i, s in enumerate(seqs) if i % a.held_every == 0]
    train = [s for i, s in enumerate(seqs) if i % a.held_every != 0]
    model = load_model(a.target).model
    jobs = [("held", held[:CHUNK_SEQS])]
    jobs += [("train", train[i : i + CHUNK_SEQS]) for i in range(0, len(train), CHUNK_SEQS)]
    written = 0
    for n, (kind, part) in enumerate(jobs):
        path = out / f"{kind}-{n:05d}.npz"
        if path.exists() or not part:
            continue
        t0 = time.perf_counter()
        write_chunk(path, model, part, layers, a.batch_tokens)
        toks = sum(len(s) for s, _ in part)
        dt = time.perf_counter() - t0
        print(f"{path.name}: {toks} tokens in {dt:.1f} s ({toks / dt:.0f} tok/s)", flush=True)
        written += 1
        if written >= a.max_chunks:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
