"""What a target forward of L tokens costs at a long context, against a one-token step there: the
embedded target's KV cache filled with N positions of random keys and values (no prefill, so an
8K point takes seconds), then forwards of L tokens timed at that offset, the cache put back
after each. Verify cost in plain steps, v(L) = time(L) / time(1), is what adaptive K prices.

    python -m research.measure.verify_cost --contexts 1024,4096,8192 --lengths 1,2,3,5,8

With EDGESPEC_CPU_OPT=-grouped_attention the 2..32-token forwards take MLX's own attention instead of
edgespec/cpu/attention.py's grouped path; with EDGESPEC_CPU_OPT=-fused_attention the rows that see
1,024 keys or more take MLX's products and NumPy's softmax instead of the fused kernel. Prints one line per context: milliseconds per forward
(median of --reps after one warm-up) and, in brackets, in one-token steps.
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx

from edgespec.runtime import Engine


def fill(state, n: int) -> None:
    """Every cache layer of `state` holds n positions of random keys and values."""
    args = state.model.args
    heads, dim = args.num_key_value_heads, args.hidden_size // args.num_attention_heads
    room = (n // 256 + 2) * 256
    for layer in state.cache:
        layer.keys = mx.random.normal((1, heads, room, dim)) * 0.5
        layer.values = mx.random.normal((1, heads, room, dim)) * 0.5
        layer.offset = n
    mx.eval([layer.keys for layer in state.cache] + [layer.values for layer in state.cache])
    state.tokens = [1] * n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", default="1024,4096,8192")
    ap.add_argument("--lengths", default="1,2,3,5,8")
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    contexts = [int(x) for x in args.contexts.split(",")]
    lengths = [int(x) for x in args.lengths.split(",")]
    state = Engine.load(with_draft=False)._target
    for n in contexts:
        state.reset()
        fill(state, n)
        row = []
        for length in lengths:
            times = []
            for _ in range(args.reps + 1):
                inputs = mx.array([5] * length, dtype=mx.int32)
                t0 = time.perf_counter()
                mx.eval(state.forward(inputs))
                times.append(time.perf_counter() - t0)
                for layer in state.cache:
                    layer.offset = n
            row.append(statistics.median(times[1:]))
        cells = (
            f"L{L} {1e3 * t:6.1f} ms ({t / row[0]:.2f})" for L, t in zip(lengths, row, strict=True)
        )
        print(f"N {n:6d}: " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
