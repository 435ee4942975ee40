"""Distillation data: the target's own answers to the project's instructions, as token shards.

Format (shared with the GPU script; readers must ignore keys they do not know):
  DIR/meta.json           {"version", "target", "instruction_seed", "n_instructions",
                           "eval_fraction", "n_eval", "sampling": {...}, "n_sequences",
                           "n_tokens", "n_completion_tokens", "shards",
                           "prompt_set", "id_stride", "kinds"}
  DIR/shard-00000.npz     tokens       uint16 (int32 if vocab > 65535) [n_tokens] flat
                          starts       int64 [n_seq + 1]   sequence s = tokens[starts[s]:starts[s+1]]
                          prompt_lens  int32 [n_seq]       leading tokens of s that are the
                                                           chat-templated prompt
                          instr_ids    int32 [n_seq]       index into instructions(n, seed)
                optional: kinds         uint8 [n_seq]       request kind, an index into meta's
                                                           "kinds" (prompt pools, pool.py)
                          topk_ids      int32   [n_completion, k]  the target's top-k next-token
                          topk_logprobs float16 [n_completion, k]  ids / full-vocab log-probs at
                                                           each completion position, in order
                                                           (sequence by sequence, position
                                                           prompt_len-1 .. len-2)
A sequence ends with the target's EOS when it stopped by itself. Shards are written atomically
(temp file + os.replace), so a shard either exists whole or not at all; resuming skips every
instruction id already present in a shard.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

FORMAT_VERSION = 1
SHARD_GLOB = "shard-*.npz"


@dataclass(frozen=True)
class SamplingPlan:
    """How the target answers: sampled at `temperature`/`top_p`, except a seeded `greedy_fraction`
    of instructions (and every held-out one), which are answered greedily."""

    temperature: float = 0.8
    top_p: float = 0.95
    greedy_fraction: float = 0.25
    max_new_tokens: int = 192
    top_k_saved: int = 16


@dataclass
class Meta:
    """meta.json: what the data is and how it was made; counts are updated after every shard."""

    target: str
    instruction_seed: int = 0
    n_instructions: int = 50_000
    eval_fraction: float = 0.02
    n_eval: int = 48
    sampling: SamplingPlan = field(default_factory=SamplingPlan)
    n_sequences: int = 0
    n_tokens: int = 0
    n_completion_tokens: int = 0
    shards: int = 0
    version: int = FORMAT_VERSION
    # Which prompts the ids index: "instructions" (instructions.py) or "pool:<sha256>" (a prompt
    # pool file, pool.py). The held-out split is is_eval(instr_id // id_stride). `kinds` names
    # the codes of a shard's optional `kinds` array. Older meta.json files lack all three.
    prompt_set: str = "instructions"
    id_stride: int = 1
    kinds: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, data_dir: Path) -> Meta:
        raw = json.loads((Path(data_dir) / "meta.json").read_text())
        raw["sampling"] = SamplingPlan(**raw.get("sampling", {}))
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in raw.items() if k in known})

    def write(self, data_dir: Path) -> None:
        atomic_write_bytes(
            Path(data_dir) / "meta.json", (json.dumps(asdict(self), indent=2) + "\n").encode()
        )


@dataclass(frozen=True)
class Sequence:
    """One answered instruction: `ids` = prompt tokens + completion tokens."""

    instr_id: int
    prompt_len: int
    ids: np.ndarray  # [L] int
    topk_ids: np.ndarray | None = None  # [L - prompt_len, k]
    topk_logprobs: np.ndarray | None = None  # [L - prompt_len, k]

    @property
    def n_completion(self) -> int:
        return len(self.ids) - self.prompt_len


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to a temp file beside `path`, fsync, then rename over it (all or nothing)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def shard_path(data_dir: Path, index: int) -> Path:
    return Path(data_dir) / f"shard-{index:05d}.npz"


def shard_paths(data_dir: Path) -> list[Path]:
    return sorted(Path(data_dir).glob(SHARD_GLOB))


def pack(seqs: list[Sequence]) -> dict[str, np.ndarray]:
    """Sequences -> the shard arrays.

    >>> a = pack([Sequence(3, 2, np.array([5, 6, 7])), Sequence(9, 1, np.array([8, 9]))])
    >>> a["tokens"].tolist(), a["starts"].tolist(), a["prompt_lens"].tolist()
    ([5, 6, 7, 8, 9], [0, 3, 5], [2, 1])
    """
    flat = np.concatenate([s.ids for s in seqs]) if seqs else np.zeros(0, np.int64)
    dtype = np.uint16 if flat.size == 0 or int(flat.max()) < 2**16 else np.int32
    out = {
        "tokens": flat.astype(dtype),
        "starts": np.concatenate([[0], np.cumsum([len(s.ids) for s in seqs])]).astype(np.int64),
        "prompt_lens": np.array([s.prompt_len for s in seqs], np.int32),
        "instr_ids": np.array([s.instr_id for s in seqs], np.int32),
    }
    if seqs and all(s.topk_ids is not None for s in seqs):
        out["topk_ids"] = np.concatenate([s.topk_ids for s in seqs]).astype(np.int32)  # type: ignore[misc]
        out["topk_logprobs"] = np.concatenate([s.topk_logprobs for s in seqs]).astype(np.float16)  # type: ignore[misc]
    return out


def unpack(arrays: dict[str, np.ndarray]) -> list[Sequence]:
    """Shard arrays -> sequences (inverse of `pack`)."""
    tokens, starts = arrays["tokens"].astype(np.int64), arrays["starts"]
    plens, iids = arrays["prompt_lens"], arrays["instr_ids"]
    has_topk = "topk_ids" in arrays
    out, c = [], 0
    for s in range(len(plens)):
        ids = tokens[starts[s] : starts[s + 1]]
        n = len(ids) - int(plens[s])
        tk = (
            (arrays["topk_ids"][c : c + n], arrays["topk_logprobs"][c : c + n])
            if has_topk
            else (None, None)
        )
        out.append(Sequence(int(iids[s]), int(plens[s]), ids, *tk))
        c += n
    return out


def write_shard(data_dir: Path, index: int, seqs: list[Sequence]) -> Path:
    """Write shard `index` atomically; return its path."""
    path = shard_path(data_dir, index)
    atomic_write_npz(path, pack(seqs))
    return path


def atomic_write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """np.savez to `path`, atomically (a killed run never leaves half a file)."""
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    atomic_write_bytes(path, buf.getvalue())


def read_shard(path: Path) -> list[Sequence]:
    with np.load(path) as z:
        return unpack({k: z[k] for k in z.files})


def iter_sequences(data_dir: Path) -> Iterator[Sequence]:
    for p in shard_paths(data_dir):
        yield from read_shard(p)


def done_ids(data_dir: Path) -> set[int]:
    """Instruction ids already answered in some shard (what a resumed run skips)."""
    out: set[int] = set()
    for p in shard_paths(data_dir):
        with np.load(p) as z:
            out.update(int(i) for i in z["instr_ids"])
    return out


# ---------------------------------------------------------------------------------------------
# Generation: the target answers instructions, batched (continuous batching, mlx-lm's
# BatchGenerator), sampled or greedy per instruction, one shard at a time.


def _salted_unit(i: int, seed: int, salt: str) -> float:
    import hashlib

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
    from edgespec.distill.instructions import split

    train, held = split(meta.n_instructions, meta.instruction_seed, meta.eval_fraction)
    held = held[: meta.n_eval]
    return held + train, set(held)


def prompt_ids(tokenizer: object, text: str) -> list[int]:
    """The chat-templated prompt for one user message (the target's own template)."""
    msgs = [{"role": "user", "content": text}]
    return list(tokenizer.apply_chat_template(msgs, add_generation_prompt=True))  # type: ignore[attr-defined]


def _topk(logprobs: list, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k ids and log-probs (descending) of each row of a list of [V] arrays."""
    import mlx.core as mx

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
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

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
    import mlx.core as mx
    from tqdm import tqdm

    from edgespec.distill.instructions import instructions

    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    meta = _reconcile_meta(data_dir, meta)
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
        meta = _count(meta, seqs)
        meta.write(data_dir)
    bar.close()
    return meta


def next_index(data_dir: Path) -> int:
    """The index the next shard written to data_dir gets (one past the highest)."""
    paths = shard_paths(data_dir)
    return int(paths[-1].stem.split("-")[1]) + 1 if paths else 0


def _count(meta: Meta, seqs: list[Sequence]) -> Meta:
    meta.n_sequences += len(seqs)
    meta.n_tokens += sum(len(s.ids) for s in seqs)
    meta.n_completion_tokens += sum(s.n_completion for s in seqs)
    meta.shards += 1
    return meta


def _reconcile_meta(data_dir: Path, meta: Meta) -> Meta:
    """Keep the on-disk meta (and its counts) if it matches; refuse to mix different data."""
    from edgespec.errors import ConfigError

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


def recount(data_dir: Path, meta: Meta) -> Meta:
    """Counts from the shards themselves (the source of truth: a run killed between writing a
    shard and meta.json, or a deleted shard, leaves meta.json's counts stale)."""
    meta.n_sequences = meta.n_tokens = meta.n_completion_tokens = meta.shards = 0
    for p in shard_paths(data_dir):
        with np.load(p) as z:
            lens = np.diff(z["starts"])
            meta.n_sequences += len(lens)
            meta.n_tokens += int(lens.sum())
            meta.n_completion_tokens += int((lens - z["prompt_lens"]).sum())
            meta.shards += 1
    return meta


def _same_arrays(path: Path, arrays: dict[str, np.ndarray]) -> bool:
    with np.load(path) as z:
        return set(z.files) == set(arrays) and all(
            z[k].dtype == v.dtype and np.array_equal(z[k], v) for k, v in arrays.items()
        )


def export_tokens(data_dir: Path, dest: Path) -> Meta:
    """Copy the data as token ids only (no teacher top-k: ~2 bytes a token instead of ~100).

    This is the compact form committed with a draft, so generated text accumulates across
    sessions; the trainer recomputes the top-k (as sidecar files) when it reads such shards.
    A shard already in `dest` with the same arrays is left as it is (a re-export after more data
    adds files instead of rewriting every shard, which would grow a git history); others are
    replaced or removed. `dest/meta.json` gets the source's meta.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    written: set[Path] = set()
    for src in shard_paths(data_dir):
        with np.load(src) as z:  # every array but the teacher's (e.g. a pool's `kinds`) is kept
            arrays = {k: z[k] for k in z.files if k not in ("topk_ids", "topk_logprobs")}
        path = shard_path(dest, int(src.stem.split("-")[1]))
        written.add(path)
        if not (path.exists() and _same_arrays(path, arrays)):
            atomic_write_npz(path, arrays)
    for old in shard_paths(dest):
        if old not in written:
            old.unlink()
    meta = recount(dest, Meta.read(data_dir))
    meta.write(dest)
    return meta
