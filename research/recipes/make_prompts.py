"""Chat-templated token ids of EdgeSpec's own instructions, for the GPU data-generation run
(research/recipes/gpu_distill.py). Runs on the CPU, with the target pulled by EdgeSpec:

    python -m research.recipes.make_prompts --target smollm2-135m-instruct --n 150000 --out prompts.npz

Training prompts are the instructions outside the held-out slice (instructions.is_eval); the
first --n-eval held-out instructions are written apart, for the held-out agreement curve.
No benchmark prompt is involved.
"""

from __future__ import annotations

import argparse

import numpy as np

from edgespec.distill.data import prompt_ids
from edgespec.distill.instructions import instructions, is_eval
from edgespec.loading.paths import model_dir


def pack(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    starts = np.zeros(len(seqs) + 1, np.int64)
    starts[1:] = np.cumsum([len(s) for s in seqs])
    return np.concatenate([np.array(s, np.uint16) for s in seqs]), starts


def main() -> None:
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--n", type=int, default=150_000)
    ap.add_argument("--n-eval", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    tok = load_tokenizer(model_dir(args.target))
    train, train_ids, held, held_ids = [], [], [], []
    for i, text in enumerate(instructions(args.n, seed=args.seed)):
        if is_eval(i, seed=args.seed):
            if len(held) < args.n_eval:
                held.append(prompt_ids(tok, text))
                held_ids.append(i)
        else:
            train.append(prompt_ids(tok, text))
            train_ids.append(i)
    tokens, starts = pack(train)
    eval_tokens, eval_starts = pack(held)
    np.savez_compressed(
        args.out,
        tokens=tokens,
        starts=starts,
        instr_ids=np.array(train_ids, np.int32),
        eval_tokens=eval_tokens,
        eval_starts=eval_starts,
        eval_ids=np.array(held_ids, np.int32),
        seed=np.array(args.seed),
        n_instructions=np.array(args.n),
    )
    print(
        f"{len(train)} training + {len(held)} held-out prompts, {starts[-1]} tokens -> {args.out}"
    )


if __name__ == "__main__":
    main()
