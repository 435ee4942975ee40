"""The teacher side of distillation: load the target, and compute its top-k next-token
log-probabilities for data that does not carry them (e.g. shards from another generator)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from edgespec.distill.shards import Sequence, read_shard, shard_paths
from edgespec.errors import ConfigError
from edgespec.files import atomic_write_bytes
from edgespec.loading.load import load_model


@dataclass
class Target:
    """A loaded target: model (fp32 on the CPU backend), tokenizer, name and config.json."""

    model: nn.Module
    tokenizer: Any
    name: str
    config: dict


def load_target(spec: str) -> Target:
    """Load a target through EdgeSpec's loader (catalogue name, folder, .gguf, repo id)."""

    lm = load_model(spec)
    return Target(lm.model, lm.tokenizer, spec, dict(lm.config))


def teacher_topk(model: nn.Module, seqs: list[Sequence], k: int) -> list[Sequence]:
    """Teacher-forced top-k log-probs at each completion position (one sequence per forward,
    so no padding or masks are involved)."""
    out = []
    for s in seqs:
        logits = model(mx.array(s.ids[None, :-1]))[0, s.prompt_len - 1 :]  # [n_completion, V]
        lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        # argpartition then a sort of k columns: a full argsort of the vocabulary per position
        # cost more than the forward itself on the CPU.
        part = mx.argpartition(-lp, kth=k - 1, axis=-1)[:, :k]
        pv = mx.take_along_axis(lp, part, axis=-1)
        order = mx.argsort(-pv, axis=-1)
        idx = mx.take_along_axis(part, order, axis=-1)
        val = mx.take_along_axis(pv, order, axis=-1)
        out.append(
            Sequence(
                s.instr_id,
                s.prompt_len,
                s.ids,
                np.array(idx, np.int32),
                np.array(val.astype(mx.float32)).astype(np.float16),
            )
        )
    return out


def sidecar_path(shard: Path) -> Path:
    """Where top-k computed here for a shard that lacks them is kept: topk-NNNNN.npz beside it."""
    return shard.with_name(shard.name.replace("shard-", "topk-"))


def load_with_topk(data_dir: Path, model: nn.Module | None, k: int = 16) -> list[Sequence]:
    """Every sequence of the data, with the teacher's top-k (from the shard, a sidecar, or
    computed now with `model` and saved as a sidecar so a resumed run does not redo it)."""

    seqs: list[Sequence] = []
    for shard in shard_paths(data_dir):
        part = read_shard(shard)
        if part and part[0].topk_ids is None:
            side = sidecar_path(shard)
            if side.exists():
                with np.load(side) as z:
                    part = _attach(part, z["topk_ids"], z["topk_logprobs"])
            elif model is None:
                raise ConfigError(f"{shard} has no teacher top-k; a target is needed to add them")
            else:
                part = teacher_topk(model, part, k)
                _save_sidecar(side, part)
        seqs.extend(part)
    return seqs


def _attach(part: list[Sequence], ids: np.ndarray, lps: np.ndarray) -> list[Sequence]:
    out, c = [], 0
    for s in part:
        n = s.n_completion
        out.append(Sequence(s.instr_id, s.prompt_len, s.ids, ids[c : c + n], lps[c : c + n]))
        c += n
    return out


def _save_sidecar(path: Path, part: list[Sequence]) -> None:
    import io

    buf = io.BytesIO()
    np.savez(
        buf,
        topk_ids=np.concatenate([s.topk_ids for s in part]),  # type: ignore[misc]
        topk_logprobs=np.concatenate([s.topk_logprobs for s in part]),  # type: ignore[misc]
    )
    atomic_write_bytes(path, buf.getvalue())
