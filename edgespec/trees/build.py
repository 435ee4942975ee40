"""The tree drafter and shape policy a SpecConfig with `tree` set asks for, fresh per generation."""

from __future__ import annotations

from edgespec.cache import KVState
from edgespec.config import SamplingConfig, SpecConfig, spec_widths
from edgespec.drafting.assistant import AssistantState
from edgespec.drafting.block_draft import BlockState
from edgespec.drafting.features import EagleState
from edgespec.drafting.hybrid import HYBRID_MIN_MATCH
from edgespec.drafting.model import ModelDrafter
from edgespec.drafting.ngram import NgramDrafter
from edgespec.errors import ConfigError, TreeUnsupportedError
from edgespec.trees.block import BlockTreeDrafter
from edgespec.trees.draft import ModelTreeDrafter
from edgespec.trees.eagle import EagleTreeDrafter
from edgespec.trees.forward import PLAIN, Kernels
from edgespec.trees.loop import FixedPolicy, ShapePolicy
from edgespec.trees.ngram import NgramBranch
from edgespec.trees.policy import AdaptiveTree
from edgespec.trees.proposal import TreeDrafter
from edgespec.trees.shapes import (
    DynamicShape,
    FixedShape,
    Shape,
    chain_shape,
    widths_shape,
)


def tree_shape(spec: SpecConfig) -> Shape:
    """The fixed or dynamic shape of spec.tree: "chain" is K drafts in a row, "3,2,1" those
    widths (shapes.widths_shape), "dynamic" a DynamicShape K deep ("dynamic:N": keeping N nodes)."""
    if spec.tree in ("chain", "auto"):
        return FixedShape(chain_shape(spec.k))
    if spec.tree == "dynamic":
        return DynamicShape(depth=spec.k)
    if spec.tree.startswith("dynamic:"):
        return DynamicShape(depth=spec.k, nodes=int(spec.tree.split(":")[1]))
    return FixedShape(widths_shape(spec_widths(spec.tree)))


def build_tree_drafter(
    spec: SpecConfig,
    sampling: SamplingConfig,
    draft: KVState | EagleState | None,
    vocab: int,
    engine_name: str,
    kernels: Kernels = PLAIN,
    pairs: bool = False,
) -> TreeDrafter:
    """The draft model's tree drafter; with method "hybrid" an n-gram lookup adds a branch.
    A token draft's chain-shaped rounds go through the chain drafter (ModelTreeDrafter's
    `chains`; `pairs` as for build_drafter). ConfigError without a draft model,
    TreeUnsupportedError for a draft the tree forward cannot run."""
    if draft is None:
        raise ConfigError(f"{engine_name} has no draft model; tree drafting needs one")
    model: TreeDrafter
    if isinstance(draft, BlockState):  # one block forward a round (trees/block.py)
        model = BlockTreeDrafter(draft, sampling, vocab, kernels)
    elif spec.method in ("block", "block-tree"):
        raise ConfigError(f"--method {spec.method} needs a block draft (DFlash-style)")
    elif isinstance(draft, AssistantState):
        raise TreeUnsupportedError(
            "a Gemma 4 assistant drafts chains only (and the tree forward runs no Gemma 4 "
            "target); drop --tree"
        )
    elif isinstance(draft, EagleState):
        model = EagleTreeDrafter(draft, sampling, vocab, kernels)
    else:
        chains = None if spec.method == "hybrid" else ModelDrafter(draft, sampling, vocab, pairs)
        model = ModelTreeDrafter(draft, sampling, vocab, kernels, chains)
    if spec.method != "hybrid":
        return model
    min_match = max(spec.ngram_min, min(HYBRID_MIN_MATCH, spec.ngram_max))
    ngram = NgramDrafter(spec.ngram_min, spec.ngram_max, spec.long_match, spec.ngram_long_k)
    return NgramBranch(model, ngram, min_match, max(spec.k, spec.ngram_k), vocab)


def make_shape_policy(spec: SpecConfig) -> ShapePolicy:
    """A fixed shape every round, or with tree "auto" the adaptive choice between chains and
    trees (trees/policy.py)."""
    if spec.tree == "auto":
        return AdaptiveTree(spec.k, spec.k_max)
    return FixedPolicy(tree_shape(spec))
