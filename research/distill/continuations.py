"""Distillation data for a base model (no chat template): the target continues text openings.

A base model is prompted with text to continue, not with a user message, so its draft should learn
its continuations. The openings are seeded and mixed from two kinds:
  * real text: passages of what is installed on this machine (research/distill/sources.py: Python
    sources and docstrings, Debian documentation, licences, translated messages), cut after a
    seeded 16-128 tokens;
  * question / answer framing: EdgeSpec's generated instructions (edgespec.distill.instructions)
    written as "Question: ...\\nAnswer:", the form a base model continues best.
The target answers them batched (edgespec.distill.data.answer: greedy for the held-out split and a
quarter of the rest, else sampled at T 0.8), with its top-16 log-probabilities, into the usual
token shards (edgespec/distill/shards.py), so `edgespec.distill.train` trains on them unchanged.

    python -m research.distill.continuations --target runs/gemma3/target --data runs/gemma3/data \
        --tokens 120000
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import mlx.core as mx
from tqdm import tqdm

from edgespec.distill.data import answer, is_greedy, reconcile_meta
from edgespec.distill.instructions import instructions, split
from edgespec.distill.shards import (
    Meta,
    SamplingPlan,
    add_counts,
    done_ids,
    next_index,
    write_shard,
)
from edgespec.distill.target import load_target

PROMPT_SET = "continuations-v1"
MIN_CUT, MAX_CUT = 16, 128


def openings(tokenizer: object, n: int, seed: int) -> list[list[int]]:
    """`n` prompt token lists (BOS first), alternating real-text cuts and question framings."""
    from research.distill.sources import collect

    rnd = random.Random(seed)
    passages = [p.text for p in collect(seed, man=False)]
    rnd.shuffle(passages)
    questions = instructions(n, seed)
    out: list[list[int]] = []
    for i in range(n):
        if i % 2 == 0 and passages:
            ids = list(tokenizer.encode(passages[(i // 2) % len(passages)]))  # type: ignore[attr-defined]
            out.append(ids[: rnd.randint(MIN_CUT, MAX_CUT)])
        else:
            text = f"Question: {questions[i]}\nAnswer:"
            out.append(list(tokenizer.encode(text)))  # type: ignore[attr-defined]
    return out


def generate(
    target_spec: str,
    data_dir: Path,
    tokens: int,
    n: int,
    seed: int,
    batch: int,
    shard_size: int,
    max_new: int,
) -> Meta:
    """Answer openings until the data holds `tokens` completion tokens; resumable."""
    target = load_target(target_spec)
    plan = SamplingPlan(temperature=0.8, greedy_fraction=0.25, max_new_tokens=max_new)
    meta = Meta(
        target=target_spec,
        instruction_seed=seed,
        n_instructions=n,
        sampling=plan,
        prompt_set=PROMPT_SET,
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    meta = reconcile_meta(data_dir, meta)
    train, held = split(n, seed, meta.eval_fraction)
    held = held[: meta.n_eval]
    done = done_ids(data_dir)
    todo = [i for i in held + train if i not in done]
    prompts = openings(target.tokenizer, n, seed)
    bar = tqdm(total=tokens, initial=min(meta.n_completion_tokens, tokens), unit="tok")
    while meta.n_completion_tokens < tokens and todo:
        chunk, todo = todo[:shard_size], todo[shard_size:]
        index = next_index(data_dir)
        mx.random.seed(seed * 100_003 + index)
        items = [(i, prompts[i], is_greedy(i, meta, set(held))) for i in chunk]
        seqs = answer(target.model, target.tokenizer, items, meta.sampling, batch, bar.update)
        write_shard(data_dir, index, seqs)
        meta = add_counts(meta, seqs)
        meta.write(data_dir)
    bar.close()
    return meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--tokens", type=int, default=120_000)
    ap.add_argument("--prompts", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--shard-size", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    a = ap.parse_args()
    meta = generate(
        a.target, a.data, a.tokens, a.prompts, a.seed, a.batch, a.shard_size, a.max_new_tokens
    )
    print(f"{meta.n_sequences} continuations, {meta.n_completion_tokens} tokens in {a.data}")


if __name__ == "__main__":
    main()
