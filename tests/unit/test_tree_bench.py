"""The tree bench's folds (edgespec/bench/tree.py): acceptance by depth and rank from round
outcomes, and the closed form's tau, checked on hand-made outcomes."""

from __future__ import annotations

import pytest

from edgespec.bench.tree import acceptance_table, chain_outcome, predicted_tau, variants
from edgespec.events import Round
from edgespec.trees.shapes import shape_tree, widths_shape


def test_acceptance_by_depth_and_rank():
    tree = shape_tree(widths_shape([2, 1]))  # (0,), (1,), (0, 0)
    outcomes = [(tree, [0, 2]), (tree, [1]), (tree, [])]
    table = acceptance_table(outcomes, 2, 2)
    # depth 1 rank 0: tried 3 times, accepted once; rank 1: tried twice, accepted once;
    # depth 2 rank 0: tried once (below node 0), accepted once.
    assert table == [[pytest.approx(1 / 3), 0.5], [1.0, 0.0]]


def test_closed_form_tau_of_chain_rounds_with_plain_steps():
    rounds = [Round(i, 2, acc, 2, 0.0, 0.0) for i, acc in enumerate([2, 0, 1, 2])]
    outcomes = [chain_outcome(r) for r in rounds]
    # depth 1: 3 of 4 accepted; depth 2: 2 of 3 -> E = 0.75 + 0.75 * 2 / 3 = 1.25 per round
    assert predicted_tau(outcomes) == pytest.approx(2.25)
    assert predicted_tau(outcomes, plain_rounds=4) == pytest.approx((4 * 2.25 + 4) / 8)
    assert predicted_tau([]) is None


def test_variants_side_by_side():
    names = [v.name for v in variants(3, ["3,2,1", "dynamic"])]
    assert names == ["plain", "chain", "tree 3,2,1", "tree dynamic", "adaptive", "adaptive-tree"]
    assert all(v.spec is None or v.spec.k == 3 for v in variants(3, ["2,1"]))
