"""A rank of a sampling run for tests/distributed/test_distributed.py, started by mlx.launch (one
process per rank): the tiny pair with its target sharded over the group, SAMPLES generations at
temperature 1 (one seed each, K=2, two new tokens), through the real Engine and loop. Rank 0 writes
{"ids": [[x1, x2], ...]} to OUT.

    mlx.launch --backend ring -n 2 -- python tests/helpers/dist_sample.py TARGET DRAFT OUT SAMPLES
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.distributed.group import init_group
from edgespec.events import Token
from edgespec.runtime import Engine

PROMPT = "the cat and the dog"


def samples(engine: Engine, seeds: range, k: int = 2, tokens: int = 2) -> list[list[int]]:
    """Generations of `tokens` tokens, one per seed; the prompt's cache is reused."""
    ids = engine.encode_raw(PROMPT)
    out = []
    for seed in seeds:
        config = GenerationConfig(
            SamplingConfig(temperature=1.0, seed=seed),
            SpecConfig(k=k, method="draft", adaptive=False),
            max_tokens=tokens,
        )
        out.append([e.id for e in engine.generate(ids, config) if isinstance(e, Token)])
    return out


def main(target: str, draft: str, out: str, count: str) -> int:
    group = init_group()
    engine = Engine.load(target, draft, draft_bits=0, group=group)
    ids = samples(engine, range(int(count)))
    if group is None or group.is_primary:
        Path(out).write_text(json.dumps({"ids": ids, "size": group.size if group else 1}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
