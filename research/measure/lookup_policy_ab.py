"""A hybrid's lookups priced against plain steps (AdaptiveK.lookups_pay) or always on (the policy
before 2026-11-29), paired in one process on the embedded pair: per prompt and seed, plain
decoding, the default with lookups always on and the default as it is, interleaved; long
prompts are prefilled once and reused (the engine keeps the prompt's cache between runs).

    python -m research.measure.lookup_policy_ab --short 4 --context 4k,8k --kinds chat,code \\
        --temp 0.7 --seeds 3

Prints every run (decode tok/s, rounds, lookup rounds) and per prompt the two defaults' decode
rate over plain's (sums over the seeds), then over all prompts.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from edgespec.drafting.adaptive import AdaptiveK
from edgespec.runtime import Engine
from research.measure.paired import generate, prompt_args, prompt_set

PRICED = AdaptiveK.lookups_pay
VARIANTS = ("plain", "always", "priced")


def run(engine: Engine, ids: list[int], variant: str, temp: float, seed: int, max_tokens: int):
    """(decode seconds, tokens after the first, rounds, lookup rounds) of one generation."""
    AdaptiveK.lookups_pay = PRICED if variant == "priced" else (lambda self, method: True)  # type: ignore[method-assign]
    times, rounds = generate(engine, ids, variant != "plain", temp, seed, max_tokens)
    lookups = sum(r.method == "ngram" and r.drafted > 0 for r in rounds)
    return times[-1] - times[0], len(times) - 1, len(rounds), lookups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    prompt_args(ap, "chat,code")
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    engine = Engine.load()
    prompts = prompt_set(engine, args)
    run(engine, prompts[0][1], "priced", args.temp, 0, 16)  # warm-up (and compiles)
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for label, ids in prompts:
        for seed in range(args.seeds):
            order = VARIANTS if seed % 2 == 0 else tuple(reversed(VARIANTS))
            for variant in order:
                seconds, tokens, rounds, lookups = run(
                    engine, ids, variant, args.temp, seed, args.max_tokens
                )
                totals[(label, variant)][0] += seconds
                totals[(label, variant)][1] += tokens
                print(
                    f"{label:8s} seed {seed} {variant:6s} {tokens / seconds:6.2f} tok/s"
                    f"  rounds {rounds:3d}  lookup rounds {lookups:3d}",
                    flush=True,
                )
    AdaptiveK.lookups_pay = PRICED  # type: ignore[method-assign]
    ratios: dict[str, list[float]] = defaultdict(list)
    for label, _ in prompts:
        rate = {v: totals[(label, v)][1] / totals[(label, v)][0] for v in VARIANTS}
        for v in ("always", "priced"):
            ratios[v].append(rate[v] / rate["plain"])
        print(
            f"{label:8s} plain {rate['plain']:6.2f} tok/s  always {ratios['always'][-1]:.3f}x"
            f"  priced {ratios['priced'][-1]:.3f}x"
        )
    print(
        "geometric mean of per-prompt ratios: "
        + "  ".join(f"{v} {statistics.geometric_mean(r):.3f}x" for v, r in ratios.items())
    )


if __name__ == "__main__":
    main()
