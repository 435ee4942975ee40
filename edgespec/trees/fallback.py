"""`--tree SHAPE` under an adaptive policy (the default): SHAPE in the rounds where it pays, adaptive
K's chain or plain step in every other (FallbackTree). The tree is priced as `--tree auto` prices
trees (edgespec/trees/policy.py AdaptiveTree), the chains and plain steps are chosen by the chain
loop's own policy (edgespec/drafting/adaptive.py AdaptiveK), so where no tree pays `--tree` runs
the rounds the chain loop runs."""

from __future__ import annotations

import dataclasses
from typing import Any

from edgespec.acceptance import Review
from edgespec.drafting.adaptive import ALPHA_DECAY, TIE_TOLERANCE, AdaptiveK
from edgespec.drafting.costs import cost_key
from edgespec.events import Round
from edgespec.trees.policy import AdaptiveTree
from edgespec.trees.proposal import TreeDrafter
from edgespec.trees.shapes import FixedShape, Shape, chain_shape, expected_accepted, greedy_nodes


class FallbackTree(AdaptiveTree):
    """`--tree SHAPE` under an adaptive policy (the default): SHAPE in a round where it is
    predicted to beat every chain (1..k_max deep) and a plain step by TIE_TOLERANCE; in every
    other round the chain or plain step that adaptive K chooses (`chain`, drafting/adaptive.py:
    its K, its switch-off, price checks, probes, and reviews where the drafter offers them), so
    that where a tree's extra verify rows cost more than they bring (a CPU, where a row costs a
    good part of a step) `--tree` runs the chain loop's own policy and never below it. The tree
    is priced by AdaptiveTree's model with its candidates cut to the chains and SHAPE; adaptive
    K sees the chain rounds and plain steps only (a tree round's cost and acceptance are not a
    chain's).

    SHAPE's expected accepted drafts: a fixed shape's closed form from the acceptance table; a
    dynamic shape (built per round from the draft's confidence, trees/shapes.py DynamicShape)
    has none, so its own rounds' decayed mean, and before its first round the closed form of
    the best fixed tree of as many nodes (optimistic: it is tried, then priced from itself).
    Its verified nodes likewise: its rounds' decayed mean, before them `nodes` (T = 0's)."""

    def __init__(
        self,
        shape: Shape,
        k_init: int = 4,
        k_max: int = 8,
        ranks: int = 4,
        per_round: bool = False,
    ):
        super().__init__(k_init, k_max, max_nodes=1, ranks=ranks)
        self.shape = shape
        # The chains and plain steps: adaptive K over the tree loop's rounds (TreeDrafter.method);
        # `per_round`: a block draft's, one forward a chain whatever its K, priced as adaptive K
        # prices the block chain loop's rounds (drafting/adaptive.py ROUND_COST)
        method = TreeDrafter.method
        self.chain = AdaptiveK(
            k_init, k_max, drafter=method, per_round=(method,) if per_round else ()
        )
        self._rounds = 0.0  # decayed count of SHAPE's rounds, and their accepted and nodes sums
        self._accepted = self._nodes = 0.0

    def seed(self, *costs: Any) -> None:
        """AdaptiveTree's seed (the same costs), and adaptive K's from its chain costs."""
        super().seed(*costs)
        chain, verify = self._seeds.draft, self._seeds.verify
        self.chain.seed({} if chain is None else {TreeDrafter.method: chain}, verify)

    def observe(self, r: Round) -> None:
        super().observe(r)
        if r.drafted > 0 and cost_key(r.drafted, r.k)[0] == "tree":
            self._rounds = ALPHA_DECAY * self._rounds + 1.0
            self._accepted = ALPHA_DECAY * self._accepted + r.accepted
            self._nodes = ALPHA_DECAY * self._nodes + r.drafted
        else:
            self.chain.observe(r)

    # Reviews (drafting/review.py Reviewer) are adaptive K's: a review's values are the draft's
    # acceptance of the chain rounds, which the tree loop's rounds carry as TreeDrafter.method.
    def review_on(self) -> None:
        self.chain.review_on()

    def review(self, r: Review) -> None:
        self.chain.review(dataclasses.replace(r, method=TreeDrafter.method))

    def review_due(self) -> bool:
        return self.chain.review_due()

    def lookup_review_due(self) -> bool:
        return self.chain.lookup_review_due()

    def nodes(self, shape: Shape) -> int:
        if shape is not self.shape or isinstance(shape, FixedShape):
            return shape.size
        if self._rounds:
            return max(1, round(self._nodes / self._rounds))
        return min(shape.size, shape.nodes)

    def candidates(self) -> list[tuple[float, Shape]]:
        """The chains 1..k_max deep (AdaptiveTree's first candidates) and SHAPE."""
        chains = super().candidates()[: self.k_max]
        table = self.accept.table()
        if isinstance(self.shape, FixedShape):
            expected = expected_accepted(self.shape.paths, table)
        elif self._rounds:
            expected = self._accepted / self._rounds
        else:
            n = self.nodes(self.shape)
            expected = sum(p for _, p in greedy_nodes(table, n, self.shape.depth, self.ranks))
        return [*chains, (expected, self.shape)]

    def tree_pays(self) -> bool:
        """Whether SHAPE's predicted rate beats every chain's and a plain step's by
        TIE_TOLERANCE (False before the costs are known)."""
        rated = self.rates()
        if rated is None:
            return False
        tree = next(rate for rate, shape in rated if shape is self.shape)
        others = max(rate for rate, shape in rated if shape is not self.shape)
        return tree * (1 - TIE_TOLERANCE) > others

    def decide(self) -> Shape:
        """SHAPE where it pays, else adaptive K's chain (a plain step for K = 0)."""
        k = self.chain.decide()
        shape = self.shape if self.tree_pays() else FixedShape(chain_shape(k))
        self.chosen.append(shape)
        return shape
