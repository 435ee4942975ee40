"""Statistical losslessness of tree verification (edgespec/trees/tree_acceptance.py).

A synthetic target p and draft q that depend on the whole token prefix (seeded Dirichlet rows for
every prefix up to the tree's depth) drive 120k vectorised rounds: each draws its tree (siblings
without replacement from q, via the engine's own `draw_siblings`, or deterministic candidates) and
runs `verify_tree`. For every emitted position and every prefix of emitted tokens before it, the
emitted token must follow p(prefix): one chi-square test over all of them. The same test must FAIL
with each planted bug (a sibling tried against p instead of the residual; siblings drawn with
replacement), so it cannot pass vacuously. Plus the docstring's worked example, worked exactly,
and hand-made greedy cases.
"""

from __future__ import annotations

import itertools
import zlib

import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chi2

from edgespec.sampling import make_key, split
from edgespec.trees.shapes import Tree, shape_tree, widths_shape
from edgespec.trees.tree_acceptance import (
    draw_siblings,
    top_siblings,
    verify_tree,
    verify_tree_greedy,
)

V = 6
N_ROUNDS = 120_000
# A tree with branching below non-first candidates too: depth 3, 10 nodes.
PATHS = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (2, 0), (0, 0, 0), (0, 0, 1), (1, 0, 0)]


def _rows(rng: np.random.Generator, depth: int, alpha: float) -> list[np.ndarray]:
    """rows[level] [V**level, V]: a distribution for every prefix of that length."""
    return [
        rng.dirichlet([alpha] * V, size=V**level).astype(np.float32) for level in range(depth + 1)
    ]


def _simulate(
    tree: Tree, p_rows, q_rows, seed: int, bug: str | None = None, point: bool | str = False
):
    """N_ROUNDS rounds: draft the tree from q (per prefix), verify against p (per prefix).
    point=True: every candidate deterministic (the draft's top tokens); "last": each node's last
    child a deterministic lookup-like candidate (a fixed function of the prefix, which may repeat
    a sampled sibling), after siblings drawn without replacement.
    Returns (emitted tokens [B, depth + 1] with -1 past the round's end)."""
    kd, kv = split(make_key(seed), 2)
    ud = mx.random.uniform(shape=(N_ROUNDS, tree.size), key=kd)
    uv = mx.random.uniform(shape=(N_ROUNDS, tree.size + 1), key=kv)
    prefix = {-1: mx.zeros((N_ROUNDS,), dtype=mx.int32)}  # node -> index of its prefix
    x = [None] * tree.size
    q_node = [None] * tree.size
    for parent in range(-1, tree.size):
        kids = list(tree.kids[parent + 1])
        if not kids:
            continue
        level = tree.depths[parent] if parent >= 0 else 0
        q = mx.array(q_rows[level])[prefix[parent]]
        if point is True:  # deterministic candidates: the draft's top tokens, q = onehot
            toks = top_siblings(q, len(kids))
            rows = (mx.arange(V) == toks[..., None]).astype(mx.float32)
        elif point == "last" and len(kids) > 1:
            toks, rows = draw_siblings(q, ud[:, kids[0] : kids[-1]], len(kids) - 1)
            fixed = ((prefix[parent] * 7 + 3) % V).astype(mx.int32)[:, None]
            hot = (mx.arange(V) == fixed).astype(mx.float32)[:, None, :]
            toks = mx.concatenate([toks, fixed], axis=-1)
            rows = mx.concatenate([rows, hot], axis=-2)
        else:
            toks, rows = draw_siblings(
                q, ud[:, kids[0] : kids[-1] + 1], len(kids), replace=bug == "replace"
            )
        for j, node in enumerate(kids):
            x[node], q_node[node] = toks[:, j], rows[:, j]
            prefix[node] = prefix[parent] * V + toks[:, j]
    p = [mx.array(p_rows[0])[prefix[-1]]]
    p += [mx.array(p_rows[tree.depths[i]])[prefix[i]] for i in range(tree.size)]
    xs, qs, ps = mx.stack(x, axis=-1), mx.stack(q_node, axis=-2), mx.stack(p, axis=-2)
    cur, n, nxt = verify_tree(tree, xs, qs, ps, uv, bug="against-p" if bug == "against-p" else None)
    return _emitted(tree, np.array(xs), np.array(cur), np.array(n), np.array(nxt))


def _emitted(tree: Tree, xs, cur, n, nxt) -> np.ndarray:
    out = np.full((len(cur), tree.depth + 1), -1, dtype=np.int64)
    for b in range(len(cur)):
        path = tree.path(int(cur[b]) - 1)
        toks = [int(xs[b, i]) for i in path] + [int(nxt[b])]
        out[b, : len(toks)] = toks
    return out


def _cells(counts: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cells with expected count >= 5 kept, the rest pooled into one (into the largest cell when
    the pool expects less than 1)."""
    big = expected >= 5
    c, e = list(counts[big]), list(expected[big])
    pool_c, pool_e = counts[~big].sum(), expected[~big].sum()
    if pool_e >= 1:
        c.append(pool_c)
        e.append(pool_e)
    elif c:
        top = int(np.argmax(e))
        c[top] += pool_c
        e[top] += pool_e
    return np.array(c, dtype=np.float64), np.array(e)


def _chi_square(emitted: np.ndarray, p_rows) -> tuple[float, int, int]:
    """(statistic, dof, impossible tokens seen) over every emitted position and prefix of
    emitted tokens before it that was reached at least 50 times."""
    stat, dof, impossible = 0.0, 0, 0
    for j in range(emitted.shape[1]):
        reached = emitted[emitted[:, j] >= 0]
        keys = (
            reached[:, :j] @ (V ** np.arange(j - 1, -1, -1)) if j else np.zeros(len(reached), int)
        )
        for key in np.unique(keys):
            toks = reached[keys == key, j]
            p = p_rows[j][key].astype(np.float64)
            counts = np.bincount(toks, minlength=V)
            impossible += int(counts[p == 0].sum())
            if len(toks) < 50:
                continue
            c, e = _cells(counts[p > 0], p[p > 0] / p.sum() * len(toks))
            if len(c) < 2:
                continue
            stat += float(((c - e) ** 2 / e).sum())
            dof += len(c) - 1
    return stat, dof, impossible


def _p_value(tree, p_rows, q_rows, seed, bug=None, point=False) -> float:
    stat, dof, impossible = _chi_square(_simulate(tree, p_rows, q_rows, seed, bug, point), p_rows)
    assert dof > 20  # the test looks at many prefixes, not just the first token
    return 0.0 if impossible else float(chi2.sf(stat, dof))


CASES = [("flat", 1.0, 1.0), ("peaked", 0.3, 0.3), ("draft-flatter", 0.3, 2.0)]


@pytest.mark.parametrize("name,p_alpha,q_alpha", CASES)
def test_emitted_tokens_follow_the_target(name, p_alpha, q_alpha):
    # A seed that is the same in every process (str.__hash__ is salted per process: the rows, and
    # with them the p-value, changed each run, and about 1 run in 100 fell under 1e-3).
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    tree = shape_tree(PATHS)
    p_rows, q_rows = _rows(rng, tree.depth, p_alpha), _rows(rng, tree.depth, q_alpha)
    assert _p_value(tree, p_rows, q_rows, seed=1) > 1e-3


@pytest.mark.parametrize("point", [True, "last"])
def test_deterministic_candidates_follow_the_target(point):
    """Point-mass candidates (the draft's top-k at T = 0 semantics, or an n-gram branch's
    token after sampled siblings) verify exactly too."""
    rng = np.random.default_rng(7)
    tree = shape_tree(PATHS)
    p_rows, q_rows = _rows(rng, tree.depth, 0.5), _rows(rng, tree.depth, 0.5)
    assert _p_value(tree, p_rows, q_rows, seed=2, point=point) > 1e-3


@pytest.mark.parametrize("bug", ["against-p", "replace"])
def test_planted_bugs_are_caught(bug):
    """The same test with a sibling tried against p instead of the residual, or siblings drawn
    with replacement (while the test assumes without): it must fail."""
    rng = np.random.default_rng(0)  # fixed rows: str hashes change per process
    tree = shape_tree(PATHS)
    p_rows, q_rows = _rows(rng, tree.depth, 0.3), _rows(rng, tree.depth, 0.3)
    assert _p_value(tree, p_rows, q_rows, seed=1, bug=bug) < 1e-6


def test_worked_example_exactly():
    """The module docstring's example, over a grid of uniforms fine enough to be exact: two
    siblings from q = [.6, .3, .1] against p = [.3, .6, .1]; the first emitted token is p
    exactly, and a draft token is accepted with .925 (one draft: .7)."""
    tree = Tree((-1, -1))
    grid = (np.arange(20) + 0.5) / 20
    u_draw = np.array(list(itertools.product(grid, grid, grid)))
    q = mx.broadcast_to(mx.array([0.6, 0.3, 0.1]), (len(u_draw), 3))
    toks, rows = draw_siblings(q, mx.array(u_draw[:, :2], dtype=mx.float32), 2)
    p = mx.broadcast_to(mx.array([0.3, 0.6, 0.1]), (len(u_draw), 3, 3))
    u = np.stack([u_draw[:, 2], np.full(len(u_draw), 0.5), np.full(len(u_draw), 0.5)], axis=1)
    cur, n, nxt = verify_tree(tree, toks, rows, p, mx.array(u, dtype=mx.float32))
    cur, toks, nxt = np.array(cur), np.array(toks), np.array(nxt)
    first = np.where(cur > 0, toks[np.arange(len(cur)), np.maximum(cur - 1, 0)], nxt)
    assert np.allclose(np.bincount(first, minlength=3) / len(first), [0.3, 0.6, 0.1])
    assert np.isclose(np.array(n).mean(), 0.925)


def test_greedy_walk_golden_case():
    tree = Tree((-1, -1, 0))  # two candidates, a child below the first
    logits = mx.zeros((4, 10))
    best = [7, 1, 4, 2]  # argmax at the root, after node 0, node 1, node 2
    logits = mx.array(np.eye(10, dtype=np.float32)[best])
    assert [int(a) for a in verify_tree_greedy(tree, mx.array([5, 7, 9]), logits)] == [2, 1, 4]
    best = [5, 9, 0, 3]  # node 0 (5), then node 2 (9), then a bonus 3
    logits = mx.array(np.eye(10, dtype=np.float32)[best])
    assert [int(a) for a in verify_tree_greedy(tree, mx.array([5, 7, 9]), logits)] == [3, 2, 3]


def test_a_chain_shaped_tree_verifies_as_the_chain():
    from edgespec.acceptance import verify

    rng = np.random.default_rng(3)
    k, b = 3, 4096
    p = mx.array(rng.dirichlet([0.5] * V, size=(b, k + 1)).astype(np.float32))
    q = mx.array(rng.dirichlet([0.5] * V, size=(b, k)).astype(np.float32))
    x = mx.array(rng.integers(0, V, size=(b, k)).astype(np.int32))
    u = mx.random.uniform(shape=(b, k + 1), key=make_key(0))
    n_chain, next_chain = verify(x, q, p, u)
    _, n_tree, next_tree = verify_tree(shape_tree(widths_shape([1] * k)), x, q, p, u)
    assert np.array_equal(np.array(n_chain), np.array(n_tree))
    assert np.mean(np.array(next_chain) == np.array(next_tree)) > 0.999  # residual rounding


def test_siblings_are_distinct_and_rows_are_the_draw_distributions():
    q = mx.array([0.5, 0.3, 0.2])
    toks, rows = draw_siblings(q, mx.array([0.6, 0.1]), 2)
    assert toks.tolist() == [1, 0]
    assert np.allclose(np.array(rows), [[0.5, 0.3, 0.2], [0.5 / 0.7, 0, 0.2 / 0.7]])
    toks, rows = draw_siblings(mx.array([1.0, 0.0, 0.0]), mx.array([0.3, 0.3]), 2)
    assert (
        toks.tolist()[0] == 0 and np.array(rows)[1].tolist() == np.eye(3)[toks.tolist()[1]].tolist()
    )
    assert top_siblings(mx.array([0.1, 0.5, 0.5, 0.2]), 3).tolist() == [1, 2, 3]
