"""What a tree drafter hands the tree loop: a TreeProposal (drafting.base.Proposal with a tree
and the draft-cache rows of its nodes), the TreeDraft being built, and the TreeDrafter hooks (drafting.base.Drafter's plus
`propose_tree` and `keep_path`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx

from edgespec.drafting.base import Drafter, Proposal
from edgespec.trees.shapes import Shape, Tree


@dataclass(frozen=True)
class TreeProposal(Proposal):
    """A drafted tree: `tokens` [N] int32 (may be lazy) in node order, `q` [N, V] the distribution
    each was drawn from (None: all deterministic candidates, as at temperature 0), `tree` their
    topology, `fed[i]` the draft-cache position of node i when the draft ran it (-1 otherwise),
    `match` the n-gram suffix length behind a lookup branch (0: none). `in_place`: a chain the
    draft ran as an ordinary chain right after the context (drafting.token.ModelDrafter.propose),
    so its accepted nodes already sit in place in the draft's cache and `commit` keeps them."""

    method: str = "tree"
    tree: Tree = field(default_factory=lambda: Tree(()))
    fed: tuple[int, ...] = ()
    in_place: bool = False

    def cut(self, room: int) -> TreeProposal:
        """Without the nodes deeper than `room` (their descendants are deeper too): the room left
        in the context window. A chain's cut, depth for length. Example: parents (-1, 0, 0, 1)
        cut(1) -> node 0 only."""
        tree = self.tree
        keep = [i for i in range(tree.size) if tree.depths[i] <= room]
        if len(keep) == tree.size:
            return self
        new_index = {old: new for new, old in enumerate(keep)}
        parents = tuple(-1 if tree.parents[i] < 0 else new_index[tree.parents[i]] for i in keep)
        index = mx.array(keep, dtype=mx.int32)
        q = None if self.q is None else self.q[index]
        fed = tuple(self.fed[i] for i in keep) if self.fed else ()
        tokens, tree = self.tokens[index], Tree(parents)
        return TreeProposal(tokens, q, self.method, self.match, tree, fed, self.in_place)


@dataclass
class TreeDraft:
    """A tree being drafted: per node its token, q row (head columns when the draft has a reduced
    head) and draft-cache position, and the draft's logits row of each node that was run."""

    tokens: list[mx.array | None]
    rows: list[mx.array | None]
    fed: list[int]
    logits: dict[int, mx.array] = field(default_factory=dict)  # node (-1: root) -> [H or V]


def empty_tree() -> TreeProposal:
    """No tree: the round is a plain target step."""
    return TreeProposal(mx.array([], dtype=mx.int32))


class TreeDrafter(Drafter):
    """A drafter that proposes trees (loop: edgespec/trees/loop.py). The loop calls
    `propose_tree` before each round, `keep_path` with the accepted path, then `commit`."""

    method = "tree"

    def propose_tree(self, context: list[int], shape: Shape, key: mx.array) -> TreeProposal:
        """A tree of `shape` (at most its nodes) below the newest token of `context`; `key` seeds
        any sampling (uniforms(key, N): node i takes u[i])."""
        raise NotImplementedError

    def keep_path(self, base: int, prop: TreeProposal, path: list[int]) -> None:
        """The round accepted `path` (node indices) of `prop`, drafted after the first `base`
        context tokens; `commit` follows."""
