"""One long prompt's rounds by who drafted them: the default method (hybrid drafting, adaptive K)
on a built-in long-context prompt, two seeds, the second reusing the prefilled prompt; per seed
the decode rate, rounds by (method, drafted), and per method the drafted and accepted tokens and
the verify's milliseconds a round, then the first 80 rounds as method/drafted/accepted.

    python -m research.measure.rounds_by_method chat 8000 0.7
"""

from __future__ import annotations

import sys
import time
from collections import Counter

from edgespec.bench.context import build_prompts
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.events import Round, Token
from edgespec.runtime import Engine


def main() -> None:
    kind, length, temp = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    engine = Engine.load()
    ids = list(build_prompts([kind], [length], engine.encode_chat)[0].ids)
    for seed in (0, 1):
        sampling = SamplingConfig(temperature=temp, seed=seed)
        spec = SpecConfig(method="hybrid", adaptive=True)
        config = GenerationConfig(sampling=sampling, spec=spec, max_tokens=128)
        t0 = time.perf_counter()
        rounds, times = [], []
        for event in engine.generate(ids, config):
            if isinstance(event, Token):
                times.append(time.perf_counter())
            elif isinstance(event, Round):
                rounds.append(event)
        rate = (len(times) - 1) / (times[-1] - times[0])
        print(f"seed {seed} TTFT {times[0] - t0:.1f}s decode {rate:.2f} tok/s rounds {len(rounds)}")
        print(
            "  by (method, drafted):",
            dict(sorted(Counter((r.method, r.drafted) for r in rounds).items())),
        )
        for method in sorted({r.method for r in rounds}):
            mine = [r for r in rounds if r.method == method]
            drafted, accepted = sum(r.drafted for r in mine), sum(r.accepted for r in mine)
            verify = 1e3 * sum(r.t_verify for r in mine) / len(mine)
            print(
                f"  {method}: rounds {len(mine)} drafted {drafted} accepted {accepted} verify ms/round {verify:.0f}"
            )
        print("  seq:", " ".join(f"{r.method[0]}{r.drafted}/{r.accepted}" for r in rounds[:80]))


if __name__ == "__main__":
    main()
