"""Distillation data: the target answers the project's instructions, resumably, into token shards
(the format: edgespec/distill/shards.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence as Seq
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.generate import BatchGenerator
from mlx_lm.sample_utils import make_sampler
from tqdm import tqdm

from edgespec.distill.instructions import instructions, split
from edgespec.distill.shards import (
    Meta,
    SamplingPlan,
    Sequence,
    add_counts,
    done_ids,
    next_index,
    recount,
    write_shard,
)
from edgespec.errors import ConfigError


def _salted_unit(i: int, seed: int, salt: str) -> float:
    h = hashlib.blake2b(f"{salt}:{seed}:{i}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2**64


def is_greedy(instr_id: int, meta: Meta, held_out: set[int]) -> bool:
    """Held-out instructions are always answered greedily (agreement is measured at T=0);
    a seeded `greedy_fraction` of the others too."""
    if instr_id in held_out:
        return True
    u = _salted_unit(instr_id, meta.instruction_seed, "greedy")
    return u < meta.sampling.greedy_fraction


def plan_ids(meta: Meta) -> tuple[list[int], set[int]]:
    """(answer order, held-out ids): the first `n_eval` held-out ids first, then training ids."""

    train, held = split(meta.n_instructions, meta.instruction_seed, meta.eval_fraction)
    held = held[: meta.n_eval]
    return held + train, set(held)


def prompt_ids(tokenizer: object, text: str) -> list[int]:
    """The chat-templated prompt for one user message (the target's own template)."""
    msgs = [{"role": "user", "content": text}]
    return list(tokenizer.apply_chat_template(msgs, add_generation_prompt=True))  # type: ignore[attr-defined]


def _topk(logprobs: list, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k ids and log-probs (descending) of each row of a list of [V] arrays."""
    lp = mx.stack(logprobs)
    idx = mx.argpartition(-lp, kth=k - 1, axis=-1)[:, :k]
    val = mx.take_along_axis(lp, idx, axis=-1)
    order = mx.argsort(-val, axis=-1)
    idx, val = mx.take_along_axis(idx, order, axis=-1), mx.take_along_axis(val, order, axis=-1)
    return np.array(idx, np.int32), np.array(val.astype(mx.float32), np.float32)


def answer(
    model: object,
    tokenizer: object,
    items: Seq[tuple[int, str | list[int], bool]],
    plan: SamplingPlan,
    batch_size: int,
    on_tokens: object = None,
) -> list[Sequence]:
    """Answer (instr_id, text or prompt token ids, greedy) items with the target; keep its top-k
    at each step.

    Greedy and sampled items run as two separate batches: mlx-lm samples a batch in one call
    only when every row shares one sampler (mixed rows are sampled one by one, ~2x slower).
    `on_tokens(n)` (optional) is called with the number of tokens each step produced.
    """
    done: dict[int, Sequence] = {}
    for greedy in (True, False):
        group = [it for it in items if it[2] is greedy]
        if group:
            for seq in _answer_group(model, tokenizer, group, plan, batch_size, greedy, on_tokens):
                done[seq.instr_id] = seq
    return [done[i] for i, _, _ in items]


def _answer_group(
    model: object,
    tokenizer: object,
    items: Seq[tuple[int, str | list[int], bool]],
    plan: SamplingPlan,
    batch_size: int,
    greedy_group: bool,
    on_tokens: object = None,
) -> list[Sequence]:
    """Answer items that all share one sampler (greedy, or sampled per `plan`)."""
    eos = sorted(tokenizer.eos_token_ids)  # type: ignore[attr-defined]
    gen = BatchGenerator(
        model,  # type: ignore[arg-type]
        max_tokens=plan.max_new_tokens,
        stop_tokens=[[e] for e in eos],
        completion_batch_size=batch_size,
        prefill_batch_size=min(8, batch_size),
    )
    sampled = make_sampler(temp=plan.temperature, top_p=plan.top_p)

    def greedy(lp: mx.array) -> mx.array:
        return mx.argmax(lp, axis=-1)

    # An item's prompt is a user message, or chat-templated token ids already (conversations).
    prompts = [t if isinstance(t, list) else prompt_ids(tokenizer, t) for _, t, _ in items]
    shared = greedy if greedy_group else sampled  # one object for every row: batched sampling
    uids = gen.insert(prompts, samplers=[shared] * len(items))
    row = {u: i for i, u in enumerate(uids)}
    toks: list[list[int]] = [[] for _ in items]
    tk: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in items]
    pending = set(uids)
    while pending:
        responses = gen.next_generated()
        if not responses:
            continue
        ids, lps = _topk([r.logprobs for r in responses], plan.top_k_saved)
        for j, r in enumerate(responses):
            toks[row[r.uid]].append(int(r.token))
            tk[row[r.uid]].append((ids[j], lps[j]))
            if r.finish_reason is not None:
                pending.discard(r.uid)
        if callable(on_tokens):
            on_tokens(len(responses))
    gen.close()
    return [
        Sequence(
            iid,
            len(p),
            np.array(p + t, np.int64),
            np.stack([a for a, _ in k_]),
            np.stack([b for _, b in k_]).astype(np.float16),
        )
        for (iid, _, _), p, t, k_ in zip(items, prompts, toks, tk, strict=True)
    ]


def generate_data(
    model: object,
    tokenizer: object,
    data_dir: Path,
    meta: Meta,
    *,
    tokens: int,
    batch_size: int = 32,
    shard_size: int = 128,
    progress: bool = True,
) -> Meta:
    """Answer instructions until the data holds `tokens` completion tokens; resumable.

    An existing meta.json must describe the same target and instruction seed (else ConfigError).
    Each shard is seeded by its index, written atomically, and meta.json is updated after it.
    """
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    meta = reconcile_meta(data_dir, meta)
    order, held = plan_ids(meta)
    done = done_ids(data_dir)
    todo = [i for i in order if i not in done]
    texts = instructions(meta.n_instructions, meta.instruction_seed)
    bar = tqdm(
        total=tokens,
        initial=min(meta.n_completion_tokens, tokens),
        unit="tok",
        desc="data",
        disable=not progress,
    )
    while meta.n_completion_tokens < tokens and todo:
        chunk, todo = todo[:shard_size], todo[shard_size:]
        index = next_index(data_dir)
        mx.random.seed(meta.instruction_seed * 100_003 + index)
        items = [(i, texts[i], is_greedy(i, meta, held)) for i in chunk]
        seqs = answer(model, tokenizer, items, meta.sampling, batch_size, bar.update)
        write_shard(data_dir, index, seqs)
        meta = add_counts(meta, seqs)
        meta.write(data_dir)
    bar.close()
    return meta


def reconcile_meta(data_dir: Path, meta: Meta) -> Meta:
    """Keep the on-disk meta (and its counts) if it matches; refuse to mix different data."""

    if not (data_dir / "meta.json").exists():
        meta = recount(data_dir, meta)
        meta.write(data_dir)
        return meta
    old = Meta.read(data_dir)
    keys = ("target", "prompt_set", "instruction_seed", "n_instructions", "eval_fraction", "n_eval")
    for key in (*keys, "id_stride"):
        if getattr(old, key) != getattr(meta, key):
            raise ConfigError(
                f"{data_dir} holds data with {key}={getattr(old, key)!r}, not "
                f"{getattr(meta, key)!r}; use another --data folder"
            )
    return recount(data_dir, old)
