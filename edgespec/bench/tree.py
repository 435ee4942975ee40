"""Chains against trees, side by side in one run (`edgespec tree-bench`): tau at equal depth
(draft forward passes), tokens per second, greedy output against plain decoding, and the tree
closed form checked against the measured tau. Prints nothing; the command does.

Variants, run in turn on every prompt (so drifting machine load hits them alike): plain decoding;
the chain loop with K = depth ("chain"); each tree shape at that depth ("tree <shape>"); adaptive K
("adaptive", chains) and the adaptive shape policy ("adaptive-tree").

The closed form: from every round of a variant, the (tree, accepted path) outcome counts how often
a rank-r candidate at depth d was accepted when tried (a chain round is a tree of rank-0 nodes);
then predicted tau = the mean over the variant's rounds of 1 + the sum over that round's tree's
nodes of P(path to the node accepted) (edgespec/trees/shapes.py `expected_accepted`).

CPU time per token is reported beside wall-clock tokens/s: on a machine shared with other jobs
the wall clock measures the neighbours as much as the method, while the process's CPU time (with
one BLAS thread, MKL_NUM_THREADS=1) stays close to the work done.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.events import Finished, Round, Token
from edgespec.trees.build import make_shape_policy
from edgespec.trees.loop import ShapePolicy
from edgespec.trees.shapes import Shape, Tree, chain_shape, expected_accepted, shape_tree


@dataclass(frozen=True)
class Variant:
    """One way of decoding: its name and SpecConfig (None: plain decoding)."""

    name: str
    spec: SpecConfig | None


def variants(
    depth: int, trees: Sequence[str], adaptive: bool = True, block: bool = False
) -> list[Variant]:
    """plain, chain (K = depth), one tree per shape (depth `depth` where the shape takes one),
    and the adaptive chain and tree policies. block: a block draft's, named "block" (chain) and
    "block-tree <shape>" (method block: one draft forward a round, drafting/block.py)."""
    m, chain, tree = ("block", "block", "block-tree") if block else ("draft", "chain", "tree")
    out = [Variant("plain", None), Variant(chain, SpecConfig(k=depth, method=m, adaptive=False))]
    # Each shape every round (no fallback to chains): the comparison is of shapes at one depth.
    out += [
        Variant(f"{tree} {t}", SpecConfig(k=depth, method=m, tree=t, adaptive=False)) for t in trees
    ]
    if adaptive:
        out.append(Variant("adaptive", SpecConfig(k=depth, method=m, adaptive=True)))
        out.append(Variant("adaptive-tree", SpecConfig(k=depth, method=m, tree="auto")))
    return out


class Recorder:
    """A shape policy that records every round's (tree, accepted path) for the closed form."""

    def __init__(self, inner: ShapePolicy):
        self.inner = inner
        self.outcomes: list[tuple[Tree, list[int]]] = []

    def observe(self, r: Round) -> None:
        self.inner.observe(r)

    def decide(self) -> Shape:
        return self.inner.decide()

    def observe_path(self, tree: Tree, path: list[int]) -> None:
        self.outcomes.append((tree, list(path)))
        self.inner.observe_path(tree, path)


@dataclass
class Run:
    """One variant on one prompt."""

    variant: str
    prompt_id: str
    tokens: list[int]
    rounds: int
    tokens_per_s: float
    decode_time: float
    outcomes: list[tuple[Tree, list[int]]] = field(default_factory=list)
    cpu_seconds: float = 0.0  # process CPU time of the whole generation (prefill included)

    @property
    def tau(self) -> float:
        return len(self.tokens) / self.rounds if self.rounds else 1.0


def chain_outcome(r: Round) -> tuple[Tree, list[int]]:
    """A chain round as a tree outcome: K rank-0 nodes, the first `accepted` on the path."""
    return shape_tree(chain_shape(r.drafted)), list(range(r.accepted))


def run_one(engine: Any, ids: list[int], variant: Variant, sampling: SamplingConfig, n: int) -> Run:
    """Generate up to n tokens with `variant` from a cold cache."""
    spec = variant.spec or SpecConfig(method="none")
    recorder = Recorder(make_shape_policy(spec)) if spec.tree else None
    engine.reset()
    tokens: list[int] = []
    rounds: list[Round] = []
    stats = None
    config = GenerationConfig(sampling, spec, max_tokens=n)
    cpu0 = time.process_time()
    for event in engine.generate(ids, config, k_policy=recorder):
        if isinstance(event, Token):
            tokens.append(event.id)
        elif isinstance(event, Round):
            rounds.append(event)
        elif isinstance(event, Finished):
            stats = event.stats
    assert stats is not None
    outcomes = recorder.outcomes if recorder else [chain_outcome(r) for r in rounds if r.drafted]
    n_rounds = len(rounds) if rounds else len(tokens)
    cpu = time.process_time() - cpu0
    return Run(
        variant.name, "", tokens, n_rounds, stats.tokens_per_s, stats.decode_time, outcomes, cpu
    )


def iter_runs(
    engine: Any, prompts: dict[str, list[int]], plan: Sequence[Variant], sampling, n: int
) -> Iterator[Run]:
    """Every variant on every prompt, prompt by prompt."""
    for pid, ids in prompts.items():
        for variant in plan:
            run = run_one(engine, ids, variant, sampling, n)
            run.prompt_id = pid
            yield run


def acceptance_table(outcomes: Sequence[tuple[Tree, list[int]]], depths: int, ranks: int):
    """a[d][r] = accepted / tried over the outcomes (0 where never tried): along each path the
    elder siblings were tried and rejected, the path's node accepted, and below its end every
    child tried and rejected."""
    acc = [[0] * ranks for _ in range(depths)]
    tried = [[0] * ranks for _ in range(depths)]
    for tree, path in outcomes:
        stop = path[-1] if path else -1
        events = [(n, True) for n in path] + [(c, False) for c in tree.kids[stop + 1]]
        for node, ok in events:
            elders = tree.kids[tree.parents[node] + 1][: tree.ranks[node]] if ok else ()
            for m, hit in [(node, ok)] + [(e, False) for e in elders]:
                d, r = tree.depths[m] - 1, tree.ranks[m]
                if d < depths and r < ranks:
                    tried[d][r] += 1
                    acc[d][r] += int(hit)
    return [
        [a / t if t else 0.0 for a, t in zip(ra, rt, strict=True)]
        for ra, rt in zip(acc, tried, strict=True)
    ]


def predicted_tau(outcomes: Sequence[tuple[Tree, list[int]]], plain_rounds: int = 0):
    """The closed form's tau for these rounds (module docstring), plain steps (tau 1) included;
    None without rounds."""
    if not outcomes:
        return None
    depth = max(t.depth for t, _ in outcomes)
    ranks = max((max(t.ranks, default=0) for t, _ in outcomes), default=0) + 1
    table = acceptance_table(outcomes, max(depth, 1), ranks)
    total = float(plain_rounds)
    for tree, _ in outcomes:
        paths = [tree.rank_path(i) for i in range(tree.size)]
        total += 1.0 + expected_accepted(paths, table)
    return total / (len(outcomes) + plain_rounds)


@dataclass(frozen=True)
class Summary:
    """One variant over all prompts."""

    variant: str
    tau: float  # committed tokens / rounds, pooled over prompts
    tokens_per_s: float  # committed tokens / decode seconds, pooled
    predicted: float | None  # the closed form's tau
    identical: int  # prompts whose greedy output equals plain decoding's
    prompts: int
    cpu_ms_per_token: float = 0.0  # process CPU time per generated token, prefill included


def summarise(runs: Sequence[Run], greedy: bool) -> list[Summary]:
    """Pool each variant's runs; `identical` compares with plain decoding's tokens (greedy)."""
    plain = {r.prompt_id: r.tokens for r in runs if r.variant == "plain"}
    out = []
    for name in dict.fromkeys(r.variant for r in runs):
        mine = [r for r in runs if r.variant == name]
        tokens = sum(len(r.tokens) for r in mine)
        rounds = sum(r.rounds for r in mine)
        decode = sum(r.decode_time for r in mine)
        decoded = sum(max(len(r.tokens) - 1, 0) for r in mine)
        outcomes = [o for r in mine for o in r.outcomes]
        same = sum(r.tokens == plain.get(r.prompt_id) for r in mine) if greedy else 0
        out.append(
            Summary(
                name,
                tokens / rounds if rounds else 0.0,
                decoded / decode if decode else 0.0,
                predicted_tau(outcomes, rounds - len(outcomes)) if name != "plain" else None,
                same,
                len(mine),
                1000 * sum(r.cpu_seconds for r in mine) / max(tokens, 1),
            )
        )
    return out
