"""An n-gram lookup's continuation as one more branch of a drafted tree (method "hybrid" with
--tree).

The lookup's tokens follow the tree's own nodes while they agree (a lookup that guesses what the
draft guessed adds nothing), then hang below as a chain of deterministic candidates, each its
parent's last-ranked child. Exact at any temperature: a deterministic candidate's q is a point
mass, tried after the draft's siblings, and whether it is added depends only on tokens drafted
before it (edgespec/trees/tree_acceptance.py).

Cost: merging reads the drafted tokens back (one host sync the draft-only tree does not need), so
it runs only when the lookup matched.
"""

from __future__ import annotations

from typing import cast

import mlx.core as mx

from edgespec.config import MAX_TREE_NODES
from edgespec.drafting.base import Capabilities
from edgespec.drafting.ngram import NgramDrafter
from edgespec.trees.proposal import TreeDrafter, TreeProposal
from edgespec.trees.shapes import Shape, Tree


def add_branch(prop: TreeProposal, branch: list[int], match: int, vocab: int) -> TreeProposal:
    """`prop` with the token path `branch` below the root merged in (module docstring).
    Example: tree parents (-1, -1, 0) tokens [5, 6, 7], branch [5, 8, 9] -> 5 is node 0, then
    8 becomes node 3 below node 0 (after node 2) and 9 node 4 below node 3."""
    tokens = cast(list[int], prop.tokens.tolist())
    parents = list(prop.tree.parents)
    kids = prop.tree.kids
    cur, i = -1, 0
    while i < len(branch) and cur < prop.size:
        same = [c for c in kids[cur + 1] if tokens[c] == branch[i]]
        if not same:
            break
        cur, i = same[0], i + 1
    added = branch[i : i + MAX_TREE_NODES - len(parents)]
    for tok in added:
        parents.append(cur)
        tokens.append(tok)
        cur = len(parents) - 1
    q = prop.q
    if q is not None and added:
        hot = mx.arange(vocab)[None, :] == mx.array(added, dtype=mx.int32)[:, None]
        q = mx.concatenate([q, hot.astype(q.dtype)])
    fed = prop.fed + (-1,) * len(added)
    new = mx.array(tokens, dtype=mx.int32)
    return TreeProposal(new, q, prop.method, match, Tree(tuple(parents)), fed)


class NgramBranch(TreeDrafter):
    """A tree drafter's trees, plus the lookup's continuation (of a suffix match of at least
    `min_match` tokens; up to `lookup_k` tokens, more on a long match) as one more branch."""

    def __init__(
        self, model: TreeDrafter, ngram: NgramDrafter, min_match: int, lookup_k: int, vocab: int
    ):
        self.model, self.ngram = model, ngram
        self.min_match, self.lookup_k, self.vocab = min_match, lookup_k, vocab
        self._features = model.capabilities().features  # a feature draft's, handed on

    def propose_tree(self, context: list[int], shape: Shape, key: mx.array) -> TreeProposal:
        prop = self.model.propose_tree(context, shape, key)
        look = self.ngram.propose_min(context, self.lookup_k, self.min_match)
        if look.size == 0:
            return prop
        branch = cast(list[int], look.tokens.tolist())
        return add_branch(prop, branch, look.match, self.vocab)

    def keep_path(self, base: int, prop: TreeProposal, path: list[int]) -> None:
        self.model.keep_path(base, prop, path)

    def capabilities(self) -> Capabilities:
        """The features capability when the model it wraps reads them (a feature draft's)."""
        return Capabilities(features=self if self._features is not None else None)

    def take_features(self, context: list[int], start: int, features: mx.array) -> None:
        """Hand the verify's features to the wrapped feature draft."""
        assert self._features is not None, "the wrapped drafter reads no features"
        self._features.take_features(context, start, features)

    def commit(self, context: list[int]) -> None:
        self.ngram.commit(context)
        self.model.commit(context)
