"""What a forward of L tokens costs a Gemma 3 270M-shaped target on the CPU backend, with the
twin's grouped attention (edgespec/cpu/heads.py, attention.py) and without it, interleaved in one
process: a random gemma3_text model built by mlx-lm (18 layers, hidden 640, 4 query heads over 1
KV head of 256, sliding window 512 on five layers of six, vocabulary --vocab), one cache filled
by a prefill of N tokens, then forwards of L tokens timed at that offset by each twin in turn,
the cache trimmed back after each.

    python -m research.measure.gemma3_verify --contexts 256,1024 --lengths 1,2,4

Twins: `grouped` (every rewrite, as EDGESPEC_CPU_OPT leaves them), `ungrouped` (the same
rewrites, MLX's attention: EDGESPEC_CPU_OPT=-grouped_attention), `mlx` (no rewrite:
EDGESPEC_CPU_OPT=0). Prints, per context and twin, ms per forward (the fastest of --reps, each
rep running every twin and length once: on a shared machine the fastest is the least disturbed)
and, in brackets, in one-token steps of that twin. Run it
with an optimised BLAS preloaded (docs/library.md); the first line names the one in use.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models import gemma3_text

from edgespec import blas
from edgespec.cpu.backend import CpuBackend, Switches

SHAPE = {  # google/gemma-3-270m's text config (config.json), vocabulary apart
    "model_type": "gemma3_text",
    "hidden_size": 640,
    "num_hidden_layers": 18,
    "intermediate_size": 2048,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
}


def model(vocab: int) -> gemma3_text.Model:
    """A random float32 gemma3_text model of SHAPE (small weights: finite activations)."""
    out = gemma3_text.Model(gemma3_text.ModelArgs.from_dict({**SHAPE, "vocab_size": vocab}))
    out.update(tree_map(lambda w: mx.random.normal(w.shape) * 0.02, out.parameters()))
    mx.eval(out.parameters())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", default="256,1024")
    ap.add_argument("--lengths", default="1,2,4")
    ap.add_argument("--vocab", type=int, default=262144)
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    contexts = [int(x) for x in args.contexts.split(",")]
    lengths = [int(x) for x in args.lengths.split(",")]
    print(f"BLAS {blas.active()}", flush=True)
    m = model(args.vocab)
    every = Switches.from_environment("1")
    backends = {
        "grouped": CpuBackend(every),
        "ungrouped": CpuBackend(
            dataclasses.replace(
                every, grouped_attention=False, numpy_softmax=False, fused_attention=False
            )
        ),
        "mlx": CpuBackend(Switches.from_environment("0")),
    }
    twins = {name: b.model(m) for name, b in backends.items()}
    for n in contexts:
        cache = backends["grouped"].new_cache(m)
        for start in range(0, n, 128):  # the hidden states only: no logits over the prompt
            ids = [(7 * i + 3) % args.vocab for i in range(start, min(n, start + 128))]
            mx.eval(m.model(mx.array([ids]), cache=cache))
        times: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.reps + 1):
            for name, fast in twins.items():
                for length in lengths:
                    inputs = mx.array([[5] * length])
                    t0 = time.perf_counter()
                    mx.eval(fast(inputs, cache=cache))
                    times.setdefault((name, length), []).append(time.perf_counter() - t0)
                    for layer in cache:
                        layer.trim(length)
        for name in twins:
            row = [min(times[(name, length)][1:]) for length in lengths]
            cells = (
                f"L{L} {1e3 * t:6.1f} ms ({t / row[0]:.2f})"
                for L, t in zip(lengths, row, strict=True)
            )
            print(f"N {n:5d} {name:9s}: " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
