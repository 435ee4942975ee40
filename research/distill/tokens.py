"""Reading a distillation data set back and exporting its compact form: helpers of the research
recipes (research/recipes/) and their tests, not of the `edgespec distill` command, which writes
shards (edgespec/distill/shards.py) and trains on them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from edgespec.distill.shards import (
    Meta,
    Sequence,
    atomic_write_npz,
    read_shard,
    recount,
    shard_path,
    shard_paths,
)


def iter_sequences(data_dir: Path) -> Iterator[Sequence]:
    for p in shard_paths(data_dir):
        yield from read_shard(p)


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
