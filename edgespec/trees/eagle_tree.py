"""Tree drafting with a feature draft (EAGLE-2 style): ModelTreeDrafter's depth-by-depth drafting
over an FeatureState (edgespec/drafting/feature.py).

The first forward is FeatureDrafter's catch-up over true features; its last guess gives the root's
candidates. A node at depth d >= 2 is run with its parent's guess (the draft's chain "guess"; zeros
for chain "zero") and its own token, under a tree mask, at the draft's position p - 1 + d (p =
len(context) - 1 features known). Siblings share their parent's guess, so each depth is one
forward over the nodes that get children.

Cache: every position run on a guess is rolled back after the round (take_features / commit, as
FeatureDrafter does), so nothing of the tree is kept and `keep_path` has nothing to do.
"""

from __future__ import annotations

import mlx.core as mx

from edgespec.config import SamplingConfig
from edgespec.drafting.base import Capabilities
from edgespec.drafting.feature import FeatureState
from edgespec.trees.draft import ModelTreeDrafter
from edgespec.trees.forward import PLAIN, Kernels, check_tree_cache, run_layers, tree_layers
from edgespec.trees.proposal import TreeDraft, TreeProposal
from edgespec.trees.shapes import Tree


class EagleTreeDrafter(ModelTreeDrafter):
    """Trees from a feature draft (module docstring)."""

    def __init__(
        self, state: FeatureState, sampling: SamplingConfig, vocab: int, kernels: Kernels = PLAIN
    ):
        tree_layers(state.model)
        check_tree_cache(state.kv.cache, state.kv.name)
        self.eagle, self.state = state, state.kv
        self.sampling, self.vocab, self.kernels = sampling, vocab, kernels
        self.head_ids = state.model.head_ids
        self._prefix = 0
        self._valid = state.kv.offset
        self._guess: dict[int, mx.array] = {}  # node (-1: root) -> the draft's guess after it
        self.chains = None  # chains too go through the tree path (it keeps the features right)

    def root_logits(self, context: list[int]) -> mx.array | None:
        st, kv = self.eagle, self.eagle.kv
        first = st.first_input(context)
        if first is None:
            return None  # no features yet (a one-token prompt): a plain target step
        feats, toks = first
        self._valid = self._prefix = st.n_features
        guess = st.model(feats, toks, cache=kv.cache)[0, -1]
        self._guess = {-1: guess}
        return st.model.head_logits(guess)

    def _forward_nodes(
        self,
        draft: TreeDraft,
        tree: Tree,
        nodes: list[int],
        positions: mx.array,
        allowed: mx.array | None,
    ) -> mx.array:
        model = self.eagle.model
        guesses = mx.stack([self._guess[tree.parents[i]] for i in nodes])
        if model.chain != "guess":
            guesses = mx.zeros_like(guesses)
        toks = mx.stack([draft.tokens[i] for i in nodes]).astype(mx.int32)  # type: ignore[misc]
        if allowed is None:  # one node seeing the whole cache: the draft's own step
            h = model(guesses[None], toks[None], cache=self.state.cache)[0]
        else:
            if model.feature_scale != 1.0:
                guesses = guesses * model.feature_scale
            h = model.fc(mx.concatenate([guesses, model.embedding(toks)], axis=-1))[None]
            layers, cache = model.layers, self.state.cache
            h = model.norm(run_layers(layers, h, positions, allowed, cache, self.kernels))[0]
        for r, node in enumerate(nodes):
            self._guess[node] = h[r]
        return model.head_logits(h)

    def keep_path(self, base: int, prop: TreeProposal, path: list[int]) -> None:
        """Nothing to keep: positions run on guesses are rolled back (module docstring)."""

    def take_features(self, context: list[int], start: int, features: mx.array) -> None:
        self.eagle.set_features(context, start, features)

    def capabilities(self) -> Capabilities:
        return Capabilities(features=self)  # it reads the verify's features

    def commit(self, context: list[int]) -> None:
        kv = self.eagle.kv
        self.eagle.rewind(min(kv.offset, self._valid, self.eagle.n_features))
