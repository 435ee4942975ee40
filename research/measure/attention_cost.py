"""One attention layer of the embedded target's shape (9 query heads over 3 KV heads of 64) at a
long context, three ways: MLX's scaled_dot_product_attention (its CPU fallback), EdgeSpec's
grouped path (edgespec/cpu/attention.py, what verifies take on the CPU) and that path with the
softmax's exp replaced by the Cephes exp of edgespec/cpu/fastexp.py (compiled). Keys and values
are random; milliseconds per layer, median of --reps after three warm-ups.

    python -m research.measure.attention_cost --contexts 1024,2048,4096,8192 --lengths 1,2,5,8,32

The last column is the largest difference between the grouped path's output and the fast-exp
variant's (float32 rounding; the variant is not used by EdgeSpec, it is the experiment).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import mlx.core as mx

from edgespec.cpu.attention import Masks, grouped_attention
from edgespec.cpu.fastexp import exp_nonpositive

GROUPS, REPEATS, DIM, SCALE = 3, 3, 64, 0.125


@mx.compile
def fast_softmax(scores: mx.array) -> mx.array:
    e = exp_nonpositive(scores - mx.max(scores, axis=-1, keepdims=True))
    return e / mx.sum(e, axis=-1, keepdims=True)


def fast_grouped(q: mx.array, k: mx.array, v: mx.array, masks: Masks) -> mx.array:
    """grouped_attention with fast_softmax in place of MLX's precise softmax."""
    b, h, length, d = q.shape
    s = k.shape[2]
    rows = (q * SCALE).reshape(b, GROUPS, REPEATS * length, d)
    scores = rows @ k.swapaxes(-1, -2)
    if length > 1:
        shape = (b, GROUPS, REPEATS, length, s)
        allowed, blocked = masks.causal(shape, scores.dtype)
        scores = mx.where(allowed, scores.reshape(shape), blocked)
        scores = scores.reshape(b, GROUPS, REPEATS * length, s)
    return (fast_softmax(scores) @ v).reshape(b, h, length, d)


def ms(f: Callable[[], mx.array], reps: int) -> float:
    times = []
    for _ in range(reps + 3):
        t0 = time.perf_counter()
        mx.eval(f())
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times[3:])


def cell(q: mx.array, keys: mx.array, values: mx.array, reps: int) -> str:
    """One (context, length) point: the three ways' ms per layer and their largest difference."""
    length = q.shape[2]
    mask = "causal" if length > 1 else None
    a, b = Masks(), Masks()
    mlx_ms = ms(
        lambda: mx.fast.scaled_dot_product_attention(q, keys, values, scale=SCALE, mask=mask), reps
    )
    grouped_ms = ms(lambda: grouped_attention(q, keys, values, SCALE, True, a), reps)
    fast_ms = ms(lambda: fast_grouped(q, keys, values, b), reps)
    diff = mx.abs(
        grouped_attention(q, keys, values, SCALE, True, a) - fast_grouped(q, keys, values, b)
    )
    return (
        f"L{length}: mlx {mlx_ms:.2f} grouped {grouped_ms:.2f} fast-exp {fast_ms:.2f}"
        f" ({diff.max().item():.0e})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", default="1024,2048,4096,8192")
    ap.add_argument("--lengths", default="1,2,5,8,32")
    ap.add_argument("--reps", type=int, default=18)
    args = ap.parse_args()
    for s in (int(x) for x in args.contexts.split(",")):
        keys = mx.random.normal((1, GROUPS, s + 256, DIM))[:, :, :s]  # a cache's slice, as used
        values = mx.random.normal((1, GROUPS, s + 256, DIM))[:, :, :s]
        cells = []
        for length in (int(x) for x in args.lengths.split(",")):
            q = mx.random.normal((1, GROUPS * REPEATS, length, DIM))
            mx.eval(q, keys, values)
            cells.append(cell(q, keys, values, args.reps))
        print(f"S {s}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
