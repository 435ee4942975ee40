"""Draft trees: their topology, the attention mask and positions of a tree forward, fixed shapes,
and the closed form of a shape's expected accepted length. Plain Python and numpy, no models.

A tree hangs below the root, the newest committed token (the verify forward's last pending
input). Nodes are numbered 0..N-1 with every parent before its children, grouped by depth, and
siblings in rank order (rank 0 = the draft's first candidate); `parents[i]` is -1 for a child of
the root. A chain of K drafts is the tree whose node i has parent i - 1.

Example: widths [3, 2, 1] (`widths_shape`) is the rank paths (0,), (1,), (2,), (0, 0), (0, 1),
(0, 0, 0): three candidates for the first token, two for the second below the first candidate,
one for the third. As a Tree its parents are (-1, -1, -1, 0, 0, 3) and its depths (1, 1, 1, 2, 2,
3).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

RankPath = tuple[int, ...]


@dataclass(frozen=True)
class Tree:
    """A draft tree's topology: `parents[i]` (-1: the root), parents before children, BFS order."""

    parents: tuple[int, ...]

    def __post_init__(self) -> None:
        for i, parent in enumerate(self.parents):
            if not -1 <= parent < i:
                raise ValueError(f"node {i}: parent {parent} must come before it")

    @property
    def size(self) -> int:
        return len(self.parents)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """Depth of every node (the root's children have depth 1)."""
        out: list[int] = []
        for parent in self.parents:
            out.append(1 if parent < 0 else out[parent] + 1)
        return tuple(out)

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)

    @property
    def is_chain(self) -> bool:
        """Node i's parent is node i - 1 (or the root): a chain, whose mask is the causal one."""
        return all(parent == i - 1 for i, parent in enumerate(self.parents))

    @cached_property
    def kids(self) -> tuple[tuple[int, ...], ...]:
        """kids[j + 1]: the children of node j in rank order; kids[0]: the root's."""
        out: list[list[int]] = [[] for _ in range(self.size + 1)]
        for i, parent in enumerate(self.parents):
            out[parent + 1].append(i)
        return tuple(tuple(k) for k in out)

    @cached_property
    def ranks(self) -> tuple[int, ...]:
        """Each node's rank among its siblings (0: its parent's first candidate)."""
        out = [0] * self.size
        for kids in self.kids:
            for rank, node in enumerate(kids):
                out[node] = rank
        return tuple(out)

    def path(self, node: int) -> list[int]:
        """The nodes from the root's child down to `node` (empty for the root, -1)."""
        out: list[int] = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def rank_path(self, node: int) -> RankPath:
        return tuple(self.ranks[i] for i in self.path(node))

    def child_table(self) -> np.ndarray:
        """int32 [N + 1, W]: row j + 1 lists node j's children as p rows (node i -> i + 1), row 0
        the root's, -1 padded; W the widest node's number of children (at least 1)."""
        width = max([len(k) for k in self.kids] + [1])
        table = np.full((self.size + 1, width), -1, dtype=np.int32)
        for row, kids in enumerate(self.kids):
            table[row, : len(kids)] = np.array(kids, dtype=np.int32) + 1
        return table

    def ancestors(self) -> np.ndarray:
        """bool [N, N]: [i, j] when node j is node i or one of its ancestors."""
        anc = np.zeros((self.size, self.size), dtype=bool)
        for i, parent in enumerate(self.parents):
            if parent >= 0:
                anc[i] = anc[parent]
            anc[i, i] = True
        return anc


def tree_mask(tree: Tree, prefix: int, pending: int) -> np.ndarray:
    """bool [P + N, prefix + P + N]: which keys each query of a tree forward may see. The forward's
    inputs are P pending tokens (committed, not yet in the cache, after `prefix` cached positions)
    then the N nodes; a pending token sees the prefix and the pending tokens up to itself, a node
    the prefix, every pending token and its own ancestors and itself.
    Example: chain of 2, prefix 1, pending 1 -> the causal mask [[1,1,0,0],[1,1,1,0],[1,1,1,1]]."""
    n, total = tree.size, prefix + pending + tree.size
    mask = np.zeros((pending + n, total), dtype=bool)
    mask[:, :prefix] = True
    mask[:pending, prefix : prefix + pending] = np.tril(np.ones((pending, pending), dtype=bool))
    mask[pending:, prefix : prefix + pending] = True
    mask[pending:, prefix + pending :] = tree.ancestors()
    return mask


def tree_positions(tree: Tree, prefix: int, pending: int) -> np.ndarray:
    """int32 [P + N]: RoPE positions; siblings share one (a node at depth d sits d after the root).
    Example: widths [2, 1], prefix 4, pending 1 -> [4, 5, 5, 6]."""
    root = prefix + pending - 1
    own = [prefix + j for j in range(pending)] + [root + d for d in tree.depths]
    return np.array(own, dtype=np.int32)


# ---------------------------------------------------------------------------- fixed shapes


def shape_tree(paths: Sequence[RankPath]) -> Tree:
    """The Tree of a set of rank paths (closed under prefixes, siblings' ranks contiguous from
    0), nodes ordered by depth, then by rank path. Raises ValueError on a set that is not one."""
    ordered = sorted(set(paths), key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(ordered)}
    for p in ordered:
        if (
            not p
            or (len(p) > 1 and p[:-1] not in index)
            or (p[-1] > 0 and p[:-1] + (p[-1] - 1,) not in index)
        ):
            raise ValueError(f"rank path {p} lacks its parent or an earlier sibling")
    return Tree(tuple(index[p[:-1]] if len(p) > 1 else -1 for p in ordered))


def chain_shape(k: int) -> tuple[RankPath, ...]:
    """K drafts in a row: (0,), (0, 0), ... ."""
    return tuple((0,) * d for d in range(1, k + 1))


def widths_shape(widths: Sequence[int]) -> tuple[RankPath, ...]:
    """widths[d - 1] candidates at depth d, all below the first-ranked path (the chain a greedy
    draft would propose): [3, 2, 1] -> (0,), (1,), (2,), (0, 0), (0, 1), (0, 0, 0)."""
    if not widths or any(w < 1 for w in widths):
        raise ValueError(f"tree widths must be >= 1, got {list(widths)}")
    return tuple((0,) * (d - 1) + (r,) for d, w in enumerate(widths, 1) for r in range(w))


# ---------------------------------------------------------------------------- the closed form


def path_probability(path: RankPath, accept: Sequence[Sequence[float]]) -> float:
    """P(the tree's acceptance walk reaches and accepts the node at `path`): at depth d the
    candidates of ranks below r_d are rejected and rank r_d accepted, where accept[d - 1][r] is
    the probability that a rank-r candidate is accepted once the walk tried it (its elders
    rejected). Ranks past a row's end count as never accepted.
    Example: accept [[0.6, 0.5]] -> path (1,) has 0.4 * 0.5 = 0.2."""
    prob = 1.0
    for d, r in enumerate(path):
        row = accept[min(d, len(accept) - 1)]
        for s in range(r):
            prob *= 1.0 - (row[s] if s < len(row) else 0.0)
        prob *= row[r] if r < len(row) else 0.0
    return prob


def expected_accepted(paths: Sequence[RankPath], accept: Sequence[Sequence[float]]) -> float:
    """E[accepted drafts per round] of a tree = the sum over its nodes of P(the path to the node is
    accepted); tokens per round are one more (the correction or bonus). For a chain with
    accept [[a]] this is a + a^2 + ... + a^K, the chain's closed form minus one.
    Example: widths [2, 1] with accept [[0.6, 0.5]]: 0.6 + 0.2 + 0.6 * 0.6 = 1.16."""
    return sum(path_probability(p, accept) for p in paths)


def greedy_nodes(
    accept: Sequence[Sequence[float]], nodes: int, max_depth: int, max_rank: int
) -> list[tuple[RankPath, float]]:
    """Up to `nodes` (rank path, path probability) pairs, each the likeliest node whose parent
    and elder sibling came before it (depth <= max_depth, ranks < max_rank). Its first n form
    the shape of n nodes with the largest expected accepted length: a node's probability never
    exceeds its parent's or its elder sibling's, so the best n nodes are a valid shape."""

    def rate(depth: int, rank: int) -> float:  # path_probability's accept[d - 1][r]
        row = accept[min(depth, len(accept)) - 1]
        return row[rank] if rank < len(row) else 0.0

    # A heap of (-probability, depth, path, reach): the likeliest first, ties to the shallower,
    # then to the lower ranks (the order of the sort this replaces). `reach` is the chance the
    # walk tries the node (its parent accepted, its elders rejected), so a child's and a younger
    # sibling's probabilities are one or two products away, multiplied in path_probability's
    # order (the same floats): a decision of the tree policies ran this every round (~0.3 ms).
    chosen: list[tuple[RankPath, float]] = []
    frontier: list[tuple[float, int, RankPath, float]] = [(-rate(1, 0), 1, (0,), 1.0)]
    while frontier and len(chosen) < nodes:
        minus, depth, best, reach = heapq.heappop(frontier)
        chosen.append((best, -minus))
        if depth < max_depth:
            heapq.heappush(frontier, (minus * rate(depth + 1, 0), depth + 1, best + (0,), -minus))
        rank = best[-1]
        if rank + 1 < max_rank:
            tried = reach * (1.0 - rate(depth, rank))
            younger = best[:-1] + (rank + 1,)
            heapq.heappush(frontier, (-(tried * rate(depth, rank + 1)), depth, younger, tried))
    return chosen


@dataclass(frozen=True)
class FixedShape:
    """A static tree: its rank paths (widths_shape, chain_shape, or greedy_nodes' prefix)."""

    paths: tuple[RankPath, ...]

    @property
    def depth(self) -> int:
        return max((len(p) for p in self.paths), default=0)

    @property
    def size(self) -> int:
        return len(self.paths)

    @cached_property
    def tree(self) -> Tree:
        return shape_tree(self.paths) if self.paths else Tree(())


@dataclass(frozen=True)
class DynamicShape:
    """EAGLE-2 style, built per round from the draft's confidence: `width` candidates below each
    of the `beam` nodes of highest cumulative draft probability at every depth, `depth` deep;
    at temperature 0 the `nodes` most probable are kept (at T > 0 all: pruning a sampled sibling
    because of its own value would bias the ratio test, trees/tree_acceptance.py)."""

    depth: int
    beam: int = 4
    width: int = 4
    nodes: int = 24

    @property
    def size(self) -> int:
        """The nodes drafted before any is dropped."""
        return self.width + (self.depth - 1) * self.beam * self.width

    def sampled(self) -> DynamicShape:
        """The shape drafted at T > 0, where nothing is dropped: beam = width = the largest w
        (at most `width`) whose tree has at most `nodes` nodes. Example: depth 4, nodes 24 ->
        w = 2 (2 + 3 * 4 = 14 nodes; w = 3 would draw 30)."""
        w = max(
            [1]
            + [w for w in range(1, self.width + 1) if w + (self.depth - 1) * w * w <= self.nodes]
        )
        return DynamicShape(self.depth, w, w, self.nodes)


Shape = FixedShape | DynamicShape
