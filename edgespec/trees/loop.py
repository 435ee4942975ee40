"""Draft-tree rounds for loop.speculate (`Trees`), where a round drafts a tree
(edgespec/trees/draft.py), verifies all its nodes in one target forward with a tree mask
(edgespec/trees/forward.py) and keeps the longest accepted path (edgespec/trees/tree_acceptance.py).

Cache invariants after every round, as for chain rounds: the target's cache holds context[:-1]
(its tree positions compacted to the accepted path, then rewound); the drafter's state a prefix of
the context. A round whose shape is empty (an adaptive policy switched drafting off) is a plain
step, the chain rounds' own (loop.Chains): queued, and pipelined, exactly as their K = 0 rounds.

Key schedule, as the chain's (sampling.round_keys): a round's draft key gives one uniform per
node (uniforms(draft_key, N)), its verify key N + 1 (node i's ratio test takes u[i], the last
sample u[N]); a chain-shaped tree therefore draws the chain's tokens.
"""

from __future__ import annotations

from functools import partial
from typing import Protocol, cast

import mlx.core as mx

from edgespec.cache import KVState
from edgespec.config import SamplingConfig
from edgespec.drafting.base import Capabilities, Proposal, no_proposal
from edgespec.drafting.review import NO_REVIEWS, Watch
from edgespec.events import Round
from edgespec.loop import Chains
from edgespec.rounds import Progress, Queued, Step, fed_one, run_round
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
from edgespec.trees.tree_acceptance import accept_tree


class ShapePolicy(Protocol):
    """Chooses each round's tree shape (an empty shape: a plain step): a rounds.Policy that also
    sees each tree round's accepted path."""

    def observe(self, r: Round) -> None: ...

    def decide(self) -> Shape: ...

    def observe_path(self, tree: Tree, path: list[int]) -> None: ...


class FixedPolicy:
    """The same shape every round."""

    def __init__(self, shape: Shape):
        self.shape = shape

    def observe(self, r: Round) -> None:
        pass

    def decide(self) -> Shape:
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
    (loop.verify_round's twin: rounds.run_round runs it).
    Returns [deepest accepted p row, n_accepted, next_token, node tokens...] (int32, the round's
    one host transfer) and, when `features`, the target's top hidden states of the root and every
    node ([N + 1, d], lazy)."""
    tree, p_len = prop.tree, int(pending.shape[0])
    inputs = mx.concatenate([pending, prop.tokens])
    feats: mx.array | None = None
    if tree.is_chain and not features:  # the chain loop's forward (the same logits)
        logits = target.forward(inputs)
    elif tree.is_chain:  # the causal mask: the target's own forward (the same logits, faster)
        feats, logits = target.forward_features(inputs)
    else:
        allowed = mx.array(tree_mask(tree, target.offset, p_len))
        positions = mx.array(tree_positions(tree, target.offset, p_len))
        feats, logits = tree_forward(
            target.model, inputs, positions, allowed, target.cache, kernels, target.feature_layers
        )
    logits = logits[p_len - 1 :]
    row, n, nxt = accept_tree(tree, prop.tokens, prop.q, logits, cfg, key, target.softmax)
    head = mx.stack([row, n, nxt]).astype(mx.int32)
    out = mx.concatenate([head, prop.tokens.astype(mx.int32)])
    return out, (feats[p_len - 1 :] if features and feats is not None else None)


def _fit(shape: Shape, room: int) -> Shape:
    """A fixed shape cut to the depth the context window has room for (dynamic shapes alike)."""
    if shape.depth < room:
        return shape
    if isinstance(shape, FixedShape):
        return FixedShape(tuple(p for p in shape.paths if len(p) < room))
    return (
        FixedShape(()) if room <= 1 else type(shape)(room - 1, shape.beam, shape.width, shape.nodes)
    )


class Trees:
    """Tree rounds for loop.speculate: a tree of the policy's shape from `drafter`, verified in one
    forward with a tree mask (`kernels`: the backend's pieces of it; the Engine passes the CPU's).
    `watch` sees each plain step, as the chain rounds' (loop.Chains). Raises
    TreeUnsupportedError for a target the tree forward cannot run."""

    def __init__(
        self,
        target: KVState,
        drafter: TreeDrafter,
        cfg: SamplingConfig,
        policy: ShapePolicy,
        kernels: Kernels = PLAIN,
        watch: Watch = NO_REVIEWS,
    ):
        tree_layers(target.model)
        check_tree_cache(target.cache, target.name)
        self.target, self.drafter, self.cfg, self.policy = target, drafter, cfg, policy
        self.verify = partial(verify_tree_round, kernels=kernels)
        self.caps = Capabilities.of(drafter)
        self.kernels = kernels
        self.plain = Chains(target, drafter, cfg, watch)  # plain steps: chain rounds of d = 0

    def watched(self, watch: Watch) -> Trees:
        """These rounds with `watch` shown their plain steps (the reviews the policy reads)."""
        return Trees(self.target, self.drafter, self.cfg, self.policy, self.kernels, watch)

    def size(self, plan: Shape) -> int:
        return plan.size

    def draft(self, run: Progress, plan: Shape, key: mx.array) -> Proposal:
        shape = _fit(plan, run.room())
        if shape.size == 0:
            return no_proposal(self.drafter.method)
        prop = self.drafter.propose_tree(run.context, shape, key)
        return prop.cut(run.room() - 1)  # a lookup branch may reach past the context window

    def behind(self, run: Progress, plan: Shape) -> Proposal | None:
        """A plain step for an empty shape; a tree drafts from the token computing (None)."""
        return no_proposal(self.drafter.method) if plan.size == 0 else None

    def queue(
        self, run: Progress, prop: Proposal, key: mx.array, before: Queued | None = None
    ) -> Queued:
        return self.plain.queue(run, prop, key, before)

    def read(self, run: Progress, queued: Queued, upcoming: Queued | None) -> Step:
        return self.plain.read(run, queued, upcoming)

    def finish(self, run: Progress, plan: Shape, prop: Proposal, t0: float, key: mx.array) -> Step:
        """Verify, keep the accepted path, commit one tree round."""
        target, drafter = self.target, self.drafter
        prop, features = cast(TreeProposal, prop), self.caps.features is not None
        timed = fed_one(target, run.context)
        host, feats, t_draft, t_verify = run_round(
            target, run.context, prop, t0, self.cfg, key, features, self.verify
        )
        row, n, nxt, tokens = host[0], host[1], host[2], host[3:]
        path = prop.tree.path(row - 1)
        base = len(run.context)
        compact(target.cache, base, [base + i for i in path])
        drafter.keep_path(base, prop, path)
        self.policy.observe_path(prop.tree, path)
        if feats is not None:
            feats = feats[mx.array([0] + [i + 1 for i in path], dtype=mx.int32)]
        tree = prop.tree
        rnd = Round(
            index=run.index,
            drafted=tree.size,
            accepted=n,
            k=tree.depth,
            t_draft=t_draft,
            t_verify=t_verify,
            method=prop.method,
            timed=timed,
            match=prop.match,
            nodes=tree.size,
            branch=branch_of(tree, path),
            context=len(run.context),
        )
        step = run.commit(drafter, [tokens[i] for i in path] + [nxt], rnd, feats)
        target.rewind(run.context, len(run.context) - 1)
        return step
