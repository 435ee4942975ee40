"""The tree shape and shape policy a SpecConfig with `tree` set asks for, fresh per generation
(the tree drafter is its draft family's: edgespec/families/)."""

from __future__ import annotations

from edgespec.calibration import Cycle
from edgespec.config import BLOCK_METHODS, SpecConfig, spec_widths
from edgespec.trees.fallback import FallbackTree
from edgespec.trees.loop import FixedPolicy, ShapePolicy
from edgespec.trees.policy import AdaptiveTree
from edgespec.trees.shapes import (
    DynamicShape,
    FixedShape,
    Shape,
    Tree,
    chain_shape,
    widths_shape,
)


def tree_shape(spec: SpecConfig) -> Shape:
    """The fixed or dynamic shape of spec.tree: "chain" is K drafts in a row, "3,2,1" those
    widths (shapes.widths_shape), "dynamic" a DynamicShape K deep ("dynamic:N": keeping N nodes)."""
    if spec.tree in ("chain", "auto"):
        return FixedShape(chain_shape(spec.k))
    if spec.tree == "dynamic":
        return DynamicShape(depth=spec.k)
    if spec.tree.startswith("dynamic:"):
        return DynamicShape(depth=spec.k, nodes=int(spec.tree.split(":")[1]))
    return FixedShape(widths_shape(spec_widths(spec.tree)))


def make_shape_policy(spec: SpecConfig) -> ShapePolicy:
    """With tree "auto" the adaptive choice between chains and trees (trees/policy.py); with a
    shape and spec.adaptive (the default) that shape where it pays, else a chain or a plain step
    (FallbackTree); otherwise ("chain", or --no-adaptive) the same shape every round."""
    if spec.tree == "auto":
        return AdaptiveTree(spec.k, spec.k_max)
    if spec.adaptive and spec.tree != "chain":
        blocks = spec.method in BLOCK_METHODS  # one draft forward a chain round
        return FallbackTree(tree_shape(spec), spec.k, spec.k_max, per_round=blocks)
    return FixedPolicy(tree_shape(spec))


WARM_TREE_ROUNDS = 3  # a warm-up's rounds of each tree shape, per cycle
WARM_TREE_NODES = (4, 8, 12, 16)  # "auto"'s warm-up trees: the prior's best of these many nodes


def warm_shapes(spec: SpecConfig) -> list[Shape]:
    """One warm-up cycle for spec's tree policy (Engine.warm_up): the chains 1..k_max deep, a
    plain step, then WARM_TREE_ROUNDS rounds of each tree it may choose: SHAPE, or with "auto"
    the prior's greedy trees of WARM_TREE_NODES nodes (AdaptiveTree's first candidates). Their
    timings price a tree before its first round in a request (AdaptiveTree.seed).

    >>> [s.size for s in warm_shapes(SpecConfig(k=2, k_max=2, tree="3,2"))]
    [1, 2, 0, 5, 5, 5]
    """
    chains: list[Shape] = [FixedShape(chain_shape(k)) for k in range(1, spec.k_max + 1)]
    if spec.tree == "auto":
        sizes = set(WARM_TREE_NODES)
        fresh = AdaptiveTree(spec.k, spec.k_max).candidates()[spec.k_max :]
        trees = [s for _, s in fresh if s.size in sizes]
    elif spec.tree == "chain":
        trees = []
    else:
        trees = [tree_shape(spec)]
    return [*chains, FixedShape(()), *(t for t in trees for _ in range(WARM_TREE_ROUNDS))]


class ShapeCycle(Cycle[Shape]):
    """A warm-up's shape policy: `shapes` in turn, `repeats` times (the first pass compiles, the
    second is timed), then plain steps; `tokens` the most a pass can commit (its depths, plus
    one a round).

    >>> cycle = ShapeCycle([FixedShape(chain_shape(2)), FixedShape(())], repeats=1)
    >>> [cycle.decide().size for _ in range(3)], cycle.done, cycle.tokens
    ([2, 0, 0], True, 4)
    """

    def __init__(self, shapes: list[Shape], repeats: int = 2) -> None:
        super().__init__(shapes * repeats, FixedShape(()))

    @property
    def tokens(self) -> int:
        return sum(s.depth + 1 for s in self.items)

    def observe_path(self, tree: Tree, path: list[int]) -> None:
        pass
