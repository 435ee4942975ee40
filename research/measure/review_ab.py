"""Adaptive K with reviews (edgespec/acceptance.py (reviews): the draft's acceptance read from plain
steps while it is off, no probe rounds) against the policy with probes (before 2026-11-29's
third session), paired in one process on the embedded
pair: per prompt and seed, plain decoding, the default with probes and the default with
reviews, interleaved (order alternating by seed); long prompts are prefilled once and reused
(the engine keeps the prompt's cache).

    python -m research.measure.review_ab --short 4 --context 8k --kinds doc,code,chat \\
        --temp 0.7 --seeds 4

Prints every run (decode tok/s, tokens, its ratio over the same seed's plain run, rounds by
kind: the draft model's, lookups', plain steps'; reviews read), per prompt the two defaults'
decode rate over plain's (sums over the seeds), the geometric means and each one's worst run.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from edgespec.acceptance import Review
from edgespec.drafting.adaptive import AdaptiveK
from edgespec.runtime import Engine
from research.measure.paired import generate, prompt_args, prompt_set

VARIANTS = ("plain", "probes", "reviews")
REVIEW_ON, FOLD = AdaptiveK.review_on, AdaptiveK.review
READ: list[int] = [0]  # reviews read in the current run
DECIDE = AdaptiveK.decide
POLICY: list[AdaptiveK] = []  # the current run's policy


def _counted(self: AdaptiveK, r: Review) -> None:
    READ[0] += 1
    FOLD(self, r)


def _deciding(self: AdaptiveK) -> int:
    POLICY[:] = [self]
    return DECIDE(self)


def costs() -> str:
    """The run's final draft cost c and plain step v(1) (ms; '-' where never timed)."""
    if not POLICY:
        return ""
    est, v = POLICY[0].estimates.get("draft"), POLICY[0].verify_means
    c = est.draft_cost if est is not None else None
    ms = ["-" if x is None else f"{1e3 * x:.1f}" for x in (c, v.get(1), v.get(2))]
    return f"  c {ms[0]} v(1) {ms[1]} v(2) {ms[2]} ms"


def use(variant: str) -> None:
    """Set the policy a variant runs: "probes" never turns reviews on."""
    AdaptiveK.review_on = (lambda self: None) if variant == "probes" else REVIEW_ON  # type: ignore[method-assign]
    AdaptiveK.review = _counted  # type: ignore[method-assign]
    AdaptiveK.decide = _deciding  # type: ignore[method-assign]


def run(engine: Engine, ids: list[int], variant: str, temp: float, seed: int, max_tokens: int):
    """(decode seconds, tokens after the first, draft model rounds, lookup rounds, plain rounds,
    reviews read) of one run."""
    use(variant)
    READ[0], POLICY[:] = 0, []
    times, rounds = generate(engine, ids, variant != "plain", temp, seed, max_tokens)
    model = sum(r.drafted > 0 and r.method != "ngram" for r in rounds)
    lookups = sum(r.drafted > 0 and r.method == "ngram" for r in rounds)
    plain = len(rounds) - model - lookups
    return times[-1] - times[0], len(times) - 1, model, lookups, plain, READ[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    prompt_args(ap, "doc,code,chat")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args()
    engine = Engine.load()
    prompts = prompt_set(engine, args)
    run(engine, prompts[0][1], "reviews", args.temp, 0, 16)  # warm-up (and compiles)
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    worst: dict[str, tuple[float, str]] = {}
    for label, ids in prompts:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            order = VARIANTS if seed % 2 == 0 else tuple(reversed(VARIANTS))
            rates = {}
            for variant in order:
                seconds, tokens, model, lookups, plain, read = run(
                    engine, ids, variant, args.temp, seed, args.max_tokens
                )
                totals[(label, variant)][0] += seconds
                totals[(label, variant)][1] += tokens
                rates[variant] = tokens / seconds
                print(
                    f"{label:8s} seed {seed} {variant:7s} {rates[variant]:6.2f} tok/s"
                    f"  tokens {tokens + 1:4d}  rounds: draft {model:3d} lookup {lookups:3d}"
                    f" plain {plain:3d}  reviews {read:3d}{costs()}",
                    flush=True,
                )
            for v in VARIANTS[1:]:
                ratio = rates[v] / rates["plain"]
                print(f"{label:8s} seed {seed} {v:7s} {ratio:.3f}x plain", flush=True)
                if v not in worst or ratio < worst[v][0]:
                    worst[v] = (ratio, f"{label} seed {seed}")
    use("reviews")
    ratios: dict[str, list[float]] = defaultdict(list)
    for label, _ in prompts:
        rate = {v: totals[(label, v)][1] / totals[(label, v)][0] for v in VARIANTS}
        for v in VARIANTS[1:]:
            ratios[v].append(rate[v] / rate["plain"])
        print(
            f"{label:8s} plain {rate['plain']:6.2f} tok/s  probes {ratios['probes'][-1]:.3f}x"
            f"  reviews {ratios['reviews'][-1]:.3f}x"
        )
    print(
        "geometric mean of per-prompt ratios: "
        + "  ".join(f"{v} {statistics.geometric_mean(r):.3f}x" for v, r in ratios.items())
    )
    print("worst single run: " + "  ".join(f"{v} {r:.3f}x ({w})" for v, (r, w) in worst.items()))


if __name__ == "__main__":
    main()
