"""The feature family: EAGLE, EAGLE-3, MTP and next-n heads, fed the target's hidden states
(edgespec/drafting/feature.py; its trees: edgespec/trees/eagle_tree.py). The verify forward returns
the features the draft reads (the target's `feature_layers`); the prompt's prefill records them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from edgespec.cache import PREFILL_CHUNK, Forward, KVState, quantized
from edgespec.config import DRAFT_WINDOW, WHOLE_CONTEXT, SamplingConfig, SpecConfig
from edgespec.drafting.base import Drafter
from edgespec.drafting.feature import FeatureDrafter, FeatureState, prefill
from edgespec.errors import ConfigError
from edgespec.taps import target_features

if TYPE_CHECKING:
    from edgespec.drafting.token import DraftSteps
    from edgespec.trees.forward import Kernels
    from edgespec.trees.proposal import TreeDrafter


class FeatureFamily:
    """A FeatureState: the draft's own KV cache plus the target's features of the context. It
    keeps its own cache layout (full precision), bounded past a length like a token draft's
    (`prepare`); nothing drafted on guesses outlives a round, so it needs no rewind check.
    Answers edgespec.families.Family in full (that module picks this one, so this one does not
    import it)."""

    name = "feature"
    reads_features = True
    blocks = False
    reads_target_cache = False

    def __init__(self, own_head: bool = False):
        self.own_head = own_head

    @property
    def default_window(self) -> int:
        """The draft window when a request asks for none (SpecConfig.window): DRAFT_WINDOW for
        EAGLE and EAGLE-3 drafts (measured: at 8K tokens of context the window costs them no
        acceptance, docs/drafting.md, Long contexts); the whole context for the target's own MTP
        / next-n head, which could not be measured here, as vLLM's MTP drafts read it."""
        return WHOLE_CONTEXT if self.own_head else DRAFT_WINDOW

    def new_states(
        self,
        backend: Any,
        target: Any,
        draft: Any,
        kv_bits: int | None = None,
        run: Forward | None = None,
        kind: type[KVState] = KVState,
    ) -> tuple[KVState, FeatureState]:
        """The target's state of `kind` (its cache quantized with `kv_bits`, returning the
        features the draft reads) and the draft's state, on its own full-precision caches."""
        kv = (quantized(backend.new_cache, kv_bits), backend.softmax)
        verifier = kind(backend.model(target.model), f"target {target.name}", *kv, run)
        verifier.feature_layers = draft.model.feature_layers  # what the draft reads
        return verifier, self._draft_state(backend, draft, verifier)

    def _draft_state(self, backend: Any, draft: Any, verifier: KVState) -> FeatureState:
        """The draft's state on its own caches (`verifier`: the target's, for a draft that
        reads them)."""
        model = backend.model(draft.model)
        return FeatureState(model, f"draft {draft.name}", backend.new_cache, backend.softmax)

    def prepare(self, state: FeatureState, spec: SpecConfig) -> None:
        """Bound the draft's own attention to `spec`'s window as a token draft's (bound.Bound;
        off for trees, whose forward needs the full cache): past the bound's start its cache
        holds its sinks and last window, and it reads only those of a long prompt
        (FeatureState.first_input). Nothing to check: positions drafted on guesses are rolled
        back every round."""
        state.kv.bind(spec.window(self.window_of(state)))

    def window_of(self, state: FeatureState) -> int:
        """The draft window of this draft when a request asks for none: its family's."""
        return self.default_window

    def later(self, target: KVState, state: FeatureState, draft_too: bool) -> None:
        return None  # its prefill is the target's

    def prefill(
        self,
        target: KVState,
        state: FeatureState,
        prompt: list[int],
        cancel: threading.Event | None,
        on_chunk: Callable[[int, int], object] | None,
        draft_too: bool,
    ) -> int:
        """With `draft_too` the target's prefill records the prompt's features (the whole
        prompt but its last token, which the first verify reads)."""
        if draft_too:
            return prefill(target, state, prompt, PREFILL_CHUNK)
        return target.prefill(prompt, merge=True, cancel=cancel, on_chunk=on_chunk)

    def drafter(
        self, spec: SpecConfig, sampling: SamplingConfig, state: FeatureState, vocab: int,
        name: str, steps: DraftSteps | None = None,
    ) -> Drafter:  # fmt: skip
        return FeatureDrafter(state, sampling, vocab)

    def tree_drafter(
        self, spec: SpecConfig, sampling: SamplingConfig, state: FeatureState, vocab: int,
        name: str, kernels: Kernels, steps: DraftSteps | None = None,
    ) -> TreeDrafter:  # fmt: skip
        if spec.method in ("block", "block-tree"):
            raise ConfigError(f"--method {spec.method} needs a block draft (DFlash-style)")
        from edgespec.trees.eagle_tree import EagleTreeDrafter

        return EagleTreeDrafter(state, sampling, vocab, kernels)

    def cached_ids(self, state: FeatureState) -> list[int]:
        return list(state.kv.tokens)

    def first_logits(self, target: Any, draft: Any, prompt: list[int]) -> tuple[mx.array, mx.array]:
        """The draft reads the target's features of the prompt but its last token."""
        if len(prompt) < 2:
            raise ConfigError("a feature draft needs a prompt of at least two tokens")
        inputs = mx.array(prompt, dtype=mx.int32)
        feats, t_all = target_features(target, inputs, None, draft.feature_layers)
        t_logits = t_all[-1]
        guess = draft(draft.fuse(feats[None, :-1]), inputs[None, 1:])[0, -1]
        logits = draft.head_logits(guess).astype(t_logits.dtype)
        if draft.head_ids is None:  # the target's own head: the whole vocabulary
            return t_logits, logits
        head = mx.full(t_logits.shape, -mx.inf, dtype=t_logits.dtype)
        head[draft.head_ids] = logits
        return t_logits, head


FEATURE = FeatureFamily()
OWN_HEAD = FeatureFamily(own_head=True)  # the target's own MTP / next-n head
