"""Dynamic draft trees (EAGLE-2, Li et al. 2024): the shape follows the draft's confidence.

Each depth expands the `beam` nodes of highest cumulative draft probability (the product of the
draft's probabilities along the path: softmax of its logits at temperature 0, the warped q at
T > 0) with `width` candidates each; at temperature 0 the `nodes` most probable nodes are then
kept (a node is never more probable than its parent, so they form a tree). At T > 0 every drawn
node is kept (with beam and width cut so that they are at most `nodes`, DynamicShape.sampled): which nodes get children may depend on anything the draft computed, but dropping
a sampled sibling because of its own value would bias the ratio test (trees/tree_acceptance.py).

Costs one host read per depth (the probabilities decide the next forward's nodes).
"""

from __future__ import annotations

import math
from typing import Protocol, cast

import mlx.core as mx

from edgespec.config import SamplingConfig
from edgespec.sampling import sampler
from edgespec.trees.proposal import TreeDraft, TreeProposal, empty_tree
from edgespec.trees.shapes import DynamicShape, Tree


class Expander(Protocol):
    """What dynamic drafting asks of a tree drafter (trees/draft.py ModelTreeDrafter)."""

    sampling: SamplingConfig

    def root_logits(self, context: list[int]) -> mx.array | None: ...

    def draft_children(
        self, draft: TreeDraft, parent: int, kids: list[int], u: mx.array | None
    ) -> tuple[mx.array, mx.array]: ...

    def run_nodes(self, draft: TreeDraft, tree: Tree, nodes: list[int]) -> None: ...

    def full_q(self, rows: list[mx.array | None]) -> mx.array: ...


def _best(nodes: list[int], score: list[float], count: int) -> list[int]:
    """The `count` nodes of highest score (ties: the earlier node), in node order."""
    ranked = sorted(nodes, key=lambda i: (-score[i], i))[:count]
    return sorted(ranked)


def propose_dynamic(
    drafter: Expander, context: list[int], shape: DynamicShape, key: mx.array
) -> TreeProposal:
    """Draft a dynamic tree with `drafter` (module docstring)."""
    root = drafter.root_logits(context)
    if root is None:
        return empty_tree()
    sampled = shape.sampled()
    u = sampler(drafter.sampling).uniforms(key, sampled.size)  # None at temperature 0
    shape = shape if u is None else sampled
    parents: list[int] = []
    score: list[float] = []
    draft = TreeDraft([], [], [])
    draft.logits[-1] = root
    frontier = [-1]
    for depth in range(1, shape.depth + 1):
        level: list[int] = []
        confs = []
        for parent in frontier:
            kids = list(range(len(parents), len(parents) + shape.width))
            parents += [parent] * shape.width
            draft.tokens += [None] * shape.width
            draft.rows += [None] * shape.width
            draft.fed += [-1] * shape.width
            picks, q = drafter.draft_children(draft, parent, kids, u)
            confs.append(q[picks])
            level += kids
        probs = cast(list[float], mx.concatenate(confs).tolist())
        for node, prob in zip(level, probs, strict=True):
            par = parents[node]
            score.append((score[par] if par >= 0 else 0.0) + math.log(max(prob, 1e-30)))
        if depth == shape.depth:
            break
        frontier = _best(level, score, shape.beam)
        drafter.run_nodes(draft, Tree(tuple(parents)), frontier)
    keep = list(range(len(parents)))
    if u is None:
        keep = sorted(sorted(keep, key=lambda i: (-score[i], i))[: shape.nodes])
    return _pruned(drafter, draft, parents, keep)


def _pruned(
    drafter: Expander, draft: TreeDraft, parents: list[int], keep: list[int]
) -> TreeProposal:
    """The proposal of the nodes `keep` (closed under parents), renumbered in order."""
    new_index = {old: new for new, old in enumerate(keep)}
    tree = Tree(tuple(-1 if parents[i] < 0 else new_index[parents[i]] for i in keep))
    tokens = mx.stack([draft.tokens[i] for i in keep]).astype(mx.int32)  # type: ignore[misc]
    mx.async_eval(tokens)
    q = None
    if draft.rows and draft.rows[0] is not None:
        q = drafter.full_q([draft.rows[i] for i in keep])
    return TreeProposal(tokens, q, tree=tree, fed=tuple(draft.fed[i] for i in keep))
