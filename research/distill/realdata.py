"""The target answers a prompt pool (pool.py): same shards as data.py, plus each answer's kind.

Order: the first `n_eval` held-out groups, then training groups in id order. A continuation
(slot 1: followup or self_written) is answered in the shard after its parent's, since its prompt
holds the parent's answer; a resumed run finds such pending continuations from the shards (their
parent is done, they are not). Each shard is written atomically and meta.json after it, so a
killed job loses at most the shard in progress and `generate_pool_data` picks up where it was.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from edgespec.distill.data import answer, is_greedy, reconcile_meta
from edgespec.distill.shards import (
    Meta,
    Sequence,
    add_counts,
    atomic_write_npz,
    done_ids,
    next_index,
    pack,
    read_shard,
    shard_path,
    shard_paths,
)
from research.distill.pool import SLOTS, Pool, PoolPrompt
from research.distill.requests import KINDS, written_prompt


def pool_meta(pool: Pool, sha: str, target: str, meta: Meta) -> Meta:
    """`meta` (target, sampling, n_eval) bound to a pool: its hash, seed, split and id space."""
    n_ids = (max((p.id for p in pool.prompts), default=0) // SLOTS + 1) * SLOTS
    return Meta(
        target=target,
        instruction_seed=pool.seed,
        n_instructions=n_ids,
        eval_fraction=pool.eval_fraction,
        n_eval=meta.n_eval,
        sampling=meta.sampling,
        prompt_set=f"pool:{sha}",
        id_stride=SLOTS,
        kinds=list(KINDS),
    )


def plan_pool(pool: Pool, n_eval: int) -> tuple[list[int], set[int]]:
    """(root prompt ids in answer order, held-out prompt ids): the first `n_eval` held-out
    groups first (all their prompts held out), then every training group."""
    roots = [p.id for p in pool.prompts if p.parent < 0]
    held_roots = [i for i in roots if pool.is_held_out(i)][:n_eval]
    held_groups = {i // SLOTS for i in held_roots}
    held = {p.id for p in pool.prompts if p.group in held_groups}
    train = [i for i in roots if not pool.is_held_out(i)]
    return held_roots + train, held


def conversation(
    p: PoolPrompt, by_id: dict[int, PoolPrompt], answers: dict[int, str]
) -> list[dict]:
    """The chat messages of prompt `p`; `answers` holds the target's answers to its ancestors."""
    if p.kind == "self_written":
        return [{"role": "user", "content": written_prompt(answers[p.parent]) or p.fallback}]
    if p.parent >= 0:
        parent = by_id[p.parent]
        return [
            *conversation(parent, by_id, answers),
            {"role": "assistant", "content": answers[p.parent]},
            {"role": "user", "content": p.user},
        ]
    msgs = [{"role": "system", "content": p.system}] if p.system else []
    return [*msgs, {"role": "user", "content": p.user}]


def answer_text(tokenizer: object, s: Sequence) -> str:
    """The completion of `s` as text, without the EOS token."""
    eos = set(tokenizer.eos_token_ids)  # type: ignore[attr-defined]
    ids = [int(t) for t in s.ids[s.prompt_len :] if int(t) not in eos]
    return tokenizer.decode(ids).strip()  # type: ignore[attr-defined]


def _answers_from_shards(data_dir: Path, tokenizer: object, wanted: set[int]) -> dict[int, str]:
    out: dict[int, str] = {}
    for path in shard_paths(data_dir) if wanted else []:
        with np.load(path) as z:
            if not wanted & set(z["instr_ids"].tolist()):
                continue
        for s in read_shard(path):
            if s.instr_id in wanted:
                out[s.instr_id] = answer_text(tokenizer, s)
    return out


def write_pool_shard(
    data_dir: Path, index: int, seqs: list[Sequence], kinds: list[str], compress: bool = False
) -> Path:
    """A data.py shard plus `kinds` (uint8 codes into requests.KINDS)."""
    arrays = pack(seqs)
    arrays["kinds"] = np.array([KINDS.index(k) for k in kinds], np.uint8)
    path = shard_path(data_dir, index)
    atomic_write_npz(path, arrays, compress)
    return path


def generate_pool_data(
    model: object,
    tokenizer: object,
    data_dir: Path,
    pool: Pool,
    meta: Meta,
    *,
    tokens: int,
    batch_size: int = 32,
    shard_size: int = 64,
    on_tokens: Callable[[int], object] | None = None,
    on_shard: Callable[[Meta], object] | None = None,
) -> Meta:
    """Answer the pool until the data holds `tokens` completion tokens (or the pool is done).

    `meta` must come from `pool_meta` (a folder made from another pool or target is refused).
    Each shard holds the pending continuations and then new root prompts, `shard_size` in all.
    """
    import mlx.core as mx

    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    meta = reconcile_meta(data_dir, meta)
    by_id = pool.by_id()
    children: dict[int, list[int]] = {}
    for p in pool.prompts:
        if p.parent >= 0:
            children.setdefault(p.parent, []).append(p.id)
    order, held = plan_pool(pool, meta.n_eval)
    done = done_ids(data_dir)
    pending = [c for i in sorted(done) for c in children.get(i, ()) if c not in done]
    answers = _answers_from_shards(data_dir, tokenizer, {by_id[c].parent for c in pending})
    roots = [i for i in order if i not in done]
    while meta.n_completion_tokens < tokens and (roots or pending):
        n_new = max(0, shard_size - len(pending))
        ids, roots = pending + roots[:n_new], roots[n_new:]
        index = next_index(data_dir)
        mx.random.seed(meta.instruction_seed * 100_003 + index)
        items = [
            (
                i,
                list(_template(tokenizer, conversation(by_id[i], by_id, answers))),
                is_greedy(i, meta, held),
            )
            for i in ids
        ]
        seqs = answer(model, tokenizer, items, meta.sampling, batch_size, on_tokens)
        write_pool_shard(data_dir, index, seqs, [by_id[i].kind for i in ids])
        meta = add_counts(meta, seqs)
        meta.write(data_dir)
        answers = {s.instr_id: answer_text(tokenizer, s) for s in seqs if s.instr_id in children}
        pending = [c for s in seqs for c in children.get(s.instr_id, ())]
        if on_shard is not None:
            on_shard(meta)
    return meta


def _template(tokenizer: object, messages: list[dict]) -> list[int]:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)  # type: ignore[attr-defined]


def kind_counts(data_dir: Path) -> dict[str, tuple[int, int]]:
    """kind -> (answers, completion tokens) over the shards of a pool's data folder."""
    out: dict[str, list[int]] = {}
    for path in shard_paths(data_dir):
        with np.load(path) as z:
            if "kinds" not in z.files:
                continue
            comp = np.diff(z["starts"]) - z["prompt_lens"]
            for code, n in zip(z["kinds"].tolist(), comp.tolist(), strict=True):
                c = out.setdefault(KINDS[code], [0, 0])
                c[0] += 1
                c[1] += int(n)
    return {k: (out[k][0], out[k][1]) for k in KINDS if k in out}
