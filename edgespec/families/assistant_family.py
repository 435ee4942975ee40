"""The assistant family: Gemma 4's `-assistant` drafters (edgespec/architectures/
gemma4_assistant.py, run by edgespec/drafting/assistant.py), heads with no cache of their own
that read the target's top hidden state and its KV cache. The target's own multi-token head in
all but the file it ships in, so it also answers `--method mtp` (`own_head`). Chains only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mlx.core as mx

from edgespec.cache import KVState
from edgespec.config import WHOLE_CONTEXT, SamplingConfig, SpecConfig
from edgespec.drafting.assistant import AssistantDrafter, AssistantState, shared_kv
from edgespec.drafting.base import Drafter
from edgespec.drafting.token import fit_vocab
from edgespec.errors import ConfigError, TreeUnsupportedError
from edgespec.families.feature_family import FeatureFamily
from edgespec.taps import TOP, target_features

if TYPE_CHECKING:
    from edgespec.drafting.token import DraftSteps
    from edgespec.trees.forward import Kernels
    from edgespec.trees.proposal import TreeDrafter


class AssistantFamily(FeatureFamily):
    """An AssistantState (FeatureState's bookkeeping, one feature kept, no cache) over the
    target's KVState: the feature family's prefill (the target's records the prompt's top
    state), memory (the one feature) and cached ids (none: no cache of its own), its own
    drafter, a refusal for trees. Its model runs as loaded: it reads the target
    model's embedding and cache, so it has no CPU twin of its own."""

    name = "assistant"
    reads_target_cache = True

    @property
    def default_window(self) -> int:
        """The whole context: its full layer reads all of the target's keys and values, as
        mlx-vlm's Gemma 4 assistant does (docs/drafting.md, Long contexts)."""
        return WHOLE_CONTEXT

    def __init__(self) -> None:
        super().__init__(own_head=True)

    def _draft_state(self, backend: Any, draft: Any, verifier: KVState) -> AssistantState:
        """The assistant's state over the target's (the keys and values each round reads, its
        top hidden state); the model runs as loaded (no CPU twin of its own)."""
        return AssistantState(draft.model, verifier, f"draft {draft.name}", backend.softmax)

    def drafter(
        self, spec: SpecConfig, sampling: SamplingConfig, state: Any, vocab: int,
        name: str, steps: DraftSteps | None = None,
    ) -> Drafter:  # fmt: skip
        return AssistantDrafter(state, sampling, vocab)

    def tree_drafter(
        self, spec: SpecConfig, sampling: SamplingConfig, state: Any, vocab: int,
        name: str, kernels: Kernels, steps: DraftSteps | None = None,
    ) -> TreeDrafter:  # fmt: skip
        raise TreeUnsupportedError(
            "a Gemma 4 assistant drafts chains only (and the tree forward runs no Gemma 4 "
            "target); drop --tree"
        )

    def first_logits(self, target: Any, draft: Any, prompt: list[int]) -> tuple[mx.array, mx.array]:
        """One target forward over prompt[:-1] gives the feature and the keys and values the
        first draft step reads (a throwaway cache); the target's logits after the whole prompt
        come from its own forward."""
        if len(prompt) < 2:
            raise ConfigError("a Gemma 4 assistant needs a prompt of at least two tokens")
        inputs = mx.array(prompt, dtype=mx.int32)
        t_logits = target(inputs[None])[0, -1]
        state = KVState(target, "target")
        feats, _ = target_features(target, inputs[:-1], state.cache, (TOP,))
        state.tokens = list(prompt[:-1])
        kv = shared_kv(state, draft.window)
        logits, _ = draft.draft_step(inputs[-1:], feats[-1:][None], kv, len(prompt) - 2)
        return t_logits, fit_vocab(logits, t_logits.shape[-1]).astype(t_logits.dtype)


ASSISTANT = AssistantFamily()
