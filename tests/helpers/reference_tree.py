"""A slow, obviously-correct numpy reference of tree speculative decoding (fixed shapes).

No KV caches and no tree masks: every draft and target distribution comes from a full forward over
the context plus the path to the node; the maths (warps, sampling siblings without replacement,
recursive rejection over siblings, inverse-CDF sampling) is plain numpy in float64, node by node.
It follows the engine's key schedule (edgespec/trees/loop.py: per round a draft key giving one
uniform per node, a verify key giving N + 1), so the MLX loop must emit the same tokens.
"""

from __future__ import annotations

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.sampling import make_key, round_keys, uniforms
from edgespec.trees.shapes import RankPath, Tree, shape_tree
from tests.helpers.reference_loop import _take, full_logits, sample_np, warp_np


def top_np(z: np.ndarray, m: int) -> list[int]:
    """The m largest entries' indices in order, ties to the lower index (as repeated argmax)."""
    z = np.array(z, dtype=np.float64)
    out = []
    for _ in range(m):
        best = int(np.argmax(z))
        out.append(best)
        z[best] = -np.inf
    return out


def draw_np(q: np.ndarray, u: np.ndarray) -> tuple[list[int], list[np.ndarray]]:
    """Siblings without replacement: c_j from q with c_1..c_{j-1} removed, and the q_j rows."""
    weights, toks, rows = q.copy(), [], []
    for j, uj in enumerate(u):
        tok = sample_np(weights, float(uj))
        mass = weights.sum()
        if j == 0:
            rows.append(q)
        elif mass > 0:
            rows.append(weights / mass)
        else:
            rows.append(np.eye(len(q))[tok])
        toks.append(tok)
        weights = weights.copy()
        weights[tok] = 0.0
    return toks, rows


def verify_tree_np(tree: Tree, x, q, p, u) -> tuple[int, int, int]:
    """Recursive rejection sampling over the tree; returns (deepest node or -1, n, next)."""
    cur, r, n = -1, p[0], 0
    while True:
        moved = False
        for c in tree.kids[cur + 1]:
            qc = np.eye(len(r))[x[c]] if q is None else q[c]
            if u[c] * qc[x[c]] < r[x[c]]:
                cur, r, n, moved = c, p[c + 1], n + 1, True
                break
            rest = np.maximum(r - qc, 0.0)
            r = rest / rest.sum() if rest.sum() > 0 else r
        if not moved:
            return cur, n, sample_np(r, float(u[tree.size]))


def _draft_tree(draft, ctx: list[int], tree: Tree, cfg: SamplingConfig, u):
    x: list[int] = [0] * tree.size
    q: list[np.ndarray] = [np.zeros(0)] * tree.size
    for parent in range(-1, tree.size):
        kids = tree.kids[parent + 1]
        if not kids:
            continue
        z = full_logits(draft, ctx + [x[i] for i in tree.path(parent)])[-1]
        if u is None:
            toks, rows = top_np(z, len(kids)), [np.zeros(0)] * len(kids)
        else:
            toks, rows = draw_np(warp_np(z, cfg), u[kids[0] : kids[-1] + 1])
        for j, node in enumerate(kids):
            x[node], q[node] = toks[j], rows[j]
    return x, q


def reference_tree(
    target,
    draft,
    prompt: list[int],
    cfg: SamplingConfig,
    paths: list[RankPath],
    max_tokens: int,
    eos=(),
) -> list[int]:
    """The generated token ids (EOS excluded) of tree speculation with a fixed shape."""
    tree = shape_tree(paths)
    key, ctx, out = make_key(cfg.seed), list(prompt), []
    while True:
        key, draft_key, verify_key = round_keys(key)
        ud = None if cfg.greedy else np.array(uniforms(draft_key, tree.size))
        x, q = _draft_tree(draft, ctx, tree, cfg, ud)
        rows = [full_logits(target, ctx)[-1]]
        rows += [
            full_logits(target, ctx + [x[i] for i in tree.path(j)])[-1] for j in range(tree.size)
        ]
        if cfg.greedy:
            best = [int(np.argmax(r)) for r in rows]
            cur, n = -1, 0
            while True:
                nxt = [c for c in tree.kids[cur + 1] if x[c] == best[cur + 1]]
                if not nxt:
                    break
                cur, n = nxt[0], n + 1
            last = best[cur + 1]
        else:
            p = [warp_np(r, cfg) for r in rows]
            cur, n, last = verify_tree_np(
                tree, x, q, p, np.array(uniforms(verify_key, tree.size + 1))
            )
        new = [x[i] for i in tree.path(cur)] + [last]
        if _take(new, out, set(eos), max_tokens):
            return out
        ctx += new
