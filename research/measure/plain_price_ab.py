"""Adaptive K with price checks and the slow upper bound (the policy since 2026-11-29) against
the policy before them, paired in one process on the embedded pair: per prompt and seed, plain
decoding, the default as it was ("before": a plain step priced from the shortest verify, the
switch-off tested at the fast estimate's upper bound) and the default as it is ("after"),
interleaved; long prompts are prefilled once and reused (the engine keeps the prompt's cache).

    python -m research.measure.plain_price_ab --short 4 --context 1k,8k --kinds doc,code,chat \\
        --temp 0.7 --seeds 3

Prints every run (decode tok/s, tokens, its ratio over the same seed's plain run, rounds by
kind: the draft model's, lookups', plain steps'), per prompt the two defaults' decode rate over plain's (sums over the seeds), the
geometric means and each default's worst single run.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections import defaultdict

from edgespec.bench.context import build_prompts, parse_lengths
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.drafting import adaptive
from edgespec.drafting.adaptive import DrafterEstimate
from edgespec.events import Round, Token
from edgespec.runtime import Engine
from research.measure.round_timeline import PROMPTS

VARIANTS = ("plain", "before", "after")
AFTER = (adaptive.PRICE_EDGE, DrafterEstimate.alpha_upper)


def _fast_upper(self: DrafterEstimate) -> float:
    """The bound before: the fast estimate (~10 rounds) plus one standard error."""
    a = self.alpha
    return min(1.0, a + math.sqrt(a * (1 - a) / self.trials))


def use(variant: str) -> None:
    """Set the policy a variant runs."""
    edge, upper = (0.0, property(_fast_upper)) if variant == "before" else AFTER
    adaptive.PRICE_EDGE = edge
    DrafterEstimate.alpha_upper = upper  # type: ignore[method-assign, assignment]


def run(engine: Engine, ids: list[int], variant: str, temp: float, seed: int, max_tokens: int):
    """(decode seconds, tokens after the first, draft model rounds, lookup rounds, plain rounds,
    the draft model's acceptance) of one run."""
    use(variant)
    spec = SpecConfig(method="none" if variant == "plain" else "hybrid", adaptive=True)
    sampling = SamplingConfig(temperature=temp, seed=seed)
    config = GenerationConfig(sampling=sampling, spec=spec, max_tokens=max_tokens)
    times, rounds = [], []
    for event in engine.generate(ids, config):
        if isinstance(event, Token):
            times.append(time.perf_counter())
        elif isinstance(event, Round):
            rounds.append(event)
    drafts = [r for r in rounds if r.drafted > 0 and r.method != "ngram"]
    model, lookups = len(drafts), sum(r.drafted > 0 and r.method == "ngram" for r in rounds)
    accepted = sum(r.accepted for r in drafts) / max(1, sum(r.drafted for r in drafts))
    plain = len(rounds) - model - lookups
    return times[-1] - times[0], len(times) - 1, model, lookups, plain, accepted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", type=int, default=4, help="how many short built-in prompts")
    ap.add_argument("--context", default="", help="long-context lengths, e.g. 1k,8k")
    ap.add_argument("--kinds", default="doc,code,chat")
    ap.add_argument("--temp", type=float, default=0.7)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args()
    engine = Engine.load()
    prompts = [
        (f"short{i}", engine.encode_chat([{"role": "user", "content": p}]))
        for i, p in enumerate(PROMPTS[: args.short])
    ]
    if args.context:
        for p in build_prompts(
            args.kinds.split(","), parse_lengths(args.context), engine.encode_chat
        ):
            prompts.append((f"{p.kind}@{p.length // 1000}k", list(p.ids)))
    run(engine, prompts[0][1], "after", args.temp, 0, 16)  # warm-up (and compiles)
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    worst: dict[str, tuple[float, str]] = {}
    for label, ids in prompts:
        for seed in range(args.seeds):
            order = VARIANTS if seed % 2 == 0 else tuple(reversed(VARIANTS))
            rates = {}
            for variant in order:
                seconds, tokens, model, lookups, plain, accepted = run(
                    engine, ids, variant, args.temp, seed, args.max_tokens
                )
                totals[(label, variant)][0] += seconds
                totals[(label, variant)][1] += tokens
                rates[variant] = tokens / seconds
                print(
                    f"{label:8s} seed {seed} {variant:6s} {rates[variant]:6.2f} tok/s"
                    f"  tokens {tokens + 1:4d}  rounds: draft {model:3d} lookup {lookups:3d}"
                    f" plain {plain:3d}  draft acceptance {accepted:.2f}",
                    flush=True,
                )
            for v in VARIANTS[1:]:
                ratio = rates[v] / rates["plain"]
                print(f"{label:8s} seed {seed} {v:6s} {ratio:.3f}x plain", flush=True)
                if v not in worst or ratio < worst[v][0]:
                    worst[v] = (ratio, f"{label} seed {seed}")
    use("after")
    ratios: dict[str, list[float]] = defaultdict(list)
    for label, _ in prompts:
        rate = {v: totals[(label, v)][1] / totals[(label, v)][0] for v in VARIANTS}
        for v in VARIANTS[1:]:
            ratios[v].append(rate[v] / rate["plain"])
        print(
            f"{label:8s} plain {rate['plain']:6.2f} tok/s  before {ratios['before'][-1]:.3f}x"
            f"  after {ratios['after'][-1]:.3f}x"
        )
    print(
        "geometric mean of per-prompt ratios: "
        + "  ".join(f"{v} {statistics.geometric_mean(r):.3f}x" for v, r in ratios.items())
    )
    print("worst single run: " + "  ".join(f"{v} {r:.3f}x ({w})" for v, (r, w) in worst.items()))


if __name__ == "__main__":
    main()
