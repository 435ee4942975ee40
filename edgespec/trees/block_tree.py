"""Trees from a block draft (edgespec/drafting/block.py): ONE draft forward per round.

A block draft gives the distributions of every drafted depth at once: row i of its block is q_i,
whatever tokens come before depth i. So a tree needs no further draft forward: the children of
ANY node at depth i - 1 are candidates from q_i (at temperature 0 its top tokens in order, at
T > 0 drawn without replacement from q_i, each with the distribution it was drawn from:
trees/tree_acceptance.py draw_siblings), and the shape is fixed ("3,2,1") or best-first under a node
budget (dynamic: the nodes of highest cumulative draft probability get children, DDTree-style;
trees/dynamic.py). Exact by the recursive rejection of trees/tree_acceptance.py: it needs each
candidate drawn from the q_j reported for it, which holds here (the q at a node is the block's
row for its depth, the same for every node of that depth).

Worked example (block rows for depths 1 and 2, shape "2,2"): the root gets the two best tokens
a, b of q_1; a gets the two best c, d of q_2, and b nothing (widths 2 then 2: the first node of a
depth gets the children). One target forward verifies a, b, c, d under the tree mask.

Nothing of the tree enters the draft's cache (it caches context keys and values only), so
`keep_path` and `commit` only follow the target's rewinds (take_features).
"""

from __future__ import annotations

import dataclasses

import mlx.core as mx

from edgespec.config import SamplingConfig
from edgespec.drafting.base import Capabilities
from edgespec.drafting.block import BlockState
from edgespec.trees.draft import ModelTreeDrafter
from edgespec.trees.forward import PLAIN, Kernels
from edgespec.trees.proposal import TreeDraft, TreeProposal, empty_tree
from edgespec.trees.shapes import DynamicShape, FixedShape, Shape, Tree


def clamp_depth(shape: Shape, depth: int) -> Shape:
    """`shape` without its depths past `depth` (a block drafts block_size - 1 tokens at most).
    Example: widths 2,1,1 at depth 2 -> widths 2,1 (the rank paths of length <= 2)."""
    if shape.depth <= depth:
        return shape
    if isinstance(shape, DynamicShape):
        return dataclasses.replace(shape, depth=depth)
    return FixedShape(tuple(p for p in shape.paths if len(p) <= depth))


class BlockTreeDrafter(ModelTreeDrafter):
    """Trees from a block draft (module docstring): ModelTreeDrafter's drafting of fixed and
    dynamic shapes, its node forwards replaced by rows of the round's block."""

    def __init__(
        self, state: BlockState, sampling: SamplingConfig, vocab: int, kernels: Kernels = PLAIN
    ):
        self.block, self.state = state, state.kv
        self.sampling, self.vocab, self.kernels = sampling, vocab, kernels
        self.head_ids = None
        self.chains = None
        self._prefix = 0
        self._rows: mx.array | None = None  # [depth, V] the round's block logits
        self._depth = 0

    def propose_tree(self, context: list[int], shape: Shape, key: mx.array) -> TreeProposal:
        shape = clamp_depth(shape, self.block.block.args.block_size - 1)
        if shape.depth < 1 or shape.size < 1:
            return empty_tree()
        self._depth = shape.depth
        return super().propose_tree(context, shape, key)

    def root_logits(self, context: list[int]) -> mx.array | None:
        """The block's rows for depths 1..depth, one forward; row 0 (depth 1) is the root's."""
        rows = self.block.block_logits(context, self._depth)
        self._rows = rows
        return None if rows is None else rows[0]

    def run_nodes(self, draft: TreeDraft, tree: Tree, nodes: list[int]) -> None:
        """No forward: a node at depth i gets its children from the block's row for depth i + 1."""
        assert self._rows is not None
        for node in nodes:
            draft.logits[node] = self._rows[tree.depths[node]]

    def keep_path(self, base: int, prop: TreeProposal, path: list[int]) -> None:
        """Nothing to keep: no tree node enters the draft's cache."""

    def take_features(self, context: list[int], start: int, features: mx.array) -> None:
        self.block.set_features(context, start, features)

    def capabilities(self) -> Capabilities:
        return Capabilities(features=self)  # it reads the verify's features

    def commit(self, context: list[int]) -> None:
        st = self.block
        st.rewind(min(st.kv.offset, st.n_features, max(len(context) - 1, 0)))
