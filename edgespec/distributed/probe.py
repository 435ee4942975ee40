"""Latencies of a sharded target, for the bench's results.json: one target forward of L tokens, and
one small all-reduce on its own (what each of a tensor-parallel forward's 2 x layers all-reduces
costs beyond its arithmetic). Every rank must call `probe` at the same point: the forwards and
the all-reduces are collective.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import mlx.core as mx

from edgespec.cache import KVState
from edgespec.distributed.group import Group

CONTEXT = 64  # cached positions before the timed forwards (a short answer's worth)


@dataclass(frozen=True)
class Latency:
    """What one rank measured. forward_ms: {L: median ms of a forward over L new tokens};
    all_sum_us: median microseconds of an all_sum of one hidden vector; collectives: collective
    operations per target forward (tensor parallel: 2 per layer; pipeline: its sends plus one
    all_gather)."""

    group_size: int
    backend: str
    shard: str | None
    collectives: int
    all_sum_us: float
    forward_ms: dict[int, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def collectives_per_forward(model: Any, shard: str | None) -> int:
    """Collective operations one forward runs on this rank: every sharded-to-all layer ends in an
    all_sum; a pipeline stage sends and/or receives once and all_gathers once."""
    if shard == "pipeline":
        inner = model.model
        rank, size = inner.pipeline_rank, inner.pipeline_size
        return int(rank < size - 1) + int(rank != 0) + int(size > 1)
    return sum(1 for _, m in model.named_modules() if "ShardedToAll" in type(m).__name__)


def _median_ms(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000.0 * statistics.median(times)


def probe(
    model: Any,
    group: Group | None,
    shard: str | None,
    lengths: tuple[int, ...] = (1,),
    repeats: int = 10,
) -> Latency:
    """Time forwards of each length in `lengths` over a CONTEXT-token cache (after one untimed
    forward of each), and a lone all_sum of a hidden-sized vector (median of 5 x repeats; 0 for
    a lone process, group None)."""
    state = KVState(model, "probe")
    context = [(7 * i) % 97 + 3 for i in range(CONTEXT + 1)]
    state.prefill(context)

    def forward(length: int) -> None:
        inputs = mx.array(context[-1:] + [5] * (length - 1), dtype=mx.int32)
        mx.eval(state.forward(inputs))
        state.rewind(context, CONTEXT)

    forward_ms = {}
    for length in lengths:
        forward(length)
        forward_ms[length] = round(_median_ms(lambda n=length: forward(n), repeats), 3)
    size = group.size if group is not None else 1
    all_sum_ms = 0.0
    if group is not None:
        hidden = int(getattr(getattr(model, "args", None), "hidden_size", 0) or 1024)
        vector = mx.zeros((hidden,), dtype=mx.float32)

        def all_sum() -> None:
            mx.eval(mx.distributed.all_sum(vector, group=group.group))

        all_sum()
        all_sum_ms = _median_ms(all_sum, 5 * repeats)
    return Latency(
        group_size=size,
        backend=group.backend if group is not None else "none",
        shard=shard if size > 1 else None,
        collectives=collectives_per_forward(model, shard) if size > 1 else 0,
        all_sum_us=round(1000.0 * all_sum_ms, 1),
        forward_ms=forward_ms,
    )
