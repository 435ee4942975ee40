"""Plain decoding and the default method on the embedded pair, interleaved prompt by prompt in one
process, with the wall time of every round by kind (a draft model's round, a lookup's, a plain
step): a before / after check of the loop that reads the rounds themselves, not only a bench's
tokens per second. Run it from each checkout with PYTHONPATH pointing there and compare.

    PYTHONPATH=/path/to/checkout python -m research.measure.round_timeline --reps 1

Prints tokens, seconds and tokens/s per method (decode only: first token to last), their ratio,
then per round kind: rounds, ms per round, tokens committed, ms per token and share of the
default method's decode time. The first pass over the prompts is a warm-up and is not counted.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.events import Round, Token
from edgespec.runtime import Engine

PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "What is the capital of Australia, and why was it chosen over Sydney and Melbourne?",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Summarize the plot of Romeo and Juliet in five sentences.",
)
METHODS = ("none", "hybrid")  # plain decoding; the default (hybrid drafting, adaptive K)


def kind(r: Round) -> str:
    if r.drafted == 0:
        return "plain step"
    return "draft model" if r.method == "draft" else "lookup"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=1, help="counted passes over the prompts")
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    engine = Engine.load()
    seconds: dict[str, float] = defaultdict(float)
    tokens: dict[str, int] = defaultdict(int)
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0])
    for rep in range(args.reps + 1):
        for prompt in PROMPTS:
            for method in METHODS:
                spec = SpecConfig(method=method, adaptive=True)
                config = GenerationConfig(
                    sampling=SamplingConfig(temperature=0.0), spec=spec, max_tokens=args.max_tokens
                )
                engine.reset()
                times: list[float] = []
                rounds: list[tuple[Round, float]] = []
                last_round = None
                for event in engine.chat([{"role": "user", "content": prompt}], config):
                    now = time.perf_counter()
                    if isinstance(event, Token):
                        times.append(now)
                    elif isinstance(event, Round):
                        rounds.append((event, now - (last_round or now)))
                        last_round = now
                if rep == 0:
                    continue  # warm-up
                seconds[method] += times[-1] - times[0]
                tokens[method] += len(times) - 1
                for r, dt in rounds[1:]:
                    row = by_kind[f"{method}: {kind(r)}"]
                    row[0] += 1
                    row[1] += dt
                    row[2] += r.accepted + 1
    for method in METHODS:
        rate = tokens[method] / seconds[method]
        print(f"{method}: {tokens[method]} tokens in {seconds[method]:.2f} s, {rate:.1f} tok/s")
    plain, spec = (tokens[m] / seconds[m] for m in METHODS)
    print(f"default / plain: {spec / plain:.3f}")
    for name, (n, t, committed) in sorted(by_kind.items()):
        print(
            f"{name:20s} rounds {int(n):5d}  ms/round {1e3 * t / n:6.2f}  tokens {int(committed):5d}"
            f"  ms/token {1e3 * t / committed:6.2f}  share {t / seconds['hybrid']:5.2f}"
        )


if __name__ == "__main__":
    main()
