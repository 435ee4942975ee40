"""Plain decoding and the default (adaptive hybrid) of one checkout, in one process, through the
library (no warm-up, so no calibration): the built-in prompts' first of each category, T = 0,
alternated per prompt, pooled tokens/s. One JSON line. Run it from each checkout to compare
(PYTHONPATH at the checkout; the BLAS the `edgespec` command would preload, `blas.plan()`):

    python -m research.measure.default_ab [--tokens 64] [--repeats 2] [--no-price-check]

--no-price-check switches adaptive K's price check off (drafting/adaptive.py, PRICE_STEPS), to
measure what it costs (docs/measurements/2026-12-06-house.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from edgespec import blas


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-price-check", action="store_true")
    args = ap.parse_args()
    blas.reexec_with_blas(sys.argv[1:], module="research.measure.default_ab")
    from edgespec.bench.prompts import load_prompts
    from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
    from edgespec.drafting import adaptive
    from edgespec.drafting.base import PLAIN_ONLY
    from edgespec.events import Round, Token
    from edgespec.runtime import Engine

    if args.no_price_check:
        adaptive.AdaptiveK._price_check = lambda self, method: False  # type: ignore[method-assign]
    engine = Engine.load()
    prompts = load_prompts(None, limit=1)
    config = GenerationConfig(SamplingConfig(temperature=0.0), SpecConfig(), args.tokens)

    def run(text: str, plain: bool) -> tuple[int, float, int]:
        engine.reset()
        extra = {"k_policy": adaptive.FixedK(PLAIN_ONLY)} if plain else {}
        tokens = rounds = 0
        start = time.perf_counter()
        ids = engine.encode_chat([{"role": "user", "content": text}])
        for event in engine.generate(ids, config, **extra):
            tokens += isinstance(event, Token)
            rounds += isinstance(event, Round)
        return tokens, time.perf_counter() - start, rounds

    for plain in (True, False):  # compiles
        run("Hello there", plain)
    total = {"plain": [0, 0.0, 0], "default": [0, 0.0, 0]}
    for rep in range(args.repeats):
        for p in prompts:
            order = ("plain", "default") if rep % 2 == 0 else ("default", "plain")
            for name in order:
                for i, x in enumerate(run(p.text, name == "plain")):
                    total[name][i] += x
    rate = {k: n / s for k, (n, s, _) in total.items()}
    n, _, r = total["default"]
    out = {"plain": rate["plain"], "default": rate["default"], "tau": n / r}
    out["speedup"] = rate["default"] / rate["plain"]
    out["price_check"] = not args.no_price_check
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}))


if __name__ == "__main__":
    main()
