"""The draft-verify loop for trees: loop.speculate's twin, where a round drafts a tree
(edgespec/trees/draft.py), verifies all its nodes in one target forward with a tree mask
(edgespec/trees/forward.py) and keeps the longest accepted path (edgespec/trees/acceptance.py).

Cache invariants after every round, as the chain loop's: the target's cache holds context[:-1]
(its tree positions compacted to the accepted path, then rewound); the drafter's state a prefix of
the context. Rounds whose shape is empty (an adaptive policy switched drafting off) run as
pipelined plain steps (rounds.plain_run), exactly as the chain loop's K = 0 rounds.

Key schedule, as the chain's (sampling.round_keys): a round's draft key gives one uniform per
node (uniforms(draft_key, N)), its verify key N + 1 (node i's ratio test takes u[i], the last
sample u[N]); a chain-shaped tree therefore draws the chain's tokens.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Protocol

import mlx.core as mx

from edgespec.acceptance import verify_greedy
from edgespec.cache import KVState
from edgespec.config import SamplingConfig
from edgespec.events import Round
from edgespec.rounds import Limits, Progress, Step, cancelled, is_set, plain_run, run_round
from edgespec.sampling import make_key, round_keys, uniforms, warp
from edgespec.trees.acceptance import verify_tree, verify_tree_greedy
from edgespec.trees.forward import (
    PLAIN,
    Kernels,
    check_tree_cache,
    compact,
    tree_forward,
    tree_layers,
)
from edgespec.trees.proposal import TreeDrafter, TreeProposal
from edgespec.trees.shapes import FixedShape, Shape, Tree, tree_mask, tree_positions


class ShapePolicy(Protocol):
    """Chooses each round's tree shape from the last round (an empty shape: a plain step)."""

    def __call__(self, last: Round | None) -> Shape: ...

    def observe_path(self, tree: Tree, path: list[int]) -> None: ...


class FixedPolicy:
    """The same shape every round."""

    def __init__(self, shape: Shape):
        self.shape = shape

    def __call__(self, last: Round | None) -> Shape:
        return self.shape

    def observe_path(self, tree: Tree, path: list[int]) -> None:
        pass


def branch_of(tree: Tree, path: list[int]) -> int:
    """0 when every node of `path` is its parent's first candidate, else the rank of the first
    that is not. Example: ranks along the path (0, 2, 1) -> 2."""
    return next((tree.ranks[i] for i in path if tree.ranks[i]), 0)


def verify_tree_round(
    target: KVState,
    pending: mx.array,
    prop: TreeProposal,
    cfg: SamplingConfig,
    key: mx.array,
    features: bool,
    kernels: Kernels = PLAIN,
) -> tuple[mx.array, mx.array | None]:
    """One target forward over [pending..., the tree's nodes] and the acceptance walk, lazy
    (rounds.verify_round's twin: rounds.run_round runs it).
    Returns [deepest accepted p row, n_accepted, next_token, node tokens...] (int32, the round's
    one host transfer) and, when `features`, the target's top hidden states of the root and every
    node ([N + 1, d], lazy)."""
    tree, p_len = prop.tree, int(pending.shape[0])
    inputs = mx.concatenate([pending, prop.tokens])
    if tree.is_chain and not features:  # the chain loop's forward and test (the same result)
        return _verify_chain(target, inputs, prop, cfg, key, p_len)
    if tree.is_chain:  # the causal mask: the target's own forward (the same logits, faster)
        feats, logits = target.forward_features(inputs)
    else:
        allowed = mx.array(tree_mask(tree, target.offset, p_len))
        positions = mx.array(tree_positions(tree, target.offset, p_len))
        feats, logits = tree_forward(
            target.model, inputs, positions, allowed, target.cache, kernels, target.feature_layers
        )
    logits = logits[p_len - 1 :]
    if cfg.greedy:
        row, n, nxt = verify_tree_greedy(tree, prop.tokens, logits)
    else:
        u = uniforms(key, tree.size + 1)
        row, n, nxt = verify_tree(tree, prop.tokens, prop.q, warp(logits, cfg, target.softmax), u)
    head = mx.stack([row, n, nxt]).astype(mx.int32)
    out = mx.concatenate([head, prop.tokens.astype(mx.int32)])
    return out, (feats[p_len - 1 :] if features else None)


def _verify_chain(
    target: KVState,
    inputs: mx.array,
    prop: TreeProposal,
    cfg: SamplingConfig,
    key: mx.array,
    p_len: int,
) -> tuple[mx.array, None]:
    """verify_tree_round for a chain without features, as rounds.verify_round: the target's
    forward and the chain's acceptance test (at temperature 0 the longest agreeing prefix, as the
    tree walk; at T > 0 the tree test, which on a chain is the chain's). The deepest accepted
    p row of a chain is n."""
    logits = target.forward(inputs)[p_len - 1 :]
    if cfg.greedy:
        n, nxt = verify_greedy(prop.tokens, logits)
        row = n
    else:
        u = uniforms(key, prop.tree.size + 1)
        row, n, nxt = verify_tree(
            prop.tree, prop.tokens, prop.q, warp(logits, cfg, target.softmax), u
        )
    head = mx.stack([row, n, nxt]).astype(mx.int32)
    return mx.concatenate([head, prop.tokens.astype(mx.int32)]), None


def _fit(shape: Shape, room: int) -> Shape:
    """A fixed shape cut to the depth the context window has room for (dynamic shapes alike)."""
    if shape.depth < room:
        return shape
    if isinstance(shape, FixedShape):
        return FixedShape(tuple(p for p in shape.paths if len(p) < room))
    return (
        FixedShape(()) if room <= 1 else type(shape)(room - 1, shape.beam, shape.width, shape.nodes)
    )


def _tree_round(
    target: KVState,
    drafter: TreeDrafter,
    run: Progress,
    shape: Shape,
    cfg: SamplingConfig,
    policy: ShapePolicy,
    kernels: Kernels,
) -> Step:
    """Draft, verify and commit one tree round."""
    run.key, draft_key, verify_key = round_keys(run.key)
    t0 = time.perf_counter()
    prop = drafter.propose_tree(run.context, shape, draft_key)
    prop = prop.cut(run.room() - 1)  # a lookup branch may reach past the context window
    verify = partial(verify_tree_round, kernels=kernels)
    host, feats, t_draft, t_verify = run_round(
        target, run.context, prop, t0, cfg, verify_key, drafter.wants_features, verify
    )
    row, n, nxt, tokens = host[0], host[1], host[2], host[3:]
    path = prop.tree.path(row - 1)
    base = len(run.context)
    compact(target.cache, base, [base + i for i in path])
    drafter.keep_path(base, prop, path)
    policy.observe_path(prop.tree, path)
    if feats is not None:
        feats = feats[mx.array([0] + [i + 1 for i in path], dtype=mx.int32)]
    tree = prop.tree
    rnd = Round(
        run.index, tree.size, n, tree.depth, t_draft, t_verify, prop.method, True, prop.match,
        nodes=tree.size, branch=branch_of(tree, path),
    )  # fmt: skip
    step = run.commit(drafter, [tokens[i] for i in path] + [nxt], rnd, feats)
    target.rewind(run.context, len(run.context) - 1)
    return step


def speculate_tree(
    target: KVState,
    drafter: TreeDrafter,
    prompt: list[int],
    cfg: SamplingConfig,
    policy: ShapePolicy,
    limits: Limits,
    cancel: threading.Event | None = None,
    kernels: Kernels = PLAIN,
) -> Iterator[Step]:
    """Speculative decoding with draft trees. Both states must already hold a prefix of `prompt`
    (Engine.prefill). `kernels`: the backend's pieces of the tree forward (the Engine passes the
    CPU's). Raises TreeUnsupportedError for a target the tree forward cannot run."""
    tree_layers(target.model)
    check_tree_cache(target.cache, target.name)
    run = Progress(list(prompt), make_key(cfg.seed), limits)
    chosen: Shape | None = None
    last_shape: list[Shape] = []

    def plain_k(last: Round | None) -> int:  # plain_run asks for K: a shape's node count
        last_shape[:] = [policy(last)]
        return last_shape[0].size

    try:
        while run.index < limits.max_tokens and not run.stopped:
            if is_set(cancel):
                yield cancelled()
                return
            shape = _fit(policy(run.last) if chosen is None else chosen, run.room())
            chosen = None
            if shape.size == 0:
                decided = yield from plain_run(target, drafter, run, cfg, plain_k, cancel)
                chosen = last_shape[0] if decided is not None and last_shape else None
                continue
            step = _tree_round(target, drafter, run, shape, cfg, policy, kernels)
            yield step
            if step.stop:
                return
    finally:
        target.rewind(run.context, min(target.offset, len(run.context) - 1))
        drafter.commit(run.context)
