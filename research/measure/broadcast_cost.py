"""What drafting on rank 0 alone would cost: broadcasting a round's proposal to the other ranks.

EdgeSpec runs the (small, whole) draft on every rank, so that every rank has the proposal and its
q rows without a message. The alternative, rank 0 drafting and broadcasting, needs per round an
all_sum of the K drafted tokens (greedy) and, at T > 0, of the K x V draft distributions q that
the ratio test reads. This times both on the group it is launched into, next to one step of the
draft on this rank:

    mlx.launch --backend ring -n 2 -- python -m research.measure.broadcast_cost [PAIR] [K]
"""

from __future__ import annotations

import statistics
import sys
import time

import mlx.core as mx

from edgespec.architectures.token_draft import reduced_head
from edgespec.cache import KVState
from edgespec.distributed.group import init_group
from edgespec.loading.load import load_pair


def median_ms(fn, repeats: int = 30) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main(pair: str = "smollm2-135m", k: str = "4") -> None:
    group = init_group()
    if group is None:
        raise SystemExit("run me under mlx.launch")
    kk = int(k)
    _, loaded = load_pair(pair=pair)  # every rank: the pair's whole draft (and target)
    assert loaded is not None
    model = loaded.model
    state = KVState(model, "draft")
    head_only = reduced_head(model) is not None
    context = list(range(100, 164))
    state.prefill(context)
    vocab = 49152

    def step() -> None:
        mx.eval(state.forward(mx.array(context[-1:], dtype=mx.int32), head_only=head_only))
        state.rewind(context, len(context) - 1)

    tokens = mx.zeros((kk,), dtype=mx.int32)
    q = mx.zeros((kk, vocab), dtype=mx.float32)
    figures = {
        "draft step (ms)": median_ms(step),
        f"all_sum of {kk} token ids (ms)": median_ms(
            lambda: mx.eval(mx.distributed.all_sum(tokens, group=group.group))
        ),
        f"all_sum of {kk} x {vocab} q rows (ms)": median_ms(
            lambda: mx.eval(mx.distributed.all_sum(q, group=group.group))
        ),
    }
    if group.is_primary:
        print(f"ranks {group.size}, backend {group.backend}")
        for name, value in figures.items():
            print(f"{name:40s} {value:8.3f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
