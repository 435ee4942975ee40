"""Verification of a draft tree in one round: pure MLX maths beside acceptance.py (the chain's).

Notation as in acceptance.py. The target's distribution at the root (after the newest committed
token) is p_0; at node i (after the path to it) p_{i+1}. A node's children c_1..c_m were drafted in
rank order: each c_j from q_j, the distribution the drafter drew it from, as given per node.
Siblings drawn WITHOUT replacement from the parent's draft distribution q have
q_1 = q, q_j = q with c_1..c_{j-1} removed and renormalised (`draw_siblings`); a deterministic
candidate (the draft's top-k at temperature 0, an n-gram lookup) has q_j = onehot(c_j).

Recursive rejection sampling (SpecInfer; Jeon et al., Recursive Speculative Decoding), one node:
start with r = p at that node. For j = 1..m accept c_j with probability min(1, r(c_j) / q_j(c_j));
on acceptance move to c_j (r = p at c_j) and repeat there; on rejection set
r <- norm(max(0, r - q_j)) and try c_{j+1}. When a node's children are all rejected (or it has
none: a bonus), sample the round's last token from r. The round commits the accepted path and that
token.

Why every emitted token follows p (induction over j, backwards): suppose trying c_{j+1}.. with
residual r' emits a token distributed as r' whatever c_{j+1}.. were drawn from (true after the last
sibling: r' is sampled directly). At step j, c_j ~ q_j and
    P(emit y) = P(c_j = y, accepted) + P(rejected) r'(y)
             = min(q_j(y), r(y)) + (1 - sum_x min(q_j, r)(x)) max(0, r - q_j)(y) / Z = r(y),
since Z = sum_x max(0, r - q_j)(x) = 1 - sum_x min(q_j, r)(x). The residual does not depend on
which c_j was drawn, only on q_j; and r' is emitted whatever q_{j+1} is, so q_{j+1} may depend on
c_1..c_j (without replacement, or a point mass after them). An accepted child continues at its own
node, where the same argument gives p there. What must NOT happen: c_j drawn from something other
than q_j (e.g. with replacement while q_j excludes the earlier siblings), or c_j tried against p
instead of the residual r. The tests plant both bugs (`bug=`) and check they are caught.

Worked example (V = 3; one node, two children drawn without replacement from q = [.6, .3, .1];
p = [.3, .6, .1]). c_1 = 0 (prob .6) is accepted with .3/.6 = .5: token 0 with .3. Rejected, r =
norm(max(0, p - q)) = [0, 1, 0] and c_2 ~ [0, .75, .25]: c_2 = 1 is accepted (1/.75 >= 1), token 1
with .6 * .5 * .75 = .225; c_2 = 2 is rejected (r(2) = 0), r stays [0, 1, 0], token 1 with .075.
c_1 = 1 (prob .3) is accepted with min(1, .6/.3) = 1: token 1 with .3; c_1 = 2 (prob .1) with
.1/.1 = 1: token 2 with .1. In all P = [.3, .6, .1] = p, and a draft token is accepted with .925,
where one draft from q is accepted with sum_x min(p, q)(x) = .7 (tests/unit/test_tree_acceptance.py
works this case exactly). A zero residual only arises when r == q_j, where c_j is accepted with
certainty; the guard (keep r) only absorbs rounding, as in acceptance.py.

Every function accepts leading batch dimensions; the tree topology is the same for the whole batch.
"""

from __future__ import annotations

import mlx.core as mx

from edgespec.acceptance import verify_greedy
from edgespec.config import SamplingConfig
from edgespec.sampling import Softmax, sample, sampler, uniforms
from edgespec.trees.shapes import Tree


def _rows(a: mx.array, index: mx.array) -> mx.array:
    """a [..., R, V], index [...] -> a[..., index, :] as [..., V]."""
    return mx.take_along_axis(a, index[..., None, None], axis=-2)[..., 0, :]


def _at(a: mx.array, index: mx.array) -> mx.array:
    """a [..., R], index [...] -> a[..., index]."""
    return mx.take_along_axis(a, index[..., None], axis=-1)[..., 0]


def verify_tree(
    tree: Tree,
    x: mx.array,
    q: mx.array | None,
    p: mx.array,
    u: mx.array,
    bug: str | None = None,
) -> tuple[mx.array, mx.array, mx.array]:
    """One round of recursive rejection sampling over a draft tree (module docstring).

    x [..., N] int node tokens; q [..., N, V] the distribution each node was drawn from (None:
    every node a deterministic candidate, q = onehot); p [..., N + 1, V] target probabilities (row
    0 the root, row i + 1 after node i); u [..., N + 1] uniforms: u[i] for node i's test, u[N] for
    the last sample. Returns (deepest accepted node [...] as a p row: 0 = none, i + 1 = node i;
    n_accepted [...]; next_token [...]). `bug` is for the tests only: "against-p" tries every
    sibling against p instead of the residual.
    """
    table = mx.array(tree.child_table())
    x = x.astype(mx.int32)
    vocab = p.shape[-1]
    cur = mx.zeros(x.shape[:-1], dtype=mx.int32)
    n = mx.zeros_like(cur)
    r = p[..., 0, :]
    going = mx.ones(cur.shape, dtype=mx.bool_)
    for _depth in range(tree.depth):
        took = mx.zeros(cur.shape, dtype=mx.bool_)
        for j in range(table.shape[1]):
            child = table[cur, j]
            tried = going & ~took & (child > 0)
            node = mx.maximum(child - 1, 0)
            tok = _at(x, node)
            if q is None:
                q_row = (mx.arange(vocab) == tok[..., None]).astype(p.dtype)
            else:
                q_row = _rows(q, node)
            qx, rx = _at(q_row, tok), _at(r, tok)
            ok = tried & (_at(u, node) * qx < rx)  # u < r/q without dividing
            rejected = tried & ~ok
            if bug != "against-p":
                rest = mx.maximum(r - q_row, 0.0)
                mass = mx.sum(rest, axis=-1, keepdims=True)
                rest = mx.where(mass > 0, rest / mx.where(mass > 0, mass, 1.0), r)
                r = mx.where(rejected[..., None], rest, r)
            r = mx.where(ok[..., None], _rows(p, child * ok), r)
            cur = mx.where(ok, child, cur)
            n = n + ok.astype(mx.int32)
            took = took | ok
        going = going & took
    return cur, n, sample(r, u[..., -1])


def accept_tree(
    tree: Tree,
    x: mx.array,
    q: mx.array | None,
    logits: mx.array,
    cfg: SamplingConfig,
    key: mx.array,
    softmax: Softmax | None = None,
) -> tuple[mx.array, mx.array, mx.array]:
    """The acceptance step of one tree round on the target's logits [N + 1, V] (row 0 the root):
    (deepest accepted p row, n_accepted, next_token), lazy; acceptance.accept's twin for trees.
    At temperature 0 the walk along the target's argmax (a chain's: the longest agreeing prefix,
    acceptance.verify_greedy, whose deepest row is n); else verify_tree on warp(logits) with
    uniforms(key, N + 1), the round's verify key."""
    p = sampler(cfg).probs(logits, softmax)  # None at temperature 0
    if p is None and tree.is_chain:
        n, nxt = verify_greedy(x, logits)
        return n, n, nxt
    if p is None:
        return verify_tree_greedy(tree, x, logits)
    return verify_tree(tree, x, q, p, uniforms(key, tree.size + 1))


def verify_tree_greedy(tree: Tree, x: mx.array, target_logits: mx.array):
    """Temperature 0: follow the child equal to the target's argmax, depth by depth (siblings are
    distinct, so at most one matches), then the target's argmax after the deepest match.

    x [..., N]; target_logits [..., N + 1, V]. Returns (deepest accepted p row, n, next_token).
    Example: parents (-1, -1, 0) (two candidates, a child below the first), x = [5, 7, 9], argmaxes
    [7, 1, 4, 2] (root, after node 0, 1, 2) -> node 1 accepted: (2, 1, 4).
    """
    table = mx.array(tree.child_table())
    best = mx.argmax(target_logits, axis=-1).astype(mx.int32)  # [..., N + 1]
    x = x.astype(mx.int32)
    cur = mx.zeros(x.shape[:-1], dtype=mx.int32)
    n = mx.zeros_like(cur)
    for _depth in range(tree.depth):
        want, moved = _at(best, cur), mx.zeros(cur.shape, dtype=mx.bool_)
        for j in range(table.shape[1]):
            child = table[cur, j]
            ok = ~moved & (child > 0) & (_at(x, mx.maximum(child - 1, 0)) == want)
            cur, moved = mx.where(ok, child, cur), moved | ok
        n = n + moved.astype(mx.int32)
    return cur, n, _at(best, cur)


def draw_siblings(
    q: mx.array, u: mx.array, m: int, replace: bool = False
) -> tuple[mx.array, mx.array]:
    """m siblings drawn without replacement from q [..., V] with uniforms u [..., m]: c_1 = the
    inverse-CDF sample of q at u_1, c_j that of q with c_1..c_{j-1} zeroed at u_j. Returns
    (tokens [..., m] int32, rows [..., m, V]: q_j, the normalised distribution c_j was drawn
    from; once q's support is used up, the extra siblings are point masses: their row is
    onehot(c_j), which is what they then are). `replace=True` is for the tests only: draws with
    replacement but reports the rows as if without (a planted bug).
    Example: q [.5, .3, .2], u [.6, .1] -> c_1 = 1 (cdf .5 .8 1), then q without 1 = [.5, 0, .2]:
    .1 * .7 = .07 < .5 -> c_2 = 0; rows [.5, .3, .2], [.714, 0, .286].
    """
    vocab = q.shape[-1]
    weights = q
    tokens, rows = [], []
    for j in range(m):
        mass = mx.sum(weights, axis=-1, keepdims=True)
        tok = sample(q if replace else weights, u[..., j])
        hot = mx.arange(vocab) == tok[..., None]
        if j == 0:
            rows.append(q)  # q itself (a chain-shaped tree then tests exactly as the chain does)
        else:
            rows.append(mx.where(mass > 0, weights / mx.where(mass > 0, mass, 1.0), hot))
        tokens.append(tok)
        weights = mx.where(hot, 0.0, weights)
    return mx.stack(tokens, axis=-1), mx.stack(rows, axis=-2)


def top_siblings(scores: mx.array, m: int) -> mx.array:
    """The m highest-scoring indices of scores [..., V] in order (ties: the lower index first, as
    argmax breaks them), as int32 [..., m]: [.1, .5, .5, .2], 3 -> [1, 2, 3]."""
    vocab, picks = scores.shape[-1], []
    for _ in range(m):
        best = mx.argmax(scores, axis=-1).astype(mx.int32)
        picks.append(best)
        scores = mx.where(mx.arange(vocab) == best[..., None], -mx.inf, scores)
    return mx.stack(picks, axis=-1)
