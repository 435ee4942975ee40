"""Tree drafting with a token draft model: a tree of candidate continuations per round, drafted
depth by depth, each depth one draft forward over the nodes that get children (a tree mask,
edgespec/trees/forward.py). A fixed shape (edgespec/trees/shapes.py) is drafted without any host read;
a dynamic one (EAGLE-2 style) reads the candidates' probabilities once per depth.

Candidates: at temperature 0 a node's children are the draft's top tokens in order; at T > 0
they are drawn WITHOUT replacement from the draft's warped q (trees/tree_acceptance.py
draw_siblings), one uniform per node from `uniforms(key, N)` (node i takes u[i]), and each carries
the distribution it was drawn from, as the recursive rejection test needs.

Draft-cache invariant (as ModelDrafter's): after `keep_path` and `commit` the draft's cache holds
a prefix of the committed context. The tree's nodes the draft ran sit after the context in its
cache; `keep_path` moves the accepted ones down (forward.compact), so the next round need
not run them again.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from edgespec.architectures.token_draft import reduced_head
from edgespec.cache import KVState
from edgespec.config import SamplingConfig
from edgespec.drafting.base import Capabilities
from edgespec.drafting.token import ModelDrafter, fit_vocab
from edgespec.sampling import sampler, warp
from edgespec.trees.dynamic import propose_dynamic
from edgespec.trees.forward import (
    PLAIN,
    Kernels,
    check_tree_cache,
    compact,
    tree_forward,
    tree_layers,
)
from edgespec.trees.proposal import TreeDraft, TreeDrafter, TreeProposal, empty_tree
from edgespec.trees.shapes import DynamicShape, FixedShape, Shape, Tree
from edgespec.trees.tree_acceptance import draw_siblings, top_siblings


class ModelTreeDrafter(TreeDrafter):
    """Trees from a token draft model and its own KV cache (module docstring).

    `chains`: the chain drafter over the same state (drafting.token.ModelDrafter), which drafts
    chain-shaped rounds exactly as the chain loop does (its steps in pairs on the CPU, no tree
    bookkeeping): an adaptive policy that settles on chains then costs what adaptive K does.
    The tokens are the same (the argmax, or the same uniform per node from the same key)."""

    def __init__(
        self,
        state: KVState,
        sampling: SamplingConfig,
        vocab: int,
        kernels: Kernels = PLAIN,
        chains: ModelDrafter | None = None,
    ):
        tree_layers(state.model)
        check_tree_cache(state.cache, state.name)
        self.state, self.sampling, self.vocab, self.kernels = state, sampling, vocab, kernels
        self.head_ids = reduced_head(state.model)
        self.chains = chains if chains is not None and chains.state is state else None
        self._prefix = 0  # cache positions every node sees (set by root_logits)

    def capabilities(self) -> Capabilities:
        """Reviews from the chain drafter, where there is one: while an adaptive policy has the
        draft off (trees/fallback.py FallbackTree: adaptive K's chain rounds), its acceptance is
        read at plain steps as in the chain loop."""
        return Capabilities(reviews=self.chains)

    # --------------------------------------------------------------------- drafting

    def _fit(self, logits: mx.array) -> mx.array:
        return logits if self.head_ids is not None else fit_vocab(logits, self.vocab)

    def root_logits(self, context: list[int]) -> mx.array | None:
        """The draft's logits after the context (it runs what its cache lacks); None when it
        cannot draft this round. Sets `_prefix`, the cache positions every node may see."""
        st = self.state
        inputs = mx.array(context[st.offset :], dtype=mx.int32)
        logits = self._fit(st.forward(inputs, head_only=self.head_ids is not None)[-1])
        self._prefix = st.offset
        return logits

    def draft_children(
        self, draft: TreeDraft, parent: int, kids: list[int], u: mx.array | None
    ) -> tuple[mx.array, mx.array]:
        """Draft the children `kids` (consecutive node indices) of `parent` from its logits.
        Returns their column indices in the logits and the distribution they were ranked by
        (softmax of the logits at temperature 0, else the warped q), both lazy."""
        z = draft.logits[parent]
        if u is None:
            picks = top_siblings(z, len(kids))
            rows: list[mx.array | None] = [None] * len(kids)
            q = mx.softmax(z.astype(mx.float32))
        else:
            q = warp(z, self.sampling, self.state.softmax)
            picks, q_rows = draw_siblings(q, u[kids[0] : kids[-1] + 1], len(kids))
            rows = [q_rows[j] for j in range(len(kids))]
        toks = picks if self.head_ids is None else self.head_ids[picks]
        for j, node in enumerate(kids):
            draft.tokens[node], draft.rows[node] = toks[j], rows[j]
        return picks, q

    def _forward_nodes(
        self,
        draft: TreeDraft,
        tree: Tree,
        nodes: list[int],
        positions: mx.array,
        allowed: mx.array | None,
    ) -> mx.array:
        """The draft's logits rows [len(nodes), H or V] after `nodes`, run in one forward;
        allowed None: one node that sees the whole cache, run as an ordinary draft step (the same
        logits, through the model's own, faster, code)."""
        inputs = mx.stack([draft.tokens[i] for i in nodes]).astype(mx.int32)  # type: ignore[misc]
        st = self.state
        if allowed is None:
            return self._fit(st.forward(inputs, head_only=self.head_ids is not None))
        _, logits = tree_forward(st.model, inputs, positions, allowed, st.cache, self.kernels)
        return self._fit(logits)

    def run_nodes(self, draft: TreeDraft, tree: Tree, nodes: list[int]) -> None:
        """One draft forward over `nodes` (all at one depth, their ancestors already run): each
        sees the cache's first `_prefix` positions, its own ancestors and itself."""
        offset, prefix = self._cache_offset(), self._prefix
        allowed = np.zeros((len(nodes), offset + len(nodes)), dtype=bool)
        allowed[:, :prefix] = True
        anc = tree.ancestors()
        fed = [i for i, f in enumerate(draft.fed) if f >= 0]
        for r, node in enumerate(nodes):
            for f in fed:
                allowed[r, draft.fed[f]] = anc[node, f]
            allowed[r, offset + r] = True
        depth = tree.depths[nodes[0]]
        positions = mx.full((len(nodes),), prefix - 1 + depth, dtype=mx.int32)
        plain = len(nodes) == 1 and bool(allowed.all())  # a chain step: no mask needed
        logits = self._forward_nodes(
            draft, tree, nodes, positions, None if plain else mx.array(allowed)
        )
        for r, node in enumerate(nodes):
            draft.logits[node] = logits[r]
            draft.fed[node] = offset + r

    def _cache_offset(self) -> int:
        return self.state.offset

    def full_q(self, rows: list[mx.array | None]) -> mx.array:
        q = mx.stack(rows)  # type: ignore[arg-type]
        if self.head_ids is None:
            return q
        full = mx.zeros((q.shape[0], self.vocab), dtype=q.dtype)
        full[:, self.head_ids] = q
        return full

    def propose_tree(self, context: list[int], shape: Shape, key: mx.array) -> TreeProposal:
        if isinstance(shape, DynamicShape):
            return propose_dynamic(self, context, shape, key)
        return self._propose_fixed(context, shape, key)

    def _propose_fixed(self, context: list[int], shape: FixedShape, key: mx.array) -> TreeProposal:
        tree, n = shape.tree, shape.size
        if self.chains is not None and tree.is_chain and n > 0:
            chain = self.chains.propose(context, n, key)
            return TreeProposal(chain.tokens, chain.q, tree=tree, fed=(-1,) * n, in_place=True)
        root = self.root_logits(context)
        if root is None:
            return empty_tree()
        u = sampler(self.sampling).uniforms(key, n)
        draft = TreeDraft([None] * n, [None] * n, [-1] * n)
        draft.logits[-1] = root
        for depth in range(1, tree.depth + 1):
            level = [i for i in range(n) if tree.depths[i] == depth]
            for parent in sorted({tree.parents[i] for i in level}):
                self.draft_children(draft, parent, list(tree.kids[parent + 1]), u)
            grow = [i for i in level if tree.kids[i + 1]]
            if grow:
                self.run_nodes(draft, tree, grow)
        tokens = mx.stack(draft.tokens).astype(mx.int32)  # type: ignore[arg-type]
        mx.async_eval(tokens)
        q = None if u is None else self.full_q(draft.rows)
        return TreeProposal(tokens, q, tree=tree, fed=tuple(draft.fed))

    # --------------------------------------------------------------------- after the round

    def keep_path(self, base: int, prop: TreeProposal, path: list[int]) -> None:
        st = self.state
        if st.offset < base or prop.in_place:  # nothing to keep, or `commit` keeps it in place
            return
        rows: list[int] = []
        for node in path:  # the path's leading nodes the draft ran (a lookup's it did not)
            if prop.fed[node] < 0:
                break
            rows.append(prop.fed[node])
        compact(st.cache, base, rows)
        # `tokens` is made right by commit's rewind, which the loop calls next.

    def commit(self, context: list[int]) -> None:
        self.state.rewind(context, min(self.state.offset, len(context) - 1))
