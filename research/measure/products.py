"""The matrix products of a target forward by row count, on MLX's CPU backend and its BLAS: what a
verify of L tokens pays over a one-token step, outside the softmax. Two families, each over 30
layers of the embedded target's shapes, random float32 data, so the weights and keys stream
from memory as in a forward:

- `dense`: x [1, rows, 576] @ W.T for 60 weights of 1,536 x 576 (a forward's MLP up and gate
  projections), rows = tokens;
- `scores`: a layer's attention scores at N keys, rows = 3 query heads x tokens per KV head,
  as q K^T (EdgeSpec's grouped path) and as K q^T (the same scores, transposed).

    MKL_NUM_THREADS=1 taskset -c 0 python -m research.measure.products --keys 8192 --tokens 1,2,3,5

Milliseconds for all 30 layers, median of --reps, the variants interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

from edgespec.blas import reexec_with_blas

if __name__ == "__main__":
    reexec_with_blas(sys.argv[1:], module="research.measure.products")  # MKL, as `edgespec` runs

import mlx.core as mx  # noqa: E402

LAYERS, GROUPS, REPEATS, DIM, HIDDEN, WIDE = 30, 3, 3, 64, 576, 1536


def timed(fns: dict[str, Callable[[], None]], reps: int) -> dict[str, float]:
    """Median milliseconds of each function, the functions run in turn `reps` times."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(reps):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def variants(
    x: mx.array, q: mx.array, weights: list[mx.array], keys: list[mx.array]
) -> dict[str, Callable[[], None]]:
    """The timed products for one token count: x [1, rows, 576], q [1, 3, rows, 64]."""
    return {
        "dense": lambda: mx.eval([x @ w.T for w in weights]),
        "q K^T": lambda: mx.eval([q @ k.swapaxes(-1, -2) for k in keys]),
        "K q^T": lambda: mx.eval([k @ q.swapaxes(-1, -2) for k in keys]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=8192)
    parser.add_argument("--tokens", default="1,2,3,5,8")
    parser.add_argument("--reps", type=int, default=11)
    args = parser.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]

    weights = [mx.random.normal((WIDE, HIDDEN)) for _ in range(2 * LAYERS)]
    keys = [mx.random.normal((1, GROUPS, args.keys + 256, DIM)) for _ in range(LAYERS)]
    mx.eval(weights, keys)
    seen = [k[:, :, : args.keys] for k in keys]  # as a cache hands them out: a view of its buffer
    for n in tokens:
        x = mx.random.normal((1, n, HIDDEN))
        q = mx.random.normal((1, GROUPS, REPEATS * n, DIM))
        mx.eval(x, q)
        got = timed(variants(x, q, weights, seen), args.reps)
        cells = "  ".join(f"{name} {ms:6.1f}" for name, ms in got.items())
        print(f"tokens {n}: {cells}  (ms, {LAYERS} layers, {args.keys} keys)", flush=True)


if __name__ == "__main__":
    main()
