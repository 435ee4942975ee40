"""Adaptive tree shapes: before each round, the chain or tree of highest predicted tokens per
second, from measured acceptance per depth and rank and measured costs (AdaptiveK's for chains,
edgespec/drafting/adaptive.py, extended to trees).

The closed form for a tree (edgespec/trees/shapes.py `expected_accepted`): the expected number of accepted
drafts is the sum over the tree's nodes of the probability that the path to the node is accepted,
where a rank-r candidate at depth d is accepted with a[d][r] once its elder siblings were rejected.
A chain is the tree of rank-0 nodes, and with a[d][0] = alpha this is the chain's
(1 - alpha^(K+1)) / (1 - alpha) - 1. A shape of N nodes and depth D costs D draft forwards (the
first over the pending tokens, then one per depth below) and one verify of N + 1 tokens:

    rate(shape) = (1 + E[accepted]) / (D * c(kind, w) + v_kind(N + 1)),   plain step: 1 / v(1)

Costs are measured per kind (tree loop: chain rounds run the chain drafter and the target's causal
forward, tree rounds masked forwards, and they cost differently): c(chain) per chain draft step,
c(tree, w) per tree draft forward at w = ceil(N / D) nodes per depth, v_chain(L) and v_tree(L) the
verify curves (edgespec/drafting/adaptive.py verify_curve) over each kind's rounds. An unmeasured
tree is priced from the chain's costs, scaled by what a tree cost against a chain in the warm-up's
calibration (`seed`: a masked 25-row verify here costs well above the chain's line at 25 rows),
tried, and then priced from its own.

For each node budget n the best shape is found greedily (the prefixes of shapes.greedy_nodes); the policy takes the
best rate over all budgets and chains (near-ties to the smaller tree), so where a wide verify costs
much more than a short one (this CPU) it falls back to a chain, or to plain steps, by itself.

a[d][r] is a decayed count of how often a rank-r candidate at depth d was accepted when tried,
shrunk towards the same rank's count over all depths (deep nodes are tried rarely), which is
shrunk towards a prior. The choice uses only past outcomes and measured costs, never the target's
view of the coming tokens, so exactness holds whatever it picks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from edgespec.drafting.adaptive import (
    ALPHA_DECAY,
    OFF_AFTER,
    PRICE_EDGE,
    PRICE_STEPS,
    PRICE_TRIES,
    TIE_TOLERANCE,
    seeded_means,
)
from edgespec.drafting.costs import Probes, Timings, cost_key, verify_curve
from edgespec.events import Round
from edgespec.trees.shapes import (
    FixedShape,
    Shape,
    Tree,
    chain_shape,
    greedy_nodes,
)

PRIOR_RANK = (0.5, 0.3, 0.2, 0.15)  # acceptance of a rank-r candidate before any is seen
PRIOR_WEIGHT = 2.0
DEPTH_WEIGHT = 3.0  # a depth's own counts weigh against this many trials of the rank's pool
MAX_NODES = 16


class AcceptanceTable:
    """Decayed (accepted, tried) counts per (depth, rank) and per rank."""

    def __init__(self, depths: int, ranks: int):
        self.depths, self.ranks = depths, ranks
        self.cells = [[[0.0, 0.0] for _ in range(ranks)] for _ in range(depths)]
        self.pool = [[PRIOR_RANK[r] * PRIOR_WEIGHT, PRIOR_WEIGHT] for r in range(ranks)]

    def observe(self, tree: Tree, path: list[int]) -> None:
        """One round's outcome: along the path each node's elder siblings were tried and
        rejected and the node accepted; below the path's end all children were rejected."""
        for cells in [*self.cells, self.pool]:
            for cell in cells:
                cell[0] *= ALPHA_DECAY
                cell[1] *= ALPHA_DECAY
        stop = path[-1] if path else -1
        tried = [(node, True) for node in path]
        tried += [(kid, False) for kid in tree.kids[stop + 1]]
        for node, ok in tried:
            d, r = tree.depths[node] - 1, tree.ranks[node]
            if d < self.depths and r < self.ranks:
                for cell in (self.cells[d][r], self.pool[r]):
                    cell[0] += 1.0 if ok else 0.0
                    cell[1] += 1.0
            for elder in tree.kids[tree.parents[node] + 1][: tree.ranks[node]] if ok else ():
                d2, r2 = tree.depths[elder] - 1, tree.ranks[elder]
                if d2 < self.depths and r2 < self.ranks:
                    self.cells[d2][r2][1] += 1.0
                    self.pool[r2][1] += 1.0

    def table(self) -> list[list[float]]:
        """a[d][r]: each depth's counts shrunk towards the rank's pooled estimate."""
        pooled = [acc / tried for acc, tried in self.pool]
        return [
            [(c[0] + DEPTH_WEIGHT * pooled[r]) / (c[1] + DEPTH_WEIGHT) for r, c in enumerate(row)]
            for row in self.cells
        ]


@dataclass(frozen=True)
class Seeds:
    """A calibration's costs (AdaptiveTree.seed): seconds per chain draft step, per chain
    verify of L, per tree draft forward of width w, per tree verify of L."""

    draft: float | None = None
    verify: dict[int, float] = field(default_factory=dict)
    tree_draft: dict[int, float] = field(default_factory=dict)
    tree_verify: dict[int, float] = field(default_factory=dict)

    def tree_draft_ratio(self, width: int) -> float | None:
        """A tree draft forward `width` wide over a chain step (at least 1), from the width's
        seed, else the nearest narrower one's, else the nearest wider; None without seeds.
        Example: draft 0.01, tree_draft {2: 0.015, 4: 0.03}: width 3 -> 1.5, width 1 -> 1.5."""
        if not self.draft or not self.tree_draft:
            return None
        below = [w for w in self.tree_draft if w <= width]
        w = max(below) if below else min(self.tree_draft)
        return max(1.0, self.tree_draft[w] / self.draft)

    @cached_property
    def verify_curves(self) -> tuple[Callable[[int], float], Callable[[int], float]] | None:
        """(tree, chain) verify curves of the seeds, fitted once (`_untimed_tree` prices with
        them every round); None without both."""
        if not (self.tree_verify and self.verify):
            return None
        return verify_curve(self.tree_verify), verify_curve(self.verify)


class AdaptiveTree:
    """ShapePolicy (edgespec/trees/loop.py) choosing chains, trees or plain steps per round."""

    def __init__(self, k_init: int = 4, k_max: int = 8, max_nodes: int = MAX_NODES, ranks: int = 4):
        self.k_init, self.k_max, self.max_nodes, self.ranks = k_init, k_max, max_nodes, ranks
        self.accept = AcceptanceTable(k_max, ranks)
        # seconds per draft forward (one per depth), by cost_key: (kind, nodes per depth)
        self.draft_costs: Timings[tuple[str, int]] = Timings()
        # verified tokens L -> recent verify seconds, chains (plain steps too) and trees apart
        self.verify_costs: dict[str, Timings[int]] = {"chain": Timings(), "tree": Timings()}
        self.chosen: list[Shape] = []
        self._after_plain = False
        self._lengths_seen: set[tuple[int, int]] = set()  # (verify length, depth) of tree rounds
        self._probes = Probes()
        self._price_tries, self._pricing = PRICE_TRIES, 0  # price checks left, steps left
        self._seeds = Seeds()

    def seed(
        self,
        draft: dict[str, float],
        verify: dict[int, float],
        tree_draft: dict[int, float],
        tree_verify: dict[int, float],
    ) -> None:
        """Start from a calibration's costs (edgespec/calibration.py: medians per chain draft
        method (the tree loop's "tree", else "draft") and verify length, per tree draft width
        and verify length): the chain's draft cost as one timing, soon outvoted; its verify
        lengths priced from the seeds scaled to this run's own where it has timed some
        (`_chain_means`), and an untimed tree by the seeds' tree-to-chain ratios
        (`_untimed_tree`, `_draft_cost`)."""
        chain = draft.get("tree", draft.get("draft"))
        if chain is not None:
            self.draft_costs.add(("chain", 1), chain)
        self._seeds = Seeds(chain, dict(verify), dict(tree_draft), dict(tree_verify))

    def observe_path(self, tree: Tree, path: list[int]) -> None:
        self.accept.observe(tree, path)

    def observe(self, r: Round) -> None:
        """One round's costs, chains and trees apart (module docstring). Chains count every
        round, as AdaptiveK does. The first tree round at each (verify length, depth) is left
        out: it traces that length's compiled blocks on the CPU (kernels on a GPU), and with the
        many lengths trees reach, one such outlier kept as a length's only sample priced trees
        out for good. (Leaving out first chain rounds too cost two exploration rounds per chain
        length, 4% of adaptive-tree's CPU time on MT-bench, where adaptive K pays one.)"""
        kind, width = cost_key(r.drafted, r.k)
        first = kind == "tree" and (r.drafted + 1, r.k) not in self._lengths_seen
        if kind == "tree":
            self._lengths_seen.add((r.drafted + 1, r.k))
        if r.drafted > 0 and r.timed and not self._after_plain and not first:
            self.draft_costs.add((kind, width), r.t_draft / max(r.k, 1))
        self._after_plain = r.drafted == 0
        if r.timed and not first:
            self.verify_costs[kind].add(r.drafted + 1, r.t_verify)

    def _chain_means(self) -> dict[int, float]:
        """The chain's verify seconds per L: this run's medians, and at lengths it has not timed
        the calibration's, as adaptive K reads them (drafting/adaptive.py seeded_means): scaled
        by the median ratio of this run's to them where both are, or, where this run's cost
        well over the calibration's (a long context), the calibration's scaled plus a cost a
        row. Example: seeds {1: 1.0, 5: 2.0}, own {5: 1.2} -> {1: 0.6, 5: 1.2}."""
        return seeded_means(self._seeds.verify, self._verify_means("chain"))

    def _untimed_tree(self, chain: Callable[[int], float]) -> Callable[[int], float]:
        """A tree verify's price before one was timed: the chain's at the same length, times
        what a tree cost over a chain at that length in the calibration (never less than the
        chain's); the chain's alone without one."""
        curves = self._seeds.verify_curves
        if curves is None:
            return chain
        tree, flat = curves
        return lambda L: chain(L) * max(1.0, tree(L) / flat(L))

    def _verify_means(self, kind: str) -> dict[int, float]:
        """Verified tokens L -> the median of its recent verify seconds (kind "chain", whose
        plain steps count too, or "tree")."""
        return self.verify_costs[kind].medians()

    def _draft_cost(self, kind: str, width: int) -> float | None:
        """Seconds per draft forward of a round of `kind` whose depths run `width` nodes on
        average: measured, else the dearest measured narrower one (more nodes never cost less),
        else the chain's, times the calibration's ratio of a tree forward at that width (or the
        nearest below, else above) to a chain step, never below 1 (a tree is tried once and then
        priced from what it cost). A chain step costs at most the cheapest measured forward:
        once trees win, chains are no longer timed, and one slow chain sample (a busy core)
        kept them priced out for good."""
        measured = self.draft_costs.medians()
        if kind == "chain" and measured:
            return min(measured.values())
        if (kind, width) in measured:
            return measured[(kind, width)]
        narrower = [t for (k, w), t in measured.items() if k == kind and w < width]
        if narrower:
            return max(narrower)
        chain = measured.get(("chain", 1))
        ratio = self._seeds.tree_draft_ratio(width)
        return chain if chain is None or ratio is None else chain * ratio

    def candidates(self) -> list[tuple[float, Shape]]:
        """(expected accepted drafts, shape) of the chains 1..k_max deep and the best tree of
        every node budget up to max_nodes (the greedy order's prefixes, shapes.greedy_nodes)."""
        table = self.accept.table()
        out: list[tuple[float, Shape]] = []
        chain_e, reach = 0.0, 1.0
        for k in range(1, self.k_max + 1):
            reach *= table[min(k, len(table)) - 1][0]
            chain_e += reach
            out.append((chain_e, FixedShape(chain_shape(k))))
        order = greedy_nodes(table, self.max_nodes, self.k_max, self.ranks)
        total = 0.0
        for n, (_, prob) in enumerate(order, 1):
            total += prob
            paths = sorted((p for p, _ in order[:n]), key=lambda p: (len(p), p))
            if n > 1 and any(p[-1] for p in paths):  # chains are above
                out.append((total, FixedShape(tuple(paths))))
        return out

    def rates(self) -> list[tuple[float, Shape]] | None:
        """(predicted tokens per second, shape) of every candidate, the plain step last; None
        before the costs were measured. Chains: the chain draft's cost per forward and the chain
        verify curve; trees: the draft's cost per forward at their width, and the tree verify
        curve (the chain's until a tree verify was measured). A chain's verify costs at most a
        tree's of the same length (the same forward without the mask): the bound keeps one slow
        chain sample from pricing chains out while only trees are timed."""
        chain_means = self._chain_means()
        if self._draft_cost("chain", 1) is None or not chain_means:
            return None
        tree_means = self._verify_means("tree")
        chain_curve = verify_curve(chain_means)
        tree_curve = verify_curve(tree_means) if tree_means else self._untimed_tree(chain_curve)
        curves = {"tree": tree_curve, "chain": lambda L: min(chain_curve(L), tree_curve(L))}
        out: list[tuple[float, Shape]] = []
        for e, shape in self.candidates():
            nodes = self.nodes(shape)
            kind, width = cost_key(nodes, shape.depth)
            c = self._draft_cost(kind, width) or 0.0
            out.append(((1.0 + e) / (shape.depth * c + curves[kind](nodes + 1)), shape))
        out.append((1.0 / curves["chain"](1), FixedShape(())))
        return out

    def _price_check(self) -> bool:
        """Whether this round is a step of a price check, as AdaptiveK's (drafting/adaptive.py,
        PRICE_STEPS): a plain step is priced from the shortest verify until one is timed, off
        by up to ~1.9x; where drafting is predicted to win by less than PRICE_EDGE, a few plain
        steps are timed once."""
        if self._pricing > 0:
            self._pricing -= 1
            return True
        chain = self.verify_costs["chain"]
        timed = sum(len(m.samples) for m in chain.values())
        if not self._price_tries or 1 in self._chain_means() or timed < OFF_AFTER:
            return False
        rated = self.rates()
        if rated is None:
            return False
        plain, best = rated[-1][0], max(rate for rate, _ in rated[:-1])
        if not plain <= best < PRICE_EDGE * plain:
            return False
        self._price_tries, self._pricing = self._price_tries - 1, PRICE_STEPS - 1
        return True

    def nodes(self, shape: Shape) -> int:
        """The nodes a round of `shape` verifies (a fixed shape: its size)."""
        return shape.size

    def choose(self) -> Shape:
        """The best candidate, near-ties to the smaller one; a plain step only where it beats the
        best by the tolerance, with probe rounds (as AdaptiveK) while it does."""
        rated = self.rates()
        if rated is None:
            return FixedShape(chain_shape(self.k_init))
        plain = rated[-1]
        drafting = rated[:-1]
        best = max(rate for rate, _ in drafting)
        floor = best * (1 - TIE_TOLERANCE) * (1 - 1e-12)
        shape = min((s for r, s in drafting if r >= floor), key=lambda s: (s.size, s.depth))
        if plain[0] < best * (1 + TIE_TOLERANCE):
            self._probes.won()
            return shape
        # a probe: refresh the acceptance and the draft's cost
        return shape if self._probes.probe() else plain[1]

    def decide(self) -> Shape:
        """The next round's shape (recorded in `chosen`)."""
        shape = FixedShape(()) if self._price_check() else self.choose()
        self.chosen.append(shape)
        return shape
