"""The block family: DFlash-style block drafts, a whole block in one forward over the target's
chosen layer outputs (edgespec/drafting/block.py; its trees: edgespec/trees/block_tree.py). It
drafts as a block whatever the chain method (draft, hybrid or block). DFlash2 drafts
(edgespec/architectures/dflash2_model.py) are run by its variant `DFLASH2`: the same state and
trees, chains whose tokens the draft's candidate selector walks (edgespec/drafting/dflash2.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mlx.core as mx

from edgespec.cache import KVState
from edgespec.config import DRAFT_WINDOW, WHOLE_CONTEXT, SamplingConfig, SpecConfig
from edgespec.drafting.base import Drafter
from edgespec.drafting.block import BlockDrafter, BlockState
from edgespec.drafting.dflash2 import DFlash2Drafter
from edgespec.errors import ConfigError
from edgespec.families.feature_family import FeatureFamily
from edgespec.taps import target_features

if TYPE_CHECKING:
    from edgespec.drafting.token import DraftSteps
    from edgespec.trees.forward import Kernels
    from edgespec.trees.proposal import TreeDrafter


class BlockFamily(FeatureFamily):
    """A BlockState (FeatureState's bookkeeping over the block draft's contexts): the feature
    family's prefill, memory and refusals, its own drafters. Its model runs as loaded (no CPU
    twin: its attention is its own)."""

    name = "block"
    blocks = True

    @property
    def default_window(self) -> int:
        """The whole context, as z-lab's DFlash (dflash/model_mlx.py, `sliding_window_size`
        None by default; docs/drafting.md, Long contexts)."""
        return WHOLE_CONTEXT

    def window_of(self, state: Any) -> int:
        """DRAFT_WINDOW for a block draft EdgeSpec trained (BlockArgs.ours: on short answers, it
        accepted 0.12 of its drafts at 8K through the window, 0.01 over the whole context,
        docs/drafting.md), else the family's (z-lab's DFlash drafts: the whole context)."""
        return DRAFT_WINDOW if state.block.args.ours else self.default_window

    def _draft_state(self, backend: Any, draft: Any, verifier: KVState) -> BlockState:
        return BlockState(draft.model, f"draft {draft.name}", backend.new_cache, backend.softmax)

    def drafter(
        self, spec: SpecConfig, sampling: SamplingConfig, state: Any, vocab: int,
        name: str, steps: DraftSteps | None = None,
    ) -> Drafter:  # fmt: skip
        return BlockDrafter(state, sampling, vocab)

    def tree_drafter(
        self, spec: SpecConfig, sampling: SamplingConfig, state: Any, vocab: int,
        name: str, kernels: Kernels, steps: DraftSteps | None = None,
    ) -> TreeDrafter:  # fmt: skip
        from edgespec.trees.block_tree import BlockTreeDrafter

        return BlockTreeDrafter(state, sampling, vocab, kernels)  # one block forward a round

    def first_logits(self, target: Any, draft: Any, prompt: list[int]) -> tuple[mx.array, mx.array]:
        """q_1 of a block after the prompt (its last token is the anchor)."""
        if len(prompt) < 2:
            raise ConfigError("a block draft needs a prompt of at least two tokens")
        inputs = mx.array(prompt, dtype=mx.int32)
        feats, t_all = target_features(target, inputs, None, draft.feature_layers)
        block = mx.array([[prompt[-1], draft.args.mask_token_id]], dtype=mx.int32)
        return t_all[-1], draft.logits(draft(block, draft.context(feats[None, :-1])))[0, 1]


BLOCK = BlockFamily()


class DFlash2Family(BlockFamily):
    """A DFlash2 draft: the block family's state, prefill and trees (which branch on the draft's
    rows, output scalars included, and do not run the selector); chains walk its selector."""

    def drafter(
        self, spec: SpecConfig, sampling: SamplingConfig, state: Any, vocab: int,
        name: str, steps: DraftSteps | None = None,
    ) -> Drafter:  # fmt: skip
        return DFlash2Drafter(state, sampling, vocab)


DFLASH2 = DFlash2Family()
