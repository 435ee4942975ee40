"""The tree shape and shape policy a SpecConfig with `tree` set asks for, fresh per generation
(the tree drafter is its draft family's: edgespec/families/)."""

from __future__ import annotations

from edgespec.config import SpecConfig, spec_widths
from edgespec.trees.loop import FixedPolicy, ShapePolicy
from edgespec.trees.policy import AdaptiveTree, FallbackTree
from edgespec.trees.shapes import (
    DynamicShape,
    FixedShape,
    Shape,
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
        return FallbackTree(tree_shape(spec), spec.k, spec.k_max)
    return FixedPolicy(tree_shape(spec))
