"""Tree rounds replayed: a real shape policy (trees.loop.ShapePolicy: `observe(Round)`,
`observe_path(tree, path)`, `decide() -> Shape`) over a recorded greedy Trace and a Profile.

At T = 0 a tree's accepted path is exact from the record: below each accepted node the walk
accepts the child whose rank is the answer token's rank among the draft's candidates at that
position (the draft sees the answer's prefix along an accepted path). A round of a tree N nodes
D deep costs D draft forwards (the first over the tokens the draft has not seen, then one over
each depth's nodes: a forward of that many rows) and one verify of N + 1 rows; an empty shape is
a plain step. Dynamic shapes keep their `nodes` most probable candidates, which a record of ranks
cannot rebuild: the replay runs fixed shapes and the policies that choose among them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, TypeVar

from edgespec.config import SpecConfig
from edgespec.drafting.costs import cost_key
from edgespec.events import Round
from edgespec.trees.build import warm_shapes
from edgespec.trees.fallback import FallbackTree
from edgespec.trees.policy import AdaptiveTree
from edgespec.trees.proposal import TreeDrafter
from edgespec.trees.shapes import FixedShape, Tree, chain_shape, widths_shape
from research.replay.chains import K_INIT, K_MAX, Outcome, warm_verify
from research.replay.profiles import Profile
from research.replay.traces import Trace

# The fixed shapes the best choice in hindsight is taken over (chains 1..K_MAX besides).
TREE_WIDTHS = ((2, 1), (2, 1, 1), (2, 2, 1), (3, 1, 1), (2, 1, 1, 1), (3, 2, 1, 1), (4, 2, 1, 1),
               (2, 2, 2, 2), (3, 2, 2, 1, 1))  # fmt: skip


def shapes() -> list[FixedShape]:
    """The fixed shapes replayed: chains 1..K_MAX and TREE_WIDTHS."""
    out = [FixedShape(chain_shape(k)) for k in range(1, K_MAX + 1)]
    return out + [FixedShape(widths_shape(w)) for w in TREE_WIDTHS]


def accepted_path(trace: Trace, i: int, tree: Tree) -> list[int]:
    """The nodes a greedy verify accepts at position i."""
    path, node = [], -1
    for d in range(tree.depth):
        rank = trace.rank(i + d)
        kid = next((c for c in tree.kids[node + 1] if tree.ranks[c] == rank), None)
        if kid is None:
            break
        path.append(kid)
        node = kid
    return path


class Fixed:
    """The same shape every round (trees.loop.FixedPolicy's behaviour)."""

    def __init__(self, shape: FixedShape):
        self.shape = shape

    def observe(self, r: Round) -> None:
        pass

    def observe_path(self, tree: Tree, path: list[int]) -> None:
        pass

    def decide(self) -> FixedShape:
        return self.shape


# What the tree loop's rounds carry ("tree"), its chains' and plain steps' too
METHOD = TreeDrafter.method
FALLBACK_WIDTHS = (3, 2, 1, 1)  # the shape `--tree 3,2,1,1` asks for (docs/drafting.md's example)


def adaptive(seed: Profile | None = None) -> AdaptiveTree:
    """The shape policy of `--tree auto` (trees.build.make_shape_policy); with `seed`, seeded as
    after `Engine.warm_up` (`seeded`)."""
    return seeded(AdaptiveTree(K_INIT, K_MAX), "auto", seed)


def fallback(seed: Profile | None = None) -> FallbackTree:
    """The shape policy of `--tree 3,2,1,1` (adaptive, the default): that tree, or a chain or a
    plain step where it does not pay; with `seed`, seeded (`seeded`)."""
    policy = FallbackTree(FixedShape(widths_shape(FALLBACK_WIDTHS)), K_INIT, K_MAX)
    return seeded(policy, ",".join(map(str, FALLBACK_WIDTHS)), seed)


P = TypeVar("P", bound=AdaptiveTree)


def seeded(policy: P, tree: str, seed: Profile | None) -> P:
    """`policy` seeded with what a tree warm-up (trees.build.warm_shapes for `--tree TREE`) times
    under `seed`'s costs at a warm-up's context, as calibration.tree_costs keeps them: a chain
    step, every chain verify length and the plain step, and per warm-up tree its draft forwards'
    mean by nodes per depth and its verify; unchanged without a seed."""
    if seed is None:
        return policy
    verify = {L: warm_verify(seed, L) for L in range(1, K_MAX + 2)}
    tree_draft: dict[int, float] = {}
    tree_verify: dict[int, float] = {}
    for shape in warm_shapes(SpecConfig(k=K_INIT, k_max=K_MAX, tree=tree)):
        kind, width = cost_key(shape.size, shape.depth)
        if kind != "tree":
            continue
        tree_draft[width] = draft_time(seed, shape.tree, 1) / shape.depth
        tree_verify[shape.size + 1] = warm_verify(seed, shape.size + 1)
    policy.seed({METHOD: seed.draft(1)}, verify, tree_draft, tree_verify)
    return policy


def draft_time(profile: Profile, tree: Tree, gap: int) -> float:
    """A tree's draft forwards: the first over the `gap` tokens the draft has not seen, then one
    over each depth's nodes that get children (a forward of that many rows)."""
    widths = Counter(tree.depths)
    return profile.draft(gap) + sum(profile.draft(widths[d]) for d in range(1, tree.depth))


def replay(trace: Trace, profile: Profile, policy: Any) -> Outcome:
    """One greedy generation over `trace` with tree rounds shaped by `policy`."""
    out, i, seen = Outcome(), 0, 0
    fresh: list[Round] = []
    sizes: Counter[int] = Counter()
    while i < trace.size:
        for r in fresh:
            policy.observe(r)
        fresh.clear()
        shape = policy.decide()
        sizes[shape.size] += 1
        ctx = trace.context + i
        if shape.size == 0:
            t = profile.verify(1)
            fresh.append(Round(i, 0, 0, 0, 0.0, t, METHOD, True, context=ctx))
            n = 0
        else:
            tree = shape.tree
            path = accepted_path(trace, i, tree)
            t_draft = draft_time(profile, tree, max(i - seen, 1))
            t = t_draft + profile.verify(tree.size + 1)
            n = len(path)
            policy.observe_path(tree, path)
            branch = next((tree.ranks[j] for j in path if tree.ranks[j]), 0)
            fresh.append(Round(i, tree.size, n, tree.depth, t_draft, t - t_draft, METHOD, True,
                               nodes=tree.size, branch=branch, context=ctx))  # fmt: skip
            seen = i + min(n, tree.depth - 1)
        step = min(n + 1, trace.size - i)
        i += step
        out.tokens += step
        out.seconds += t
        out.chosen.append(shape.size)
    return out
