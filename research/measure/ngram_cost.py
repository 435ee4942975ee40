"""Prompt lookup's cost per token at long contexts: the n-gram index (edgespec/drafting/ngram.py)
over this repository's docs/ (real text, the embedded target's tokenizer), grown token by token
as a generation grows its context, one lookup per token; the median of 2,000 tokens' (extend +
lookup) after N tokens were indexed, per N.

    python -m research.measure.ngram_cost 1024 8192 32768
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from edgespec.drafting.ngram import NgramDrafter
from edgespec.loading.load import load_pair

DOCS = Path(__file__).resolve().parents[2] / "docs"
TOKENS = 2_000


def main() -> None:
    lengths = [int(n) for n in sys.argv[1:]] or [1024, 32768]
    target, _ = load_pair(with_draft=False)
    text = "\n\n".join(p.read_text() for p in sorted(DOCS.glob("*.md")))
    ids = [int(t) for t in target.tokenizer.encode(text)]
    while len(ids) < max(lengths) + TOKENS:
        ids += ids  # past the docs' length the text repeats (more matches, not fewer)
    for n in lengths:
        drafter = NgramDrafter(1, 8)
        context = ids[:n]
        drafter.propose(context, 4)
        times, hits = [], 0
        for t in ids[n : n + TOKENS]:
            context.append(t)
            t0 = time.perf_counter()
            prop = drafter.propose(context, 4)
            times.append(time.perf_counter() - t0)
            hits += prop.size > 0
        print(
            f"context {n}: {statistics.median(times) * 1e6:.1f} us per token (median), "
            f"{statistics.mean(times) * 1e6:.1f} mean; lookups that matched {hits / TOKENS:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
