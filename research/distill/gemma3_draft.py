"""How research/distill/gemma3-270m-draft was made: a token draft for Gemma 3 270M (the base model)
trained on this project's shared 2-core CPU in about an hour, at low priority.

On that CPU the target could not even be run enough to label data: a niced process got about a
tenth of a core, and one Gemma 3 270M token (its 262,144-row output matrix included) costs about
0.55 GFLOP. So the draft learns from labels that need no target forward:
  * held-out: the target's greedy continuations of the first 32 held-out openings of
    research/distill/continuations.py; along a greedy continuation the target's argmax at each
    position is the next token, so these are exact agreement labels;
  * training: real text (passages of what is installed on this machine,
    research/distill/sources.py), BOS + up to `--max-len` tokens, each position labelled with the
    text's own next token (top-1 with probability 1): plain next-token training of a draft that
    starts as the target's own layers, instead of distillation on the target's top-16.
Then `edgespec.distill.train` (target layers 0, 1, 16, 17 = two sliding-window layers from each
end and the last global one, the target's embedding, a `--head-size` head) and the export
(4-bit, sharing the target's embedding).

    python -m research.distill.continuations --target gemma3-270m --data runs/gemma3/data \
        --tokens 2048                      # the held-out shard (32 greedy continuations)
    python -m research.distill.gemma3_draft --target gemma3-270m --run runs/gemma3
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np

from edgespec.distill.checkpoints import TrainConfig
from edgespec.distill.instructions import is_eval
from edgespec.distill.pipeline import export_stage
from edgespec.distill.shards import (
    Meta,
    Sequence,
    add_counts,
    next_index,
    read_shard,
    shard_paths,
    write_shard,
)
from edgespec.distill.target import load_target
from edgespec.distill.train import train

FIRST_ID = 1_000_000  # teacher-forced passages: ids far from the openings'


def passage_ids(seed: int) -> list[int]:
    """Training ids at or past FIRST_ID that the held-out split never claims."""
    return [i for i in range(FIRST_ID, FIRST_ID + 200_000) if not is_eval(i, seed, 0.02)]


def next_token_labels(seq: Sequence) -> Sequence:
    """`seq` labelled with its own next tokens (top-1, log-probability 0) at completion positions.

    >>> s = next_token_labels(Sequence(7, 2, np.array([2, 5, 6, 9])))
    >>> s.topk_ids.tolist(), s.topk_logprobs.tolist()
    ([[6], [9]], [[0.0], [0.0]])
    """
    nxt = seq.ids[seq.prompt_len :].astype(np.int32)[:, None]
    return Sequence(seq.instr_id, seq.prompt_len, seq.ids, nxt, np.zeros(nxt.shape, np.float16))


def label_shards(data_dir: Path) -> None:
    """Give every shard without labels its next-token labels (the held-out continuations)."""
    for path in shard_paths(data_dir):
        seqs = read_shard(path)
        if seqs and seqs[0].topk_ids is None:
            path.unlink()
            write_shard(
                data_dir, int(path.stem.split("-")[1]), [next_token_labels(s) for s in seqs]
            )


def add_passages(data_dir: Path, tokenizer: object, n: int, max_len: int, seed: int) -> Meta:
    """Write `n` labelled real-text passages, 16 to a shard, unless the data already holds them
    (resumable)."""
    from research.distill.sources import collect

    meta = Meta.read(data_dir)
    have = sum(1 for p in shard_paths(data_dir) for i in np.load(p)["instr_ids"] if i >= FIRST_ID)
    if have >= n:
        return meta
    texts = [p.text for p in collect(seed, man=False) if p.lang == "en"]
    random.Random(seed).shuffle(texts)
    ids = passage_ids(meta.instruction_seed)
    seqs = []
    for k in range(have, n):
        tokens = list(tokenizer.encode(texts[k % len(texts)]))[: max_len + 1]  # type: ignore[attr-defined]
        seqs.append(next_token_labels(Sequence(ids[k], 1, np.array(tokens, np.int64))))
        if len(seqs) == 16 or k == n - 1:
            write_shard(data_dir, next_index(data_dir), seqs)
            meta = add_counts(meta, seqs)
            meta.write(data_dir)
            seqs = []
    return meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--run", type=Path, required=True, help="folder with data/ (openings)")
    ap.add_argument("--passages", type=int, default=400)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--head-size", type=int, default=8192)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    data = a.run / "data"
    target = load_target(a.target)
    label_shards(data)
    meta = add_passages(data, target.tokenizer, a.passages, a.max_len, a.seed)
    cfg = TrainConfig(
        steps=a.steps,
        batch_tokens=a.batch,
        lr=a.lr,
        warmup=20,
        eval_every=25,
        ckpt_every=25,
        max_len=a.max_len + 64,
    )
    result = train(target, data, a.run, cfg, resume=True)
    command = "python -m research.distill.gemma3_draft " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items()
    )
    quantized = export_stage(result, data, meta, a.run / "draft", command, a.bits)
    print(
        f"{result.state.step} steps, {result.state.tokens_seen} tokens seen; held-out "
        f"agreement {result.agreement:.4f} (fp32), {quantized:.4f} ({a.bits}-bit)"
    )


if __name__ == "__main__":
    main()
