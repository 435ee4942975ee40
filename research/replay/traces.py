"""The recorded acceptance of research/replay/record.py, read back, and what a simulated round
accepts from it. Pure Python: no MLX, no model.

A Trace is one answer of the target (one prompt, one temperature); position i is a round that
starts with prompt + answer[:i] committed. At T > 0 each (position, depth) has one fixed uniform
(seeded by the trace's name), so every policy replayed on a trace meets the same luck.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

RECORDS = Path(__file__).resolve().parent / "records.json.gz"
DEPTH = 8  # drafted positions recorded per round at most
RANK_MISS = 4  # draft record at T = 0: the answer token is below the draft's 4th candidate


@dataclass(frozen=True)
class Trace:
    """One recorded answer: `draft[i]` the answer token's rank among the draft's candidates
    (T = 0) or beta in 1/255 (T > 0); `lookup[i]` = [match length, per-token flags or target
    probabilities in 1/255]; `block[i]` the block's agreeing rows (T = 0) or its rows' beta."""

    name: str
    temp: float
    context: int
    draft: list[int]
    lookup: list[list]
    block: list
    uniforms: list[list[float]] = field(default_factory=list, repr=False)

    @property
    def size(self) -> int:
        return len(self.draft)

    @property
    def greedy(self) -> bool:
        return self.temp == 0

    def passes(self, i: int, d: int, prob255: int) -> bool:
        """Whether the drafted token at depth d of a round at i passes: T = 0 a flag (1 / 0),
        T > 0 the fixed uniform below its probability."""
        if self.greedy:
            return prob255 > 0
        return self.uniforms[i][d] < prob255 / 255

    def chain(self, i: int, k: int) -> int:
        """Accepted drafts of a token-draft chain of k at i."""
        n = 0
        for d in range(min(k, self.size - i)):
            j = i + d
            ok = self.draft[j] == 0 if self.greedy else self.passes(i, d, self.draft[j])
            if not ok:
                break
            n += 1
        return n

    def rank(self, j: int) -> int:
        """The answer token's rank among the draft's candidates at j (T = 0 traces)."""
        return self.draft[j] if j < self.size else RANK_MISS

    def lookup_at(self, i: int, n_min: int) -> tuple[int, list[int]]:
        """(match length, its tokens' values) of the lookup at i; (0, []) below n_min."""
        n, vals = self.lookup[i]
        return (n, vals) if n >= n_min else (0, [])

    def accepted(self, i: int, vals: list[int]) -> int:
        """Accepted tokens of a proposal whose values (flags or probabilities) are `vals`."""
        n = 0
        for d, v in enumerate(vals[:DEPTH]):
            if not self.passes(i, d, v):
                break
            n += 1
        return n

    def block_accepted(self, i: int, k: int) -> int:
        """Accepted drafts of a block of k at i (the recorded block's first k rows)."""
        rec = self.block[i]
        if self.greedy:
            return min(rec, k)
        return self.accepted(i, rec[:k])


def load(path: Path = RECORDS) -> list[Trace]:
    """Every trace of a records file, uniforms drawn per trace."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    out = []
    for t in data["traces"]:
        rng = random.Random(f"{t['name']}/{t['temp']}/{t['seed']}")
        uniforms = [[rng.random() for _ in range(DEPTH)] for _ in range(len(t["draft"]))]
        out.append(
            Trace(t["name"], t["temp"], t["context"], t["draft"], t["lookup"], t["block"], uniforms)
        )
    return out
