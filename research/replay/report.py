"""The replay's table: for every profile (research/replay/profiles.py) and drafting method, the
real policy's tokens/s against plain decoding and against the best fixed choice in hindsight
(the best K, block length or tree shape over the same traces), pooled over the recorded traces of
one temperature (total tokens over total time).

    python -m research.replay.report                       # every profile, a Markdown table
    python -m research.replay.report --hardware m1m2 --costs 0.3 --contexts 8192

No clock, no model: the numbers are a replay's, for checking the policies against machines the
project cannot run, never a speed anyone measured.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from research.replay import batch, chains, trees
from research.replay.profiles import CONTEXTS, DRAFT_COSTS, HARDWARE, Profile, profiles
from research.replay.traces import RECORDS, Trace, load

CHAIN_CHOICES = {m: range(1, chains.K_MAX + 1) for m in chains.METHODS}
CHAIN_CHOICES["block"] = range(1, chains.BLOCK_MAX + 1)


@dataclass(frozen=True)
class Cell:
    """One method at one temperature under one profile: rates in tokens per plain 1K step."""

    method: str
    temp: float
    policy: float
    plain: float
    best: float
    best_choice: str
    worst_trace: float  # the lowest policy / plain over single traces

    @property
    def vs_plain(self) -> float:
        return self.policy / self.plain

    @property
    def vs_best(self) -> float:
        return self.policy / self.best


def pooled(outcomes: Iterable[chains.Outcome]) -> float:
    outs = list(outcomes)
    return sum(o.tokens for o in outs) / sum(o.seconds for o in outs)


def cell(
    method: str,
    temp: float,
    group: list[Trace],
    profile: Profile,
    run: Callable[[Trace, object], chains.Outcome],
    policy: Callable[[], object],
    fixed: Mapping[str, Callable[[], object]],
) -> Cell:
    """The policy, plain decoding and every fixed choice over `group`."""
    plain = [chains.plain(t, profile) for t in group]
    mine = [run(t, policy()) for t in group]
    rates = {name: pooled(run(t, make()) for t in group) for name, make in fixed.items()}
    rates["plain"] = pooled(plain)  # K = 0 every round is a fixed choice too
    best = max(rates, key=lambda n: rates[n])
    worst = min(m.rate / p.rate for m, p in zip(mine, plain, strict=True))
    return Cell(method, temp, pooled(mine), pooled(plain), rates[best], best, worst)


def cells(
    traces: list[Trace], profile: Profile, methods: Iterable[str], seeded: bool = False
) -> list[Cell]:
    """Every method at every recorded temperature (trees, the batch: T = 0 only); `seeded`:
    the chain and tree policies calibrated first (chains.adaptive, trees.seeded), as the chat
    app, the server and the bench run them."""
    out = []
    for temp in sorted({t.temp for t in traces}):
        group = [t for t in traces if t.temp == temp]
        for m in methods:
            if m in ("tree", "tree-fallback"):
                if temp != 0:
                    continue
                seed = profile if seeded else None
                make = partial(trees.adaptive if m == "tree" else trees.fallback, seed)
                fixed: dict[str, Callable[[], object]] = {
                    shape_name(s): partial(trees.Fixed, s) for s in trees.shapes()
                }
                out.append(cell(m, temp, group, profile, lambda t, p: trees.replay(t, profile, p),
                                make, fixed))  # fmt: skip
                continue
            if m == "batch":
                if temp == 0:
                    out.append(batch_cell(traces, profile))
                continue
            fixed = {f"K={k}": partial(chains.fixed, k) for k in CHAIN_CHOICES[m]}
            seed = profile if seeded else None
            run = partial(_chain_run, profile=profile, method=m)
            out.append(cell(m, temp, group, profile, run, partial(chains.adaptive, m, seed), fixed))
    return out


def batch_cell(traces: list[Trace], profile: Profile) -> Cell:
    """The server's batch mode with 4 requests (research/replay/batch.py) over the T = 0 traces:
    against all stepping plainly and against the best of its alternatives in hindsight."""
    group = [t for t in traces if t.temp == 0]
    rates = {
        name: batch.replay(group, profile, policy, mode=mode()).rate
        for name, (policy, mode) in batch.variants(profile).items()
    }
    mine = rates.pop("batch mode")
    best = max(rates, key=lambda n: rates[n])
    return Cell("batch of 4", 0.0, mine, rates["plain"], rates[best], best, mine / rates["plain"])


def _chain_run(trace: Trace, policy: object, profile: Profile, method: str) -> chains.Outcome:
    return chains.replay(trace, profile, method, policy)


def shape_name(shape) -> str:
    if all(len(p) == i + 1 and not any(p) for i, p in enumerate(shape.paths)):
        return f"chain {shape.size}"
    widths = [sum(1 for p in shape.paths if len(p) == d) for d in range(1, shape.depth + 1)]
    return "tree " + ",".join(map(str, widths))


def table(rows: list[tuple[Profile, list[Cell]]]) -> str:
    """Markdown: one row per profile, a cell per method and temperature: policy / plain and
    policy / best fixed (the best choice)."""
    heads = [f"{c.method} T={c.temp:g}" for c in rows[0][1]]
    lines = ["| profile | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for profile, cs in rows:
        vals = [f"{c.vs_plain:.2f} / {c.vs_best:.2f} ({c.best_choice})" for c in cs]
        lines.append(f"| {profile.name} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def summary(rows: list[tuple[Profile, list[Cell]]]) -> str:
    """The worst ratios, and every cell below a goal (policy < 1.0x plain, < 0.95x best)."""
    every = [(p, c) for p, cs in rows for c in cs]
    lo_plain = min(every, key=lambda pc: pc[1].vs_plain)
    lo_best = min(every, key=lambda pc: pc[1].vs_best)
    lines = [
        f"worst policy / plain: {lo_plain[1].vs_plain:.3f} ({lo_plain[0].name}, "
        f"{lo_plain[1].method} T={lo_plain[1].temp:g})",
        f"worst policy / best fixed: {lo_best[1].vs_best:.3f} ({lo_best[0].name}, "
        f"{lo_best[1].method} T={lo_best[1].temp:g}, best {lo_best[1].best_choice})",
    ]
    for p, c in every:
        if c.vs_plain < 1.0 or c.vs_best < 0.95:
            lines.append(f"  below a goal: {p.name} {c.method} T={c.temp:g}: "
                         f"{c.vs_plain:.3f}x plain, {c.vs_best:.3f}x best ({c.best_choice})")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hardware", default=",".join(HARDWARE))
    parser.add_argument("--costs", default=",".join(map(str, DRAFT_COSTS)))
    parser.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    parser.add_argument("--seeded", action="store_true", help="calibrated chain and tree policies")
    parser.add_argument("--records", default=str(RECORDS))
    parser.add_argument("--methods", default="draft,hybrid,ngram,block,tree,tree-fallback,batch")
    args = parser.parse_args()
    traces = load(Path(args.records))
    chosen = profiles(
        tuple(args.hardware.split(",")),
        tuple(float(c) for c in args.costs.split(",")),
        tuple(int(n) for n in args.contexts.split(",")),
    )
    rows = []
    for profile in chosen:
        rows.append((profile, cells(traces, profile, args.methods.split(","), args.seeded)))
        print(f"{profile.name} done", flush=True, file=sys.stderr)
    print(table(rows))
    print()
    print(summary(rows))


if __name__ == "__main__":
    main()
