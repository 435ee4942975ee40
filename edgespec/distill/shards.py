"""Distillation data on disk: the target's own answers as token shards, and their meta.json.

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

import io
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from edgespec.files import atomic_write_bytes

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


def atomic_write_npz(path: Path, arrays: dict[str, np.ndarray], compress: bool = False) -> None:
    """np.savez (np.savez_compressed with `compress`: files that are committed or carried) to
    `path`, atomically (a killed run never leaves half a file)."""
    buf = io.BytesIO()
    (np.savez_compressed if compress else np.savez)(buf, **arrays)  # type: ignore[arg-type]
    atomic_write_bytes(path, buf.getvalue())


def read_shard(path: Path) -> list[Sequence]:
    with np.load(path) as z:
        return unpack({k: z[k] for k in z.files})


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


def next_index(data_dir: Path) -> int:
    """The index the next shard written to data_dir gets (one past the highest)."""
    paths = shard_paths(data_dir)
    return int(paths[-1].stem.split("-")[1]) + 1 if paths else 0


def add_counts(meta: Meta, seqs: list[Sequence]) -> Meta:
    meta.n_sequences += len(seqs)
    meta.n_tokens += sum(len(s.ids) for s in seqs)
    meta.n_completion_tokens += sum(s.n_completion for s in seqs)
    meta.shards += 1
    return meta


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
