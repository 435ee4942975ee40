"""Tree shapes, the tree closed form and the adaptive shape policy (pure: no models)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from edgespec.acceptance import Review
from edgespec.config import SpecConfig, parse_tree_spec
from edgespec.drafting.adaptive import PRICE_STEPS, PRIOR_ALPHA, AdaptiveK
from edgespec.errors import ConfigError
from edgespec.events import Round, expected_tokens_per_round
from edgespec.trees.build import make_shape_policy
from edgespec.trees.fallback import FallbackTree
from edgespec.trees.loop import FixedPolicy
from edgespec.trees.policy import AcceptanceTable, AdaptiveTree, cost_key
from edgespec.trees.shapes import (
    DynamicShape,
    FixedShape,
    Tree,
    chain_shape,
    expected_accepted,
    greedy_nodes,
    path_probability,
    shape_tree,
    widths_shape,
)


def test_widths_and_tree_golden():
    paths = widths_shape([3, 2, 1])
    assert paths == ((0,), (1,), (2,), (0, 0), (0, 1), (0, 0, 0))
    tree = shape_tree(paths)
    assert tree.parents == (-1, -1, -1, 0, 0, 3)
    assert tree.depths == (1, 1, 1, 2, 2, 3) and tree.ranks == (0, 1, 2, 0, 1, 0)
    assert tree.path(5) == [0, 3, 5] and tree.rank_path(4) == (0, 1)
    assert tree.child_table().tolist() == [
        [1, 2, 3],
        [4, 5, -1],
        [-1] * 3,
        [-1] * 3,
        [6, -1, -1],
        [-1] * 3,
        [-1] * 3,
    ]
    with pytest.raises(ValueError, match="parent or an earlier sibling"):
        shape_tree([(0,), (2,)])
    with pytest.raises(ValueError, match="must come before"):
        Tree((-1, 2, 0))


@pytest.mark.parametrize("text", ["3,2,1,1", " 2,2 ", "chain", "Dynamic", "auto", "dynamic:12"])
def test_tree_specs_accepted(text):
    assert SpecConfig(tree=text).tree == text.strip().lower().replace(" ", "")


@pytest.mark.parametrize(
    "text", ["3,0", "wide", "1,1,1,1,1,1,1,1,1", "64,1", "3;2", "dynamic:0", "dynamic:99"]
)
def test_bad_tree_specs_are_one_line_errors(text):
    with pytest.raises(ConfigError) as err:
        parse_tree_spec(text)
    assert "\n" not in str(err.value) and "--tree" in str(err.value)


def test_dynamic_shapes_at_a_temperature_keep_within_their_node_budget():
    assert DynamicShape(4).size == 4 + 3 * 16  # drawn at T = 0, then the best 24 kept
    sampled = DynamicShape(4).sampled()  # nothing may be dropped at T > 0
    assert (sampled.beam, sampled.width, sampled.size) == (2, 2, 14)
    assert DynamicShape(3, nodes=2).sampled().size == 3  # a chain when nothing wider fits


def test_tree_needs_a_draft_method():
    with pytest.raises(ConfigError, match="--method draft, hybrid, block or block-tree"):
        SpecConfig(method="ngram", tree="2,1")


def test_closed_form_golden_and_chain_case():
    accept = [[0.6, 0.5]]
    assert path_probability((1,), accept) == pytest.approx(0.2)
    assert expected_accepted(widths_shape([2, 1]), accept) == pytest.approx(0.6 + 0.2 + 0.36)
    for alpha in (0.0, 0.3, 0.8, 1.0):
        for k in (1, 4):
            want = expected_tokens_per_round(alpha, k) - 1
            assert expected_accepted(chain_shape(k), [[alpha]]) == pytest.approx(want)


def _walk(rng: np.random.Generator, tree: Tree, accept) -> int:
    """Simulate the acceptance walk: at each node try the children in rank order."""
    cur, n = -1, 0
    while True:
        for c in tree.kids[cur + 1]:
            row = accept[min(tree.depths[c] - 1, len(accept) - 1)]
            if rng.random() < row[tree.ranks[c]]:
                cur, n = c, n + 1
                break
        else:
            return n


def test_closed_form_matches_simulated_walks():
    rng = np.random.default_rng(0)
    accept = [[0.7, 0.4, 0.3], [0.6, 0.35, 0.2], [0.5, 0.3, 0.1]]
    for widths in ([1, 1, 1], [3, 2, 1], [2, 2, 2]):
        paths = widths_shape(widths)
        tree = shape_tree(paths)
        sim = np.mean([_walk(rng, tree, accept) for _ in range(40_000)])
        assert sim == pytest.approx(expected_accepted(paths, accept), abs=0.02)


def _valid(paths: set) -> bool:
    return all(
        (len(p) == 1 or p[:-1] in paths) and (p[-1] == 0 or p[:-1] + (p[-1] - 1,) in paths)
        for p in paths
    )


def test_greedy_nodes_prefixes_are_optimal_by_brute_force():
    accept = [[0.8, 0.5], [0.6, 0.3], [0.4, 0.2]]
    universe = [p for d in (1, 2, 3) for p in itertools.product(range(2), repeat=d)]
    best_by_size: dict[int, float] = {}
    for mask in range(1, 1 << len(universe)):
        paths = {p for i, p in enumerate(universe) if mask >> i & 1}
        if _valid(paths):
            value = expected_accepted(list(paths), accept)
            best_by_size[len(paths)] = max(best_by_size.get(len(paths), 0.0), value)
    for n, value in best_by_size.items():
        got = [p for p, _ in greedy_nodes(accept, n, 3, 2)]  # AdaptiveTree's shape of n nodes
        assert _valid(set(got)) and len(got) == n
        assert expected_accepted(got, accept) == pytest.approx(value)


def _greedy_by_sorting(accept, nodes: int, max_depth: int, max_rank: int):
    """greedy_nodes as it was first written: each step the likeliest node of the frontier by a
    full scan, every path's probability from scratch (path_probability)."""
    chosen, frontier = [], {(0,): path_probability((0,), accept)}
    while frontier and len(chosen) < nodes:
        best = max(frontier, key=lambda p: (frontier[p], -len(p), [-r for r in p]))
        chosen.append((best, frontier.pop(best)))
        grown = [best + (0,)] if len(best) < max_depth else []
        grown += [best[:-1] + (best[-1] + 1,)] if best[-1] + 1 < max_rank else []
        for p in grown:
            frontier[p] = path_probability(p, accept)
    return chosen


@pytest.mark.parametrize("seed", range(40))
def test_greedy_nodes_is_the_scan_it_replaced_node_for_node(seed: int) -> None:
    """The heap and the products grown from the parent give the same nodes, in the same order,
    with the same floats as the scan over path probabilities made from scratch: ties included
    (rates of 0.5, 0 and 1 make equal probabilities; ties go to the shallower node, then to the
    lower ranks), rows shorter than the ranks, and fewer rows than depths."""
    rng = np.random.default_rng(seed)
    depths, ranks = int(rng.integers(1, 9)), int(rng.integers(1, 5))
    rows = int(rng.integers(1, depths + 1))
    pool = [0.0, 0.5, 1.0, 0.25] if seed % 2 else None
    accept = [
        [
            float(rng.choice(pool)) if pool else float(rng.random())
            for _ in range(int(rng.integers(1, ranks + 2)))
        ]
        for _ in range(rows)
    ]
    nodes = int(rng.integers(1, 40))
    assert greedy_nodes(accept, nodes, depths, ranks) == _greedy_by_sorting(
        accept, nodes, depths, ranks
    )


def _round(nodes: int, depth: int, t_draft: float, t_verify: float) -> Round:
    return Round(0, nodes, 0, depth, t_draft, t_verify, "tree", True, 0, nodes, 0)


def _trained(
    verify_slope: float, rank1: float, lengths: tuple[int, ...] = (1, 2, 5, 9, 17)
) -> AdaptiveTree:
    """A policy fed synthetic outcomes: rank-0 candidates accepted 60% of the time, rank-1 ones
    `rank1` of the time after a rejection; a verify of L tokens costs 1 + slope (L - 1)."""
    policy = AdaptiveTree(k_init=2, k_max=4)
    tree = shape_tree(widths_shape([2, 2, 2, 2]))
    rng = np.random.default_rng(1)
    for _ in range(60):
        policy.observe_path(tree, tree.path(_sim_path(rng, tree, rank1)))
    for length in lengths:
        for _ in range(3):
            policy.observe(
                _round(
                    length - 1, max(1, min(4, length - 1)), 0.05, 1 + verify_slope * (length - 1)
                )
            )
    return policy


def _sim_path(rng, tree: Tree, rank1: float) -> int:
    cur = -1
    while True:
        for c in tree.kids[cur + 1]:
            if rng.random() < (0.6 if tree.ranks[c] == 0 else rank1):
                cur = c
                break
        else:
            return cur


def test_adaptive_picks_trees_where_wide_verifies_are_cheap():
    shape = _trained(verify_slope=0.0, rank1=0.5).decide()
    assert isinstance(shape, FixedShape) and shape.size > shape.depth  # a tree, not a chain


def test_adaptive_falls_back_to_a_chain_where_wide_verifies_are_dear():
    shape = _trained(verify_slope=0.3, rank1=0.5).decide()
    assert shape.size == shape.depth  # a chain (or a plain step)


def test_first_tree_round_at_each_length_is_left_out_of_the_costs():
    """The first verify of a tree length pays its trace; one such outlier must not price trees
    out. Chain rounds count from the first, as adaptive K's do."""
    policy = AdaptiveTree(k_init=2, k_max=4)
    policy.observe(_round(2, 2, 0.05, 9.0))  # a chain: counted
    assert policy.verify_costs["chain"][3].value == 9.0
    assert policy.draft_costs[("chain", 1)].value == 0.025
    assert policy.rates() is not None  # the second round decides from costs (as AdaptiveK's)
    policy.observe(_round(6, 2, 0.2, 9.0))  # the first tree round at (7, 2): traced, left out
    assert policy.verify_costs["tree"] == {} and ("tree", 3) not in policy.draft_costs
    policy.observe(_round(6, 2, 0.2, 1.0))
    assert policy.verify_costs["tree"][7].value == 1.0
    assert policy.draft_costs[("tree", 3)].value == 0.1


def test_chains_and_trees_are_priced_apart():
    """A tree whose masked forwards cost more than the chain's steps is priced by its own cost:
    with the same acceptance and chain costs, cheap tree costs pick a tree and dear ones a chain."""
    cheap, dear = _trained(0.0, 0.5, lengths=(1, 2, 5)), _trained(0.0, 0.5, lengths=(1, 2, 5))
    for policy, (draft, verify) in ((cheap, (0.0125, 1.0)), (dear, (0.4, 3.0))):
        for nodes, depth in ((8, 4), (16, 4)) * 3:
            policy.observe(_round(nodes, depth, draft * depth, verify))
    assert cheap._draft_cost("tree", 4) == pytest.approx(0.0125)
    assert dear._draft_cost("tree", 4) == pytest.approx(0.4)
    assert dear._draft_cost("tree", 3) == pytest.approx(0.4)  # the dearest narrower width
    assert dear._draft_cost("chain", 1) == pytest.approx(0.0125)  # tree rounds left it alone
    assert dear._verify_means("chain")[5] == pytest.approx(1.0)  # chains keep their own curve
    assert dear._verify_means("tree") == {9: pytest.approx(3.0), 17: pytest.approx(3.0)}
    shape = cheap.decide()
    assert shape.size > shape.depth  # a tree
    shape = dear.decide()
    assert 0 < shape.size == shape.depth  # a chain


def test_one_slow_chain_sample_does_not_price_chains_out():
    """Once trees win, chains are not timed again: a chain costs at most a tree of the same length
    (the same forward without the mask), so a busy core's one slow chain verify (10x) does not
    keep chains out where they are the better choice."""
    policy = _trained(0.3, 0.05, lengths=(2,))  # chain verifies of 2 tokens: 1.3
    policy.verify_costs["chain"][2].samples.clear()
    policy.verify_costs["chain"][2].add(13.0)  # ... but the one left a busy core made 10x dearer
    for _ in range(3):
        policy.observe(_round(2, 1, 0.05, 1.6))  # trees of 2 candidates: 3 tokens, 1.6
    assert policy._verify_means("chain") == {2: 13.0}
    shape = policy.decide()
    assert 0 < shape.size == shape.depth  # a chain again (rank 1 is rarely accepted)
    assert policy._draft_cost("chain", 1) == pytest.approx(0.05)


def _fallback(shape, verify_slope: float, rank1: float) -> FallbackTree:
    """A FallbackTree fed _trained's outcomes and costs."""
    trained = _trained(verify_slope, rank1)
    policy = FallbackTree(shape, k_init=2, k_max=4)
    policy.accept, policy.draft_costs, policy.verify_costs = (
        trained.accept, trained.draft_costs, trained.verify_costs,
    )  # fmt: skip
    return policy


@pytest.mark.parametrize("shape", [FixedShape(widths_shape([2, 2, 2, 2])), DynamicShape(depth=4)])
def test_fallback_keeps_its_tree_where_wide_verifies_are_cheap(shape):
    assert _fallback(shape, verify_slope=0.0, rank1=0.5).decide() is shape


@pytest.mark.parametrize("shape", [FixedShape(widths_shape([2, 2, 2, 2])), DynamicShape(depth=4)])
def test_fallback_runs_a_chain_where_the_trees_rows_cost_more_than_they_bring(shape):
    """Only the user's tree, the chains and a plain step are candidates: where a row costs 0.3
    of a step, a chain (never another tree)."""
    got = _fallback(shape, verify_slope=0.3, rank1=0.5).decide()
    assert got is not shape and got.size == got.depth


def test_fallback_prices_a_dynamic_tree_from_its_own_rounds():
    """A dynamic tree is priced by what its rounds accepted and verified: a tree that kept 24
    nodes and accepted nothing falls back to a chain even where rows are cheap."""
    shape = DynamicShape(depth=4)
    policy = _fallback(shape, verify_slope=0.0, rank1=0.5)
    for _ in range(12):
        policy.observe(Round(0, 24, 0, 4, 0.2, 1.0, "draft", True, 0, 24, 0))
    assert policy.nodes(shape) == 24
    got = policy.decide()
    assert got is not shape and got.size == got.depth


def test_an_untimed_tree_is_priced_by_the_calibrations_tree_to_chain_ratio():
    """Before a request times its first tree verify, the tree is priced from the chain's line,
    times what a tree cost over a chain at that length in the warm-up (the calibration). Where
    the chain's verifies are flat, a 25-row dynamic tree is tried unseeded; seeded with a tree
    verify 3x the chain's, the first round is a chain."""
    shape = DynamicShape(depth=4)
    policies = []
    for _ in range(2):
        trained = _trained(0.0, 0.5, lengths=(1, 2, 5))  # chains only: no tree timed
        policy = FallbackTree(shape, k_init=2, k_max=4)
        policy.accept, policy.draft_costs, policy.verify_costs = (
            trained.accept, trained.draft_costs, trained.verify_costs,
        )  # fmt: skip
        policies.append(policy)
    unseeded, seeded = policies
    assert unseeded.decide() is shape
    seeded.seed({"draft": 0.05}, {1: 1.0, 2: 1.0, 5: 1.0}, {7: 0.06}, {25: 3.0})
    assert seeded._untimed_tree(lambda L: 1.0)(25) == pytest.approx(3.0)
    got = seeded.decide()
    assert got is not shape and got.size == got.depth
    # once the request timed its own tree verifies, those price it (cheap here: the tree again)
    for _ in range(3):
        seeded.observe(Round(0, 24, 2, 4, 0.2, 1.0, "draft", True, 0, 24, 0))
    assert seeded._verify_means("tree") == {25: 1.0}


def test_seeded_chain_costs_are_scaled_to_the_requests_own():
    """The calibration's chain verifies price the lengths a request has not timed, scaled by
    its own against them where both are (a longer context, a busier machine); a tree's draft
    forward by the calibration's ratio to a chain step."""
    policy = AdaptiveTree(k_init=2, k_max=4)
    policy.seed({"tree": 0.01}, {1: 1.0, 5: 2.0}, {2: 0.015, 4: 0.03}, {9: 3.0})
    assert policy._chain_means() == {1: 1.0, 5: 2.0}
    assert policy.rates() is not None  # priced from the first round
    policy.observe(_round(4, 4, 0.08, 3.0))  # a chain of 4: 5 tokens, 1.5x the seed
    assert policy._chain_means() == {1: pytest.approx(1.5), 5: pytest.approx(3.0)}
    assert policy._draft_cost("tree", 3) == pytest.approx(policy._draft_cost("chain", 1) * 1.5)


def test_tree_flag_falls_back_unless_adaptive_is_off():
    assert isinstance(make_shape_policy(SpecConfig(k=3, tree="3,2,1")), FallbackTree)
    assert isinstance(make_shape_policy(SpecConfig(k=3, tree="dynamic")), FallbackTree)
    fixed = make_shape_policy(SpecConfig(k=3, tree="3,2,1", adaptive=False))
    assert isinstance(fixed, FixedPolicy)
    assert isinstance(make_shape_policy(SpecConfig(k=3, tree="chain")), FixedPolicy)
    assert isinstance(make_shape_policy(SpecConfig(k=3, tree="auto")), AdaptiveTree)


def test_tree_policy_times_plain_steps_once_where_the_choice_hangs_on_them():
    """As AdaptiveK's price check: on an M2-like cliff (a 2-row verify 1.725 steps) a plain step
    is priced 1.57 from it while it costs 1.0; a few plain steps are timed once, and then plain
    steps win where the draft is accepted 30% of the time."""
    policy = AdaptiveTree(k_init=1, k_max=4)
    chain = shape_tree(chain_shape(1))
    rng = np.random.default_rng(0)
    for i in range(40):
        shape = policy.decide()
        if shape.size == 0:
            policy.observe(Round(i, 0, 0, 0, 0.0, 1.0, "draft", True))
            continue
        ok = rng.random() < 0.3
        policy.observe_path(shape.tree, [0] if ok and shape.size == 1 else [])
        rows = shape.size + 1
        policy.observe(Round(i, shape.size, int(ok), shape.depth, 0.05 * shape.depth,
                             1.725 + 0.05 * (rows - 2), "draft", True, 0, shape.size, 0))  # fmt: skip
    sizes = [s.size for s in policy.chosen]
    first = sizes.index(0)
    assert sizes[first : first + PRICE_STEPS] == [0] * PRICE_STEPS
    assert sizes[-10:].count(0) >= 9
    assert chain.size == 1


def test_cost_key():
    assert cost_key(4, 4) == ("chain", 1) and cost_key(0, 0) == ("chain", 1)
    assert cost_key(7, 4) == ("tree", 2) and cost_key(16, 4) == ("tree", 4)


def test_acceptance_table_counts_tries_and_successes():
    table = AcceptanceTable(3, 2)
    tree = shape_tree(widths_shape([2, 2]))  # (0,), (1,), (0, 0), (0, 1)
    table.observe(tree, [1])  # rank 0 rejected, rank 1 accepted, nothing below node 1
    assert table.cells[0][0] == [0.0, 1.0] and table.cells[0][1] == [1.0, 1.0]
    table.observe(tree, [0])  # rank 0 accepted; both its children rejected
    assert table.cells[0][0][0] == pytest.approx(1.0) and table.cells[1][0][1] == pytest.approx(1.0)
    assert table.cells[1][1][1] == pytest.approx(1.0)


def test_policy_candidates_carry_their_closed_form():
    policy = _trained(verify_slope=0.05, rank1=0.4)
    table = policy.accept.table()
    candidates = policy.candidates()
    assert any(shape.size > shape.depth for _, shape in candidates)  # trees among them
    for expected, shape in candidates:
        assert expected == pytest.approx(expected_accepted(shape.paths, table))


def test_lookup_branch_merges_then_hangs_below_and_depth_cut():
    import mlx.core as mx

    from edgespec.trees.ngram_branch import add_branch
    from edgespec.trees.proposal import TreeProposal

    prop = TreeProposal(mx.array([5, 6, 7]), tree=Tree((-1, -1, 0)), fed=(10, -1, -1))
    merged = add_branch(prop, [5, 8, 9], match=3, vocab=20)
    assert merged.tree.parents == (-1, -1, 0, 0, 3) and merged.tokens.tolist() == [5, 6, 7, 8, 9]
    assert merged.tree.ranks[3] == 1 and merged.match == 3 and merged.fed == (10, -1, -1, -1, -1)
    q = mx.full((3, 20), 0.05)
    rows = add_branch(TreeProposal(prop.tokens, q, tree=prop.tree, fed=prop.fed), [6, 1], 2, 20).q
    assert rows is not None and rows.shape == (4, 20)  # 6 is node 1; only 1 is new
    assert rows[3].tolist() == np.eye(20)[1].tolist()
    cut = merged.cut(2)
    assert merged.cut(5) is merged and cut.method == "tree" and cut.match == 3
    assert cut.tree.parents == (-1, -1, 0, 0) and cut.tokens.tolist() == [5, 6, 7, 8]


@pytest.mark.parametrize("alpha", [0.15, 0.6, 0.9])
def test_fallback_runs_adaptive_ks_own_choices_where_its_tree_does_not_pay(alpha):
    """Where a verify row costs 0.3 of a step (no tree pays), `--tree`'s rounds are exactly the
    rounds adaptive K chooses over the same outcomes and costs: its K, its switch-off and its
    price checks and probes (a draft seldom accepted goes off, one often accepted drafts)."""
    rng = np.random.default_rng(7)
    policy = FallbackTree(DynamicShape(depth=4), k_init=2, k_max=4)
    chain = AdaptiveK(2, 4, drafter="tree")
    drafting = 0
    for i in range(200):
        shape, k = policy.decide(), chain.decide()
        assert shape.paths == chain_shape(k)
        drafting += k > 0
        accepted = next((j for j in range(k) if rng.random() > alpha), k)
        r = Round(i, k, accepted, k, 0.2 * k, 1 + 0.3 * k, "tree", True, context=100 + i)
        policy.observe_path(shape_tree(shape.paths), list(range(accepted)))
        policy.observe(r)
        chain.observe(r)
    assert (drafting < 50) if alpha < 0.5 else (drafting > 150)


def test_fallback_reads_reviews_as_its_chain_rounds():
    """A review of the draft model (method "draft") is folded into adaptive K's estimate of the
    tree loop's rounds (method "tree")."""
    policy = FallbackTree(DynamicShape(depth=4), k_init=2, k_max=4)
    policy.review_on()
    policy.review(Review("draft", (1.0, 1.0, 1.0)))
    assert policy.chain.estimates["tree"].alpha > PRIOR_ALPHA
    assert "draft" not in policy.chain.estimates


def test_a_block_tree_prices_its_chains_per_round():
    """`--method block-tree`: a chain round is one block forward whatever its K, so adaptive K
    prices it per round (as the block chain loop's rounds); a token draft's per drafted token."""
    block = make_shape_policy(SpecConfig(k=3, method="block-tree", tree="dynamic"))
    token = make_shape_policy(SpecConfig(k=3, method="draft", tree="dynamic"))
    assert isinstance(block, FallbackTree) and isinstance(token, FallbackTree)
    r = Round(0, 3, 1, 3, 0.03, 0.1, "tree", True)
    block.observe(r)
    token.observe(r)
    assert block.chain.estimates["tree"].draft_cost == pytest.approx(0.03)
    assert token.chain.estimates["tree"].draft_cost == pytest.approx(0.01)


def test_a_seeded_tree_policy_prices_a_long_contexts_plain_step_as_adaptive_k_does():
    """Seeded from a short warm-up, at a long context on a CPU (each row reads every key): this
    run's chain verifies cost far more than the calibration's, and more so the more rows. The
    calibration's plain step is priced as the seed scaled plus a cost a row (adaptive K's
    seeded_means), 5.4 here, not the seed times the median ratio (17.0), which made plain steps
    look three times their cost and kept `--tree auto` drafting (research/replay/, the xeon
    profile at 32K: 0.73x plain)."""
    policy = AdaptiveTree(k_init=2, k_max=4)
    policy.seed({"tree": 0.05}, {1: 1.0, 3: 1.2, 5: 1.4}, {}, {})
    for _ in range(3):
        policy.observe(_round(2, 2, 0.1, 14.6))
        policy.observe(_round(4, 4, 0.2, 23.8))
    assert policy._chain_means()[1] == pytest.approx(5.4, abs=0.05)
